"""What users rely on from `SQLiteStore` beyond the shared contract: it survives restarts and crashes, expires
the attempts of runners that vanished meanwhile, refuses files it does not understand, and lets other processes
read while it writes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sqlite3
import time

import pytest

from lightrail.store.base import ConflictError
from lightrail.store.sqlite import SCHEMA_VERSION, SchemaVersionError, SQLiteStore
from lightrail.types import (
    LLM,
    AttemptStatus,
    PromptTemplate,
    Resources,
    RetryPolicy,
    RolloutSpec,
    RolloutStatus,
    Span,
    Task,
    next_seq,
)

SPAWN = multiprocessing.get_context("spawn")  # no fork: the product must be spawn-safe, so are its tests


def specs(n: int, **kw) -> list[RolloutSpec]:
    return [RolloutSpec(task=Task(input={"q": i}), **kw) for i in range(n)]


def spans_for(rollout_id: str, attempt_id: str, n: int, size: int = 100, prefix: str = "s") -> list[Span]:
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            seq=next_seq(),
            name=f"{prefix}-{i}",
            attributes={"i": i, "text": "x" * size},
        )
        for i in range(n)
    ]


async def test_everything_survives_close_and_reopen(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    llm = LLM(endpoint="http://127.0.0.1:9/v1", model="tiny")
    v1 = await store.put_resources(Resources(items={"llm": llm}))
    finished, running, queued_a, queued_b = await store.enqueue(specs(4, policy=RetryPolicy(lease_s=60)))
    done = await store.lease("w")
    await store.add_spans(spans_for(finished.rollout_id, done.attempt.attempt_id, 3))
    await store.finish(done.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=0.5)
    live = await store.lease("w")
    live_spans = spans_for(running.rollout_id, live.attempt.attempt_id, 2)
    await store.add_spans(live_spans)
    await store.close()

    store = SQLiteStore(path)
    try:
        assert (await store.get_rollout(finished.rollout_id)).reward == 0.5
        assert [s.name for s in await store.query_spans(finished.rollout_id)] == ["s-0", "s-1", "s-2"]
        assert await store.query_spans(running.rollout_id) == live_spans
        counts = await store.counts()
        assert (counts[RolloutStatus.SUCCEEDED], counts[RolloutStatus.RUNNING], counts[RolloutStatus.QUEUED]) == (
            1,
            1,
            2,
        )
        # the running attempt is still leased to its runner, which can keep heartbeating and finish it
        beat = await store.heartbeat(live.attempt.attempt_id)
        assert beat.status is AttemptStatus.RUNNING and beat.lease_expires_at >= live.attempt.lease_expires_at
        # queued rollouts are leased in their original order
        assert (await store.lease("w")).rollout.rollout_id == queued_a.rollout_id
        assert (await store.lease("w")).rollout.rollout_id == queued_b.rollout_id
        await store.finish(live.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        # resources keep their versions and the next one continues the numbering
        assert (await store.get_resources(1)) == v1
        v2 = await store.put_resources(Resources(items={"p": PromptTemplate(template="{q}")}))
        assert v2.version == 2 and (await store.get_resources()).version == 2
        assert (await store.put_resources(v1)).version == 1  # idempotent across restarts too
    finally:
        await store.close()


async def test_a_retry_goes_to_the_front_of_the_queue_and_stays_there_across_restart(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    first, second, _ = await store.enqueue(specs(3, policy=RetryPolicy(max_attempts=2)))
    lease = await store.lease("w")
    await store.finish(lease.attempt.attempt_id, AttemptStatus.INFRA_ERROR)
    await store.close()
    store = SQLiteStore(path)
    try:
        retry = await store.lease("w")
        assert retry.rollout.rollout_id == first.rollout_id and retry.attempt.index == 2
        assert (await store.lease("w")).rollout.rollout_id == second.rollout_id
    finally:
        await store.close()


async def test_attempt_of_a_runner_that_vanished_during_restart_is_lost_and_retried(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    (rollout,) = await store.enqueue(specs(1, policy=RetryPolicy(lease_s=0.3, max_attempts=2)))
    first = await store.lease("runner-that-dies")
    await store.close()
    await asyncio.sleep(0.4)  # the lease runs out while no store is open

    store = SQLiteStore(path)
    try:
        second = await store.lease("w2", wait_s=5)
        assert second is not None and second.rollout.rollout_id == rollout.rollout_id and second.attempt.index == 2
        attempts = await store.query_attempts(rollout.rollout_id)
        assert [a.status for a in attempts] == [AttemptStatus.LOST, AttemptStatus.RUNNING]
        assert (await store.heartbeat(first.attempt.attempt_id)).status is AttemptStatus.LOST
    finally:
        await store.close()


async def test_reaper_runs_after_reopen_without_a_lease_call(tmp_path):
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    (rollout,) = await store.enqueue(specs(1, policy=RetryPolicy(lease_s=0.2, max_attempts=1)))
    await store.lease("runner-that-dies")
    await store.close()

    store = SQLiteStore(path)
    try:  # a trainer that only waits for its batch still sees the dead runner's rollout end
        (done,) = await store.wait([rollout.rollout_id], timeout_s=5)
        assert done.status is RolloutStatus.INFRA_ERROR and done.reward is None
    finally:
        await store.close()


def test_file_from_a_newer_schema_is_refused_clearly(tmp_path):
    path = tmp_path / "store.db"
    asyncio.run(SQLiteStore(path).close())
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaVersionError, match="newer.*upgrade lightrail"):
        SQLiteStore(path)


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    with pytest.raises(SchemaVersionError, match="not a lightrail store"):
        SQLiteStore(path)


async def test_settings_wal_foreign_keys_and_synchronous(tmp_path):
    store = SQLiteStore(tmp_path / "a.db")
    full = SQLiteStore(tmp_path / "b.db", synchronous="full")
    try:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert full._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        await store.close()
        await full.close()
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(tmp_path / "c.db", synchronous="OFF")


async def test_span_batch_for_another_rollouts_attempt_stores_nothing(tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        a, b = await store.enqueue(specs(2))
        lease_a, lease_b = await store.lease("w"), await store.lease("w")
        good = spans_for(a.rollout_id, lease_a.attempt.attempt_id, 2)
        wrong = spans_for(a.rollout_id, lease_b.attempt.attempt_id, 1)  # b's attempt claimed for a
        with pytest.raises(ConflictError):
            await store.add_spans(good + wrong)
        assert await store.query_spans(a.rollout_id) == [] and await store.query_spans(b.rollout_id) == []
        # a batch spanning several attempts is fine and counts only new spans
        both = good + spans_for(b.rollout_id, lease_b.attempt.attempt_id, 3)
        assert await store.add_spans(both) == 5
        assert await store.add_spans(both) == 0
    finally:
        await store.close()


async def test_bulk_insert_of_20_spans_of_2kb_takes_about_a_millisecond(tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    try:
        await store.enqueue(specs(50))
        times = []
        for _ in range(50):
            lease = await store.lease("w")
            batch = spans_for(lease.rollout.rollout_id, lease.attempt.attempt_id, 20, size=2000)
            t0 = time.perf_counter()
            assert await store.add_spans(batch) == 20
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        assert median < 0.005, f"median add_spans of 20 x 2 KB took {median * 1e3:.2f} ms"  # ~0.3 ms measured
    finally:
        await store.close()


# -- crash safety and other processes -------------------------------------------------------------------------


def _writer(path: str, conn) -> None:
    """Child process: add span batches forever, reporting each batch once `add_spans` has returned."""

    async def run() -> None:
        store = SQLiteStore(path)
        await store.enqueue(specs(1, policy=RetryPolicy(lease_s=600)))
        lease = await store.lease("writer")
        conn.send(("lease", lease.rollout.rollout_id))
        batch = 0
        while True:
            spans = spans_for(lease.rollout.rollout_id, lease.attempt.attempt_id, 20, size=2000, prefix=f"b{batch}")
            await store.add_spans(spans)
            conn.send(("acked", [s.span_id for s in spans]))
            batch += 1

    asyncio.run(run())


async def test_writer_killed_with_sigkill_loses_nothing_it_acknowledged(tmp_path):
    path = str(tmp_path / "store.db")
    parent_end, child_end = SPAWN.Pipe(duplex=False)
    child = SPAWN.Process(target=_writer, args=(path, child_end), daemon=True)
    child.start()
    child_end.close()  # so that recv() ends with EOFError once the child is gone
    acked: list[str] = []
    rollout_id = None
    deadline = time.monotonic() + 60
    while len(acked) < 40 * 20 and time.monotonic() < deadline:  # kill it mid-stream, ~40 batches in
        if parent_end.poll(0.05):
            kind, payload = parent_end.recv()
            if kind == "lease":
                rollout_id = payload
            else:
                acked.extend(payload)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL
    while True:  # batches acknowledged between the last read and the kill
        try:
            acked.extend(parent_end.recv()[1])
        except EOFError:
            break
    assert rollout_id is not None and len(acked) >= 40 * 20

    store = SQLiteStore(path)
    try:
        stored = {s.span_id for s in await store.query_spans(rollout_id)}
        assert not set(acked) - stored
        assert (await store.get_rollout(rollout_id)).status is RolloutStatus.RUNNING
    finally:
        await store.close()


def _reader(path: str, rollout_id: str, conn) -> None:
    """Child process: read the rollout's spans repeatedly while the parent writes, reporting what it saw."""

    async def run() -> None:
        store = SQLiteStore(path)
        conn.send("ready")
        seen = []
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end:
            seen.append(len(await store.query_spans(rollout_id)))
            if seen[-1] >= 200:
                break
            await asyncio.sleep(0.005)
        await store.close()
        conn.send(seen)

    asyncio.run(run())


