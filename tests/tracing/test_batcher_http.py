"""`SpanBatcher` over the real HTTP store client while the store server is down, then comes up: every span
submitted meanwhile is stored once, none dropped (the gateway and the runners both write spans this way)."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn

from lightrail.store import MemoryStore, StoreClient
from lightrail.store.server import create_app
from lightrail.tracing import SpanBatcher
from lightrail.types import Attr, RolloutSpec, Span, Task


async def test_spans_wait_for_a_store_server_that_comes_up_late():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backing = MemoryStore()  # lives in its own loop thread, where the store server will run later
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_store_loop(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def leased():
        await backing.enqueue([RolloutSpec(task=Task(input="q"))])
        return await backing.lease("w")

    lease = on_store_loop(leased()).result(10)
    client = StoreClient(f"http://127.0.0.1:{port}", retries=0)
    batcher = SpanBatcher(client, retry_initial_s=0.02, retry_max_s=0.1)
    batcher.start()
    for i in range(5):
        span = Span(
            rollout_id=lease.rollout.rollout_id, attempt_id=lease.attempt.attempt_id, seq=i, name=Attr.SPAN_LLM_CALL
        )
        batcher.submit(span)
    await asyncio.sleep(0.3)
    assert batcher.failures >= 1 and batcher.pending == 5  # store down: nothing dropped, nothing lost

    server = uvicorn.Server(uvicorn.Config(create_app(backing), host="127.0.0.1", port=port, log_level="error"))
    serving = on_store_loop(server.serve())
    try:
        await asyncio.wait_for(batcher.flush(), 20)
        assert batcher.written == 5
        stored = on_store_loop(backing.query_spans(lease.rollout.rollout_id)).result(10)
        assert [s.seq for s in stored] == list(range(5))
    finally:
        await batcher.close()
        await client.close()
        server.should_exit = True
        serving.result(10)
        on_store_loop(backing.close()).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
