"""`SpanBatcher` against a real `MemoryStore`: batching, flush, retries, refusals, threads, backpressure."""

from __future__ import annotations

import asyncio
import time

from lightrail.store import MemoryStore
from lightrail.tracing import SpanBatcher, attempt_context, emit_event
from lightrail.types import RolloutSpec, Span, Task, next_seq


class CountingStore(MemoryStore):
    """A MemoryStore that counts `add_spans` calls and can fail or stall them on demand (the real store
    underneath; only the failure is injected)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.fail_next = 0
        self.gate: asyncio.Event | None = None

    async def add_spans(self, spans):
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionResetError("store restarting")
        return await super().add_spans(spans)


async def leases(store, n):
    await store.enqueue([RolloutSpec(task=Task(input=i)) for i in range(n)])
    return [await store.lease("w") for _ in range(n)]


async def test_spans_of_concurrent_attempts_share_batches_and_flush_completes():
    store = CountingStore()
    batcher = SpanBatcher(store, max_batch=100)
    batcher.start()
    got = await leases(store, 4)

    async def emit(lease):
        with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
            for i in range(50):
                emit_event("e", i=i)
                if i % 10 == 0:
                    await asyncio.sleep(0)

    await asyncio.gather(*(emit(lease) for lease in got))
    await batcher.flush()
    for lease in got:
        assert len(await store.query_spans(lease.rollout.rollout_id)) == 50
    assert store.calls <= 4  # 200 spans, batches of up to 100 across attempts (not one call per span)
    assert batcher.written == 200 and batcher.pending == 0
    await batcher.close()
    await store.close()


async def test_transient_failures_are_retried_without_dropping():
    store = CountingStore()
    batcher = SpanBatcher(store, retry_initial_s=0.01)
    batcher.start()
    (lease,) = await leases(store, 1)
    store.fail_next = 3
    with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
        for i in range(10):
            emit_event("e", i=i)
    await batcher.flush()
    assert len(await store.query_spans(lease.rollout.rollout_id)) == 10
    assert batcher.failures == 3 and batcher.rejected == 0
    await batcher.close()
    await store.close()


async def test_abandon_releases_a_flush_waiting_on_a_store_that_is_gone():
    """A store that stays down: a flush waits (the write is retried), until `abandon` (a run being stopped) gives
    the spans up; the flush then says they may not be stored, and later spans are counted, not queued."""
    store = CountingStore()
    batcher = SpanBatcher(store, retry_initial_s=0.01, retry_max_s=0.02)
    batcher.start()
    (lease,) = await leases(store, 1)
    store.fail_next = 10**9  # the store's server was killed
    with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
        for i in range(3):
            emit_event("e", i=i)
    flush = asyncio.ensure_future(batcher.flush())
    await asyncio.sleep(0.2)
    assert not flush.done() and batcher.failures >= 3
    assert batcher.abandon() == 3
    assert await asyncio.wait_for(flush, 1.0) is False
    with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
        emit_event("late")
    assert batcher.abandoned == 4 and batcher.pending == 0 and batcher.written == 0
    assert await batcher.flush() is False
    await asyncio.wait_for(batcher.close(), 1.0)
    await store.close()


async def test_a_flush_answered_before_abandon_stays_true_and_abandon_before_start_is_harmless():
    store = CountingStore()
    batcher = SpanBatcher(store)
    assert batcher.abandon() == 0  # (never started: nothing to give up)
    batcher = SpanBatcher(store)
    batcher.start()
    (lease,) = await leases(store, 1)
    with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
        emit_event("stored")
    flush = asyncio.ensure_future(batcher.flush())
    await asyncio.sleep(0.1)  # written by now
    assert batcher.written == 1 and batcher.abandon() == 0
    assert await flush is True  # its span is stored: the call it answers for may say so
    await batcher.close()
    await store.close()


async def test_a_refused_span_does_not_take_its_batch_down():
    store = CountingStore()
    batcher = SpanBatcher(store)
    batcher.start()
    (lease,) = await leases(store, 1)
    good = [Span(rollout_id=lease.rollout.rollout_id, attempt_id=lease.attempt.attempt_id, seq=next_seq(), name="ok")]
    bad = Span(rollout_id="ro-unknown", attempt_id="at-unknown", seq=next_seq(), name="bad")
    for span in [good[0], bad]:
        batcher.submit(span)
    await batcher.flush()
    assert [s.name for s in await store.query_spans(lease.rollout.rollout_id)] == ["ok"]
    assert batcher.rejected == 1
    await batcher.close()
    await store.close()


async def test_threads_submit_through_the_loop():
    store = CountingStore()
    batcher = SpanBatcher(store)
    batcher.start()
    got = await leases(store, 4)

    def work(lease):
        with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
            for i in range(100):
                emit_event("t", i=i)

    await asyncio.gather(*(asyncio.to_thread(work, lease) for lease in got))
    await batcher.flush()
    for lease in got:
        spans = await store.query_spans(lease.rollout.rollout_id)
        assert sorted(s.attributes["i"] for s in spans) == list(range(100))
    await batcher.close()
    await store.close()


async def test_backpressure_blocks_threads_and_the_runner_until_the_store_catches_up():
    store = CountingStore()
    store.gate = asyncio.Event()  # the store is stuck
    batcher = SpanBatcher(store, max_batch=10, max_pending=20, linger_s=0)
    batcher.start()
    (lease,) = await leases(store, 1)
    emitted = 0

    def work():
        nonlocal emitted
        with attempt_context(lease.rollout.rollout_id, lease.attempt.attempt_id, batcher):
            for i in range(100):
                emit_event("t", i=i)
                emitted += 1

    thread = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        deadline = time.monotonic() + 30  # a loaded machine may run the thread late: wait for the full queue
        while batcher.pending < batcher.max_pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # unblocked, the thread would emit the rest in well under a millisecond
        # it waits for room instead of queueing without bound, and the batch the stuck store holds counts: a thread
        # that counted only the queue would have emitted 20 plus that batch
        assert emitted == batcher.max_pending
        capacity = asyncio.ensure_future(batcher.wait_capacity())
        await asyncio.sleep(0.01)
        assert not capacity.done()  # the runner would not lease new work now
    finally:  # a failed check must not leave the thread blocked: the test's loop could never close
        store.gate.set()
        await thread
    await capacity
    await batcher.flush()
    assert len(await store.query_spans(lease.rollout.rollout_id)) == 100
    assert batcher.dropped == 0
    await batcher.close()
    await store.close()
