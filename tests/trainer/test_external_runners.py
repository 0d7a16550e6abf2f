"""Runners started by hand join a training run: the trainer has no runners of its own (``n_runners=0``), the
runners are separate ``lightrail runner`` processes with their own working directory and environment that know
only the store's URL and token, and they reach the model through the gateway URL the trainer advertises in the
rollouts' resources. One runner is killed mid-run and another joins late: the run completes, every rollout is
trained on once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from lightrail import Trainer
from lightrail.algorithms import GRPOConfig
from lightrail.algorithms.loop import GRPO
from lightrail.engine.models import build_tiny_model
from lightrail.gateway import GatewaySettings
from lightrail.store import StoreClient
from lightrail.trainer import StoreServerProcess
from lightrail.types import AttemptStatus, RetryPolicy, RolloutStatus

AGENTS = Path(__file__).resolve().parents[1] / "algorithms"  # loop_agents.parity_agent: one real LLM call
TOKEN = "external-runners-token"


def start_runner(url: str, name: str, workdir: Path) -> subprocess.Popen:
    """``lightrail runner`` as a user starts it on another host: its own directory and a bare environment holding
    only what it needs (the agent's import path and the store token), nothing inherited from the trainer."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONPATH": str(AGENTS), "LIGHTRAIL_TOKEN": TOKEN}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "LIGHTRAIL_TORCH"))})
    cmd = [sys.executable, "-m", "lightrail.cli", "runner", "--store", url, "--agent", "loop_agents:parity_agent"]
    cmd += ["-k", "4", "--worker-id", name, "--grace", "2"]
    log = (workdir / "runner.log").open("w")
    return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _stored(url: str) -> tuple[dict[str, tuple], list[str]]:
    """Every rollout with its attempts, and the LLM endpoint of every published resources version."""
    client = StoreClient(url, token=TOKEN)
    try:
        rollouts = await client.query_rollouts()
        attempts = {r.rollout_id: (r, await client.query_attempts(r.rollout_id)) for r in rollouts}
        latest = await client.get_resources()
        endpoints = [(await client.get_resources(v)).items["llm"].endpoint for v in range(1, latest.version + 1)]
        return attempts, endpoints
    finally:
        await client.close()


@pytest.mark.timeout(600)
def test_training_run_with_external_runners_only(tmp_path, monkeypatch):
    from examples.calculator.data import make_splits

    monkeypatch.syspath_prepend(str(AGENTS))  # the trainer checks the agent imports before it starts

    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = make_splits(8, 4, seed=1)
    server = StoreServerProcess(tmp_path / "store.db", token=TOKEN)
    port = free_port()
    advertised = f"http://localhost:{port}/v1"  # not the address the gateway binds: runners must use this one
    grpo = GRPO(
        model, steps=3, tasks_per_step=2, n_samples=4, config=GRPOConfig(lr=1e-3), val_every=0,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        out_dir=tmp_path / "run", checkpoint_every=0,
        gateway=GatewaySettings(host="127.0.0.1", port=port, advertise_url=advertised),
    )  # fmt: skip
    trainer = Trainer(
        n_runners=0, store=server.url, token=TOKEN, algorithm=grpo, retry=RetryPolicy(lease_s=2.0, max_attempts=5)
    )
    first = start_runner(server.url, "runner-a", tmp_path / "a")
    late: list[subprocess.Popen] = []

    def kill_first_then_join_late() -> None:
        """Once training rollouts are under way, SIGKILL runner A mid-rollout, then start runner B."""
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not metrics.exists() and time.monotonic() < deadline:  # the first validation is done
            time.sleep(0.05)
        time.sleep(0.3)  # step 1's rollouts are leased and running
        first.send_signal(signal.SIGKILL)
        time.sleep(0.5)
        late.append(start_runner(server.url, "runner-b", tmp_path / "b"))

    chaos = threading.Thread(target=kill_first_then_join_late, daemon=True)
    chaos.start()
    try:
        trainer.fit("loop_agents:parity_agent", train, val)
        chaos.join(10)
        rollouts, endpoints = asyncio.run(_stored(server.url))
    finally:
        for proc in [first, *late]:
            proc.kill()
            proc.wait(10)
        server.stop()

    assert grpo.report["steps"] == 3
    assert endpoints and set(endpoints) == {advertised}  # runners were given the advertised URL, and it worked
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m for m in steps if m["kind"] == "train"]
    assert [m["rollouts"] for m in train_steps] == [8, 8, 8]
    assert all(m["excluded"] == 0 for m in train_steps)  # the killed runner's attempts were retried, not lost
    assert first.returncode == -signal.SIGKILL and late, "runner A was killed and runner B started"

    statuses = Counter(a.status for _, attempts in rollouts.values() for a in attempts)
    assert statuses[AttemptStatus.LOST] >= 1  # A died holding leases
    for rollout, attempts in rollouts.values():
        assert rollout.status is RolloutStatus.SUCCEEDED
        assert [a.status for a in attempts].count(AttemptStatus.SUCCEEDED) == 1  # trained on exactly once
    workers = Counter(a.worker_id for _, attempts in rollouts.values() for a in attempts)
    assert set(workers) == {"runner-a", "runner-b"} and workers["runner-b"] > 0


def test_external_runners_need_the_store_token(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    monkeypatch.delenv("LIGHTRAIL_TOKEN", raising=False)
    trainer = Trainer(n_runners=0, store=tmp_path / "store.db", token=None, console=None)
    with pytest.raises(ValueError, match="need the store's token"):
        trainer.dev("loop_agents:parity_agent", [{"question": "1+1"}])
