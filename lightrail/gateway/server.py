"""`GatewayServer`: the gateway app served by uvicorn inside the running event loop, on a loopback port.

For processes that host a gateway next to other work (the `GRPO` loop serves its engine this way; tests serve a
`ScriptedBackend`). ``lightrail gateway serve`` is the standalone command. SIGINT/SIGTERM stay with the host
process: uvicorn would otherwise take them for itself on the main thread, and Ctrl-C would first wait for the
gateway's in-flight generations while the host's work went on.

Example::

    async with GatewayServer(engine, store, token="s3cret") as gateway:
        llm = LLM(endpoint=gateway.url, model="policy", api_key=gateway.token)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from typing import Any

__all__ = ["GatewayServer"]


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: where it resolves is not known here, so it counts as exposed
        return host == "localhost"


class GatewayServer:
    """Serve `create_gateway_app(backend, store, token=token, **app_options)` on ``host:port`` (0: any free one);
    ``url`` is the OpenAI base URL (``http://host:port/v1``) once started."""

    def __init__(
        self,
        backend: Any,
        store: Any,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        **app_options: Any,
    ) -> None:
        if token is None and not _is_loopback(host):
            raise ValueError(f"refusing to serve the gateway on {host} without a token (anyone could use the model)")
        self.token = token
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.bind((host, port))
        bound_host, bound_port = self._sock.getsockname()[:2]
        netloc = f"[{bound_host}]:{bound_port}" if ":" in bound_host else f"{bound_host}:{bound_port}"
        self.url = f"http://{netloc}/v1"
        self._app_args = (backend, store, token, app_options)
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> GatewayServer:
        """Serve until `stop`; returns once the server accepts connections (raises its startup error)."""
        import uvicorn

        from lightrail.gateway.app import create_gateway_app

        backend, store, token, options = self._app_args
        app = create_gateway_app(backend, store, token=token, **options)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # the host's signals
        self._server = server

        async def serve() -> None:
            try:
                await server.serve(sockets=[self._sock])
            except SystemExit as exc:  # uvicorn exits the process when the app's startup fails: not ours to end
                raise RuntimeError(f"the gateway failed to start (uvicorn exit {exc.code}); see the log") from None

        self._task = asyncio.get_running_loop().create_task(serve())
        try:
            while not server.started:
                if self._task.done():
                    self._task.result()  # raises the startup error
                    raise RuntimeError("the gateway stopped during startup")
                await asyncio.sleep(0.01)
        except BaseException:
            self._sock.close()
            self._server = self._task = None
            raise
        return self

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish, flush the span recorder (the app's shutdown)."""
        try:
            if self._server is not None and self._task is not None:
                self._server.should_exit = True
                await self._task
        finally:
            self._server = self._task = None
            self._sock.close()

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