async def test_another_process_reads_while_this_one_writes(tmp_path):
    path = str(tmp_path / "store.db")
    store = SQLiteStore(path)
    try:
        (rollout,) = await store.enqueue(specs(1))
        lease = await store.lease("w")
        await store.add_spans(spans_for(rollout.rollout_id, lease.attempt.attempt_id, 10, prefix="first"))
        parent_end, child_end = SPAWN.Pipe(duplex=False)
        child = SPAWN.Process(target=_reader, args=(path, rollout.rollout_id, child_end), daemon=True)
        child.start()
        child_end.close()
        while not parent_end.poll(0):  # writes start once the reader is up (spawning takes a while)
            await asyncio.sleep(0.02)
        assert parent_end.recv() == "ready"
        for batch in range(19):
            await asyncio.sleep(0.05)
            await store.add_spans(spans_for(rollout.rollout_id, lease.attempt.attempt_id, 10, prefix=f"b{batch}"))
        while not parent_end.poll(0):  # keep this loop free while the reader finishes
            await asyncio.sleep(0.02)
        seen = parent_end.recv()
        child.join(10)
        assert child.exitcode == 0
        assert seen == sorted(seen) and seen[-1] == 200  # never a partial batch, ending with all of them
        assert all(n % 10 == 0 for n in seen)
        assert len(set(seen)) > 2  # it read during the writes, not just before or after
    finally:
        await store.close()
