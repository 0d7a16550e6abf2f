"""Several real ``lightrail store serve`` processes on one PostgreSQL database serve one run.

What a scaled-out deployment relies on: leases stay exclusive across servers, a long poll on one server wakes on
a write through another, any surviving server expires a dead runner's lease, a killed server loses nothing it
acknowledged, and bad URLs fail in one line. (The whole `Store` contract runs on PostgreSQL in
``test_contract.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from lightrail.store import PostgresStore, SchemaVersionError, StoreClient, open_store
from lightrail.types import AttemptStatus, RetryPolicy, RolloutSpec, RolloutStatus, Span, Task, next_seq

TOKEN = "pg-token"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StoreServer:
    """``python -m lightrail.cli store serve --db URL`` (the shipped entry point), ready when /health answers."""

    def __init__(self, db: str, port: int | None = None):
        self.db, self.port = db, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, LIGHTRAIL_TOKEN=TOKEN, PYTHONPATH=str(REPO))
        cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", db, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"store server did not start (exit code {self.proc.poll()})")
            time.sleep(0.01)

    def client(self, **kw) -> StoreClient:
        return StoreClient(self.url, token=TOKEN, **kw)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def two_servers(postgres_url):
    servers = [StoreServer(postgres_url), StoreServer(postgres_url)]
    yield servers
    for server in servers:
        server.kill()


def specs(n: int, **kw) -> list[RolloutSpec]:
    return [RolloutSpec(task=Task(input={"q": i}), **kw) for i in range(n)]


async def test_leases_stay_exclusive_across_two_servers(two_servers):
    """8 lessees (4 per server) race for the same queue, round after round: no rollout is handed out twice."""
    clients = [two_servers[i % 2].client() for i in range(8)]
    leased: list[tuple[int, str]] = []  # (lessee, rollout id)
    enqueued: list[str] = []
    try:
        for _ in range(4):
            enqueued += [r.rollout_id for r in await clients[0].enqueue(specs(50))]
            start = asyncio.Event()

            async def lessee(i: int, start: asyncio.Event) -> list[str]:
                await start.wait()
                got = []
                while (lease := await clients[i].lease(f"w{i}")) is not None:
                    got.append(lease.attempt.attempt_id)
                    leased.append((i, lease.rollout.rollout_id))
                return got

            tasks = [asyncio.create_task(lessee(i, start)) for i in range(8)]
            await asyncio.sleep(0.05)
            start.set()
            attempt_ids = [a for got in await asyncio.gather(*tasks) for a in got]
            # finish through the other server than the one that leased: both see every attempt
            await asyncio.gather(
                *(clients[k % 2].finish(a, AttemptStatus.SUCCEEDED, reward=1.0) for k, a in enumerate(attempt_ids))
            )
        times_leased = Counter(rollout_id for _, rollout_id in leased)
        duplicates = {r: n for r, n in times_leased.items() if n > 1}
        assert duplicates == {}
        assert sorted(times_leased) == sorted(enqueued)  # every rollout leased, exactly once
        assert {i % 2 for i, _ in leased} == {0, 1}  # both servers handed out leases
        counts = await clients[1].counts()
        assert counts[RolloutStatus.SUCCEEDED] == 200 and sum(counts.values()) == 200
    finally:
        for client in clients:
            await client.close()


async def test_long_poll_on_b_is_woken_by_an_enqueue_through_a(two_servers):
    a, b = (server.client() for server in two_servers)
    try:
        await b.counts()  # connections open before timing
        latencies = []
        for _ in range(5):
            waiter = asyncio.create_task(b.lease("runner", wait_s=30))
            await asyncio.sleep(0.1)  # parked in B's long poll
            assert not waiter.done()
            t0 = time.perf_counter()
            (rollout,) = await a.enqueue(specs(1))
            lease = await asyncio.wait_for(waiter, 10)
            latencies.append(time.perf_counter() - t0)
            assert lease is not None and lease.rollout.rollout_id == rollout.rollout_id
        # Woken by the notification, not by the 30 s timeout or a poll: tens of milliseconds at most.
        assert max(latencies) < 1.0, latencies
    finally:
        await a.close()
        await b.close()


async def test_lease_taken_through_a_expires_when_only_b_runs(two_servers):
    """The runner leased through A and died; A died too. B's reaper learned the deadline from A's notification
    and requeues the rollout at that deadline, waking a long poll on B."""
    server_a, server_b = two_servers
    a, b = server_a.client(retries=0), server_b.client()
    try:
        await b.counts()
        (rollout,) = await a.enqueue(specs(1, policy=RetryPolicy(lease_s=0.5, max_attempts=2)))
        first = await a.lease("dead-runner")
        server_a.kill()
        second = await b.lease("w2", wait_s=10)
        assert second is not None and second.rollout.rollout_id == rollout.rollout_id
        assert second.attempt.index == 2
        attempts = await b.query_attempts(rollout.rollout_id)
        assert [x.status for x in attempts] == [AttemptStatus.LOST, AttemptStatus.RUNNING]
        assert attempts[0].attempt_id == first.attempt.attempt_id
        assert attempts[0].ended_at >= first.attempt.lease_expires_at  # expired at its deadline, not before
    finally:
        await a.close()
        await b.close()


async def test_killed_server_restarted_loses_nothing_acknowledged(two_servers):
    """kill -9 server A while 4 workers write through it; restart it; everything A acknowledged is there, seen
    through the restarted A and through B."""
    server_a, server_b = two_servers
    client = server_a.client(retries=0)  # fail at once when the server dies
    acked_rollouts: set[str] = set()
    acked_spans: dict[str, set[str]] = {}
    acked_finished: set[str] = set()
    stop = asyncio.Event()

    async def worker(w: int) -> None:
        while not stop.is_set():
            for r in await client.enqueue(specs(2)):
                acked_rollouts.add(r.rollout_id)
            lease = await client.lease(f"w{w}")
            if lease is None:
                continue
            rid, aid = lease.rollout.rollout_id, lease.attempt.attempt_id
            spans = [
                Span(rollout_id=rid, attempt_id=aid, seq=next_seq(), name="llm.call", attributes={"x": "y" * 500})
                for _ in range(5)
            ]
            await client.add_spans(spans)
            acked_spans[rid] = {s.span_id for s in spans}
            await client.finish(aid, AttemptStatus.SUCCEEDED, reward=1.0)
            acked_finished.add(rid)

    async def killer() -> None:
        while len(acked_finished) < 40:
            await asyncio.sleep(0.005)
        server_a.kill()
        stop.set()

    results = await asyncio.gather(*(worker(w) for w in range(4)), killer(), return_exceptions=True)
    await client.close()
    assert any(isinstance(r, Exception) for r in results[:4])  # the kill landed mid-workload
    restarted = StoreServer(server_a.db, port=server_a.port)
    try:
        for check in (restarted.client(), server_b.client()):
            try:
                present = {r.rollout_id: r for r in await check.query_rollouts()}
                assert acked_rollouts <= present.keys()
                for rid, span_ids in acked_spans.items():
                    assert span_ids <= {s.span_id for s in await check.query_spans(rid)}
                assert all(present[rid].status is RolloutStatus.SUCCEEDED for rid in acked_finished)
            finally:
                await check.close()
    finally:
        restarted.kill()
    assert len(acked_finished) >= 40 and len(acked_spans) >= 40


async def test_two_stores_opening_a_new_database_at_once_create_the_schema_once(postgres_url):
    stores = [PostgresStore(postgres_url) for _ in range(3)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        (rollout,) = await stores[0].enqueue(specs(1))
        assert (await stores[2].get_rollout(rollout.rollout_id)).status is RolloutStatus.QUEUED
    finally:
        for s in stores:
            await s.close()


async def test_a_newer_schema_is_refused(postgres_url, postgres_server):
    store = PostgresStore(postgres_url)
    await store.open()
    await store.close()
    postgres_server.psql("UPDATE lightrail.meta SET value = 99", database=postgres_url.rsplit("/", 1)[1])
    newer = PostgresStore(postgres_url)
    with pytest.raises(SchemaVersionError, match="version 99"):
        await newer.open()
    await newer.close()


async def test_a_version_1_database_gains_the_tokens_table(postgres_url, postgres_server):
    """A store created before scoped tokens (schema 1) migrates to the current schema on open, data kept."""
    from lightrail.store.tokens import mint

    store = PostgresStore(postgres_url)
    (rollout,) = await store.enqueue(specs(1))
    await store.close()
    database = postgres_url.rsplit("/", 1)[1]
    postgres_server.psql("DROP TABLE lightrail.tokens; UPDATE lightrail.meta SET value = 1", database=database)
    upgraded = PostgresStore(postgres_url)
    try:
        assert (await upgraded.get_rollout(rollout.rollout_id)).status is RolloutStatus.QUEUED
        _, record = mint("read")
        await upgraded.put_token(record)
        assert await upgraded.get_token(record.token_id) == record
    finally:
        await upgraded.close()


def test_bad_store_urls_fail_in_one_line(postgres_server):
    with pytest.raises(ValueError, match=r"unsupported store URL scheme 'mysql://'; use memory:.*postgresql://") as e:
        open_store("mysql://root:hunter2@db/runs")
    assert "hunter2" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="bad port"):
        open_store("postgresql://u:hunter2@db:notaport/runs")

    def serve(db: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", db, "--port", "0"]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)

    bad_scheme = serve("mysql://root:hunter2@db/runs")
    assert bad_scheme.returncode == 2
    assert bad_scheme.stderr.count("\n") == 1 and "Traceback" not in bad_scheme.stderr
    assert "unsupported store URL scheme" in bad_scheme.stderr and "hunter2" not in bad_scheme.stderr
    # A well-formed URL nobody answers at: also one line (exit 1: the URL is fine, the database is not there).
    unreachable = serve(f"postgresql://postgres@127.0.0.1:{free_port()}/runs")
    assert unreachable.returncode == 1
    assert unreachable.stderr.count("\n") == 1 and "cannot connect to PostgreSQL" in unreachable.stderr
    missing_db = serve(postgres_server.url("no_such_database"))
    assert missing_db.returncode == 1
    assert missing_db.stderr.count("\n") == 1 and "no_such_database" in missing_db.stderr


def test_the_driver_loads_only_when_a_postgres_store_opens():
    probe = (
        "import sys; from lightrail.store import open_store; s = open_store('postgresql://u@127.0.0.1:9/x'); "
        "print(type(s).__name__, 'asyncpg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["PostgresStore", "False"]
