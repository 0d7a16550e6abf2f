"""Nothing acknowledged is lost when the store server process is killed (SIGKILL, no shutdown code runs).

A real ``lightrail store serve`` process on SQLite takes a concurrent HTTP workload; it is killed mid-way and
restarted on the same file; every rollout, span and finish the client saw acknowledged must be there.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from lightrail.store import StoreClient
from lightrail.types import AttemptStatus, RolloutSpec, RolloutStatus, Span, Task, next_seq

TOKEN = "durability-token"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(db: Path, port: int) -> subprocess.Popen:
    """``python -m lightrail.cli store serve`` (the shipped entry point), ready when /health answers."""
    env = dict(os.environ, LIGHTRAIL_TOKEN=TOKEN, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", str(db), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"store server did not start (exit code {proc.poll()})")
        time.sleep(0.01)


async def test_kill_9_mid_workload_loses_nothing_acknowledged(tmp_path):
    db, port = tmp_path / "store.db", free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(db, port)
    acked_rollouts: set[str] = set()
    acked_spans: dict[str, set[str]] = {}
    acked_finished: set[str] = set()
    client = StoreClient(url, token=TOKEN, retries=0)  # fail at once when the server dies

    async def worker(w: int) -> None:
        while True:
            (rollout,) = await client.enqueue([RolloutSpec(task=Task(input={"w": w}))])
            acked_rollouts.add(rollout.rollout_id)
            lease = await client.lease(f"w{w}")
            if lease is None:  # another worker took ours; it will be finished by them
                continue
            rid, aid = lease.rollout.rollout_id, lease.attempt.attempt_id
            spans = [
                Span(rollout_id=rid, attempt_id=aid, seq=next_seq(), name="llm", attributes={"text": "x" * 500})
                for _ in range(10)
            ]
            await client.add_spans(spans)
            acked_spans[rid] = {s.span_id for s in spans}
            await client.finish(aid, AttemptStatus.SUCCEEDED, reward=1.0)
            acked_finished.add(rid)

    async def kill_when_busy() -> None:
        while sum(map(len, acked_spans.values())) < 1500:
            await asyncio.sleep(0.001)
        server.kill()  # SIGKILL, while the other workers have requests in flight

    workers = [asyncio.create_task(worker(w)) for w in range(8)]
    await asyncio.wait_for(kill_when_busy(), 60)
    results = await asyncio.gather(*workers, return_exceptions=True)
    await client.close()
    server.wait()
    assert all(isinstance(r, Exception) for r in results)  # every worker was stopped by the crash

    restarted = start_server(db, port)
    check = StoreClient(url, token=TOKEN)
    try:
        stored = {r.rollout_id: r for r in await check.query_rollouts()}
        assert acked_rollouts <= stored.keys()
        for rid, span_ids in acked_spans.items():
            assert span_ids <= {s.span_id for s in await check.query_spans(rid)}, rid
        assert all(stored[rid].status is RolloutStatus.SUCCEEDED for rid in acked_finished)
        assert len(acked_finished) >= 100 and sum(map(len, acked_spans.values())) >= 1500
        # the restarted store is fully usable: unfinished work is still queued or running, new work goes in
        (fresh,) = await check.enqueue([RolloutSpec(task=Task(input="after restart"))])
        assert (await check.get_rollout(fresh.rollout_id)).status is RolloutStatus.QUEUED
    finally:
        await check.close()
        restarted.terminate()
        restarted.wait(10)
