"""Fixtures: the gateway served by a real uvicorn server on 127.0.0.1 (random port) in a background thread.

The server thread owns its event loop and the store lives in that loop, so tests reach the store through
`GatewayServer.call`, which runs a coroutine on the server's loop and waits for its result.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvicorn

from lightrail.gateway import ScriptedBackend, create_gateway_app
from lightrail.store import MemoryStore
from lightrail.types import Lease, RolloutSpec, Span, Task


class GatewayServer:
    """A uvicorn server running ``app`` in a thread; ``url`` is its root (``http://127.0.0.1:PORT``)."""

    def __init__(self, app: Any, store: Any, **uvicorn_config: Any) -> None:
        self.app = app
        self.store = store
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        options = {"log_level": "warning", "access_log": False, "lifespan": "on", **uvicorn_config}
        config = uvicorn.Config(app, **options)
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=[self._sock]))

    def start(self) -> GatewayServer:
        self._thread.start()
        for _ in range(1000):
            if self.server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("gateway server did not start")

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run ``coro`` on the server's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def lease(self) -> Lease:
        """Enqueue one rollout and lease it, as a runner would: a running attempt to route calls to."""

        async def go() -> Lease:
            await self.store.enqueue([RolloutSpec(task=Task(input="q"))])
            lease = await self.store.lease("worker-1")
            assert lease is not None
            return lease

        return self.call(go())

    def base_url(self, lease: Lease) -> str:
        """The attempt's OpenAI base URL on this gateway."""
        return f"{self.url}/rollouts/{lease.rollout.rollout_id}/attempts/{lease.attempt.attempt_id}/v1"

    def spans(self, lease: Lease) -> list[Span]:
        """The attempt's spans, after flushing the gateway's recorder."""

        async def go() -> list[Span]:
            await self.app.state.recorder.flush()
            return await self.store.query_spans(lease.rollout.rollout_id, lease.attempt.attempt_id)

        return self.call(go())

    def stop(self) -> None:
        """Stop the server and close its store (and the loop); a second call does nothing."""
        if self.loop.is_closed():
            return
        self.server.should_exit = True
        self._thread.join(30)
        self.loop.run_until_complete(self.store.close())
        self.loop.close()


@pytest.fixture
def make_gateway() -> Iterator[Callable[..., GatewayServer]]:
    """Factory: ``make_gateway(backend=ScriptedBackend(), store=None, uvicorn_config=None, **app_kwargs)`` starts
    a gateway server (over a fresh `MemoryStore` by default); all are stopped at teardown."""
    yield from _gateways()


@pytest.fixture(scope="module")
def make_module_gateway() -> Iterator[Callable[..., GatewayServer]]:
    """As `make_gateway`, for servers the tests of a module share (stopped after its last test)."""
    yield from _gateways()


def _gateways() -> Iterator[Callable[..., GatewayServer]]:
    servers: list[GatewayServer] = []

    def make(
        backend: Any = None, store: Any = None, uvicorn_config: dict | None = None, **kwargs: Any
    ) -> GatewayServer:
        backend = backend if backend is not None else ScriptedBackend()
        store = store if store is not None else MemoryStore()
        app = create_gateway_app(backend, store, **kwargs)
        server = GatewayServer(app, store, **(uvicorn_config or {})).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def serve_asgi() -> Iterator[Callable[[Any], GatewayServer]]:
    """Factory: serve any ASGI app (no lifespan) on loopback like the gateway; stopped at teardown."""
    servers: list[GatewayServer] = []

    def make(app: Any) -> GatewayServer:
        server = GatewayServer(app, MemoryStore(), lifespan="off").start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
