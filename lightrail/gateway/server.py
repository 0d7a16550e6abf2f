"""`GatewayServer`: the gateway app served by uvicorn inside the running event loop (loopback by default).

For processes that host a gateway next to other work (the `GRPO` loop serves its engine this way; tests serve a
`ScriptedBackend`). ``lightrail gateway serve`` is the standalone command. SIGINT/SIGTERM stay with the host
process: uvicorn would otherwise take them for itself on the main thread, and Ctrl-C would first wait for the
gateway's in-flight generations while the host's work went on.

Runners on other machines reach the gateway through the URL the trainer publishes in the rollout's resources:
bind a reachable address (``host="0.0.0.0"``, which needs a token) and give the URL they should use
(``advertise_url="http://trainer-host:8900/v1"``). `GatewaySettings` is that choice as configuration.

Example::

    async with GatewayServer(engine, store, token="s3cret") as gateway:
        llm = LLM(endpoint=gateway.url, model="policy", api_key=gateway.token)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

import msgspec

from lightrail._net import is_loopback_host

__all__ = ["GatewaySettings", "GatewayServer", "is_loopback_url"]


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` points at this machine only (127.0.0.0/8, ::1, localhost): unreachable from another host."""
    return is_loopback_host(urlsplit(url).hostname or "")


def _wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _advertised(url: str) -> str:
    """An advertised URL checked and normalized to the OpenAI base form (``http://host:port/v1``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"advertise_url must be an http(s) URL like http://trainer-host:8900/v1, not {url!r}")
    if _wildcard(parts.hostname):
        raise ValueError(f"advertise_url {url!r} names a wildcard address; give the host name runners can reach")
    root = url.rstrip("/")
    return root if root.endswith("/v1") else root + "/v1"


class GatewaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where a training gateway listens and the URL it publishes to runners (``gateway:`` in a train config).

    The defaults serve this machine only (127.0.0.1, a free port). For runners on other hosts, bind a reachable
    address and advertise the URL they can use::

        gateway: {host: 0.0.0.0, port: 8900, advertise_url: http://trainer-host:8900/v1}
    """

    host: str = "127.0.0.1"
    """Address to bind; anything but loopback requires the gateway's token (training gateways always have one)."""
    port: int = 0
    """Port to bind; 0 picks a free one."""
    advertise_url: str | None = None
    """The base URL runners are given (published in the rollouts' resources). Default: the bound address, or
    this machine's host name when bound to a wildcard address (0.0.0.0 / ::)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"gateway port must be 0 (any free one) to 65535, not {self.port}")
        if self.advertise_url is not None:
            _advertised(self.advertise_url)  # a typo fails when the config is read, not when training starts


class GatewayServer:
    """Serve `create_gateway_app(backend, store, token=token, **app_options)` on ``host:port`` (0: any free one).

    ``url`` is the OpenAI base URL clients should use: ``advertise_url`` when given, else the bound address
    (with this machine's host name in place of a wildcard address); ``bound_url`` is where it listens."""

    def __init__(
        self,
        backend: Any,
        store: Any,
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_url: str | None = None,
        **app_options: Any,
    ) -> None:
        if token is None and not is_loopback_host(host):
            raise ValueError(f"refusing to serve the gateway on {host} without a token (anyone could use the model)")
        advertised = None if advertise_url is None else _advertised(advertise_url)  # checked before binding
        self.token = token
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        if port:  # a fixed port: a restarted trainer must not wait for the old socket's TIME_WAIT
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise OSError(exc.errno, f"cannot bind the gateway to {host}:{port}: {exc.strerror}") from None
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.bound_url = _base_url(bound_host, bound_port)
        self.url = advertised or _base_url(socket.gethostname() if _wildcard(bound_host) else bound_host, bound_port)
        self._app_args = (backend, store, token, app_options)
        self._server: Any = None
        self._recorder: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> GatewayServer:
        """Serve until `stop`; returns once the server accepts connections (raises its startup error)."""
        import uvicorn

        _quiet_cancelled_lifespan()

        from lightrail.gateway.app import create_gateway_app

        backend, store, token, options = self._app_args
        app = create_gateway_app(backend, store, token=token, **options)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        # the host process keeps its own signal handlers (uvicorn would take SIGINT/SIGTERM on the main thread)
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self._server = server
        self._recorder = app.state.recorder

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

    async def stop(self, *, abort: bool = False) -> None:
        """Stop accepting, let in-flight requests finish, flush the span recorder (the app's shutdown).

        ``abort``: for a run being stopped (a child process died, Ctrl-C): spans not yet stored are given up
        (`SpanBatcher.abandon`) instead of waited for. A request answers only once its span is stored, and with
        the store gone that never happens; the calls waiting answer 503 instead (their spans belong to attempts
        the stopped run leaves unfinished, which a resume cancels), so nothing acknowledged is lost."""
        try:
            if self._server is not None and self._task is not None:
                if abort:
                    self._recorder.abandon()
                self._server.should_exit = True
                await self._task
        finally:
            self._server = self._task = None
            self._sock.close()

    async def __aenter__(self) -> GatewayServer:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        await self.stop(abort=kind is not None and issubclass(kind, (asyncio.CancelledError, KeyboardInterrupt)))


def _cancelled(record: logging.LogRecord) -> bool:
    """False for the records of a cancelled lifespan: uvicorn's "Exception in 'lifespan' protocol" with an
    `asyncio.CancelledError`, and the traceback of one that Starlette sends as the shutdown's failure message. The
    event loop ended with the gateway still serving (a second Ctrl-C stops a run before `GatewayServer.stop`), which
    is not an error of the app; the tracebacks would bury the command's one line."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, asyncio.CancelledError):
        return False
    message = record.msg if isinstance(record.msg, str) else ""
    return not (message.startswith("Traceback") and message.rstrip().endswith("CancelledError"))


def _quiet_cancelled_lifespan() -> None:
    logger = logging.getLogger("uvicorn.error")
    if _cancelled not in logger.filters:
        logger.addFilter(_cancelled)


def _base_url(host: str, port: int) -> str:
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{netloc}/v1"
