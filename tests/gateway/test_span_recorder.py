"""`SpanRecorder` against real stores: batching, flush/close, refused spans isolated, backpressure, and
retrying while the store is unreachable (the HTTP store client against a store server started late)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading

import pytest

from lightrail.gateway import SpanRecorder
from lightrail.store import MemoryStore
from lightrail.types import Attr, Lease, RolloutSpec, Span, Task


async def leased(store) -> Lease:
    await store.enqueue([RolloutSpec(task=Task(input="q"))])
    lease = await store.lease("w")
    assert lease is not None
    return lease


def span(lease: Lease, seq: int, attempt_id: str | None = None) -> Span:
    return Span(
        rollout_id=lease.rollout.rollout_id,
        attempt_id=attempt_id or lease.attempt.attempt_id,
        seq=seq,
        name=Attr.SPAN_LLM_CALL,
    )


class CountingStore(MemoryStore):
    """The real MemoryStore, counting `add_spans` calls to observe batching."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    async def add_spans(self, spans):
        self.batches.append(len(spans))
        return await super().add_spans(spans)


async def test_spans_are_batched_and_flushed():
    store = CountingStore()
    lease = await leased(store)
    recorder = SpanRecorder(store, max_batch=100, linger_s=0.01)
    for i in range(250):
        await recorder.record(span(lease, i))
    assert recorder.pending == 250  # nothing written on the caller's path
    await recorder.flush()
    assert recorder.pending == 0 and recorder.written == 250
    assert store.batches == [100, 100, 50]
    assert [s.seq for s in await store.query_spans(lease.rollout.rollout_id)] == list(range(250))
    await recorder.close()
    with pytest.raises(RuntimeError):
        await recorder.record(span(lease, 999))
    await store.close()


async def test_close_flushes():
    store = MemoryStore()
    lease = await leased(store)
    recorder = SpanRecorder(store, linger_s=0.05)
    for i in range(10):
        await recorder.record(span(lease, i))
    await recorder.close()
    assert len(await store.query_spans(lease.rollout.rollout_id)) == 10
    await store.close()


async def test_a_refused_span_does_not_block_the_batch():
    store = MemoryStore()
    lease = await leased(store)
    recorder = SpanRecorder(store)
    await recorder.record(span(lease, 1))
    await recorder.record(span(lease, 2, attempt_id="at-unknown"))  # the store refuses this one for good
    await recorder.record(span(lease, 3))
    await recorder.flush()
    assert [s.seq for s in await store.query_spans(lease.rollout.rollout_id)] == [1, 3]
    assert (recorder.written, recorder.rejected) == (2, 1)
    await recorder.close()
    await store.close()


async def test_backpressure_bounds_the_queue():
    store = MemoryStore()
    lease = await leased(store)
    recorder = SpanRecorder(store, max_batch=4, max_pending=8, linger_s=0.0)

    async def produce():
        for i in range(100):
            await recorder.record(span(lease, i))
            assert len(recorder._queue) <= 8

    await asyncio.wait_for(produce(), 10)
    await recorder.close()
    assert len(await store.query_spans(lease.rollout.rollout_id)) == 100
    await store.close()


HAVE_HTTP_STORE = all(importlib.util.find_spec(m) for m in ("lightrail.store.client", "lightrail.store.server"))


@pytest.mark.skipif(not HAVE_HTTP_STORE, reason="the HTTP store (lightrail.store.client/server) is not built yet")
async def test_retries_until_the_store_comes_up():
    import uvicorn

    from lightrail.store.client import StoreClient
    from lightrail.store.server import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backing = MemoryStore()  # lives in its own loop thread, where the store server will run later
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_store_loop(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop)

    lease = on_store_loop(leased(backing)).result(10)
    client = StoreClient(f"http://127.0.0.1:{port}", retries=0)
    recorder = SpanRecorder(client, retry_initial_s=0.02, retry_max_s=0.1)
    for i in range(5):
        await recorder.record(span(lease, i))
    await asyncio.sleep(0.3)
    assert recorder.failures >= 1 and recorder.pending == 5  # store down: nothing dropped, nothing lost

    server = uvicorn.Server(uvicorn.Config(create_app(backing), host="127.0.0.1", port=port, log_level="error"))
    serving = on_store_loop(server.serve())
    try:
        await asyncio.wait_for(recorder.flush(), 20)
        assert recorder.written == 5
        stored = on_store_loop(backing.query_spans(lease.rollout.rollout_id)).result(10)
        assert [s.seq for s in stored] == list(range(5))
    finally:
        await recorder.close()
        await client.close()
        server.should_exit = True
        serving.result(10)
        on_store_loop(backing.close()).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
