"""Serving an ASGI app from a command: the one uvicorn start-up of ``store serve``, ``dashboard`` and
``gateway serve``.

A command prints ``<name> listening on <url>`` only once it is actually serving: the socket is bound (a busy port
is an `OSError` before anything is printed), the app's startup has run in this process's loop (its store is open:
a database that cannot be opened, a store server that refuses the token, raise to the command as ordinary
exceptions, never as a traceback logged by uvicorn), and uvicorn accepts connections. A parent process that reads
that line may connect at once.

Concurrency model: one event loop (uvloop when installed); uvicorn serves on it, SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import sys
from typing import Any, Literal

__all__ = ["bind", "serve_app", "serve_app_async", "tls_options", "uvicorn_config"]


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    lifespan: Literal["auto", "on", "off"] = "on",
    **extra: Any,
) -> Any:
    """uvicorn's settings for a lightrail server: uvloop and httptools when installed, no access log."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan=lifespan,
        log_level=log_level,
        access_log=False,
        # Runners sit idle between calls while their agent works; keeping their connection saves a reconnect.
        timeout_keep_alive=30,
        **extra,
    )


def bind(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A bound socket, listening unless ``listen`` is False (uvicorn starts listening when it serves: until then
    clients are refused rather than left waiting in the backlog); SO_REUSEADDR so a restarted server can take the
    same port at once. A busy port or an address this machine does not have is an `OSError` naming ``host:port``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, sock: socket.socket, tls: bool = False) -> str:
    """The URL a bound socket serves (port 0 resolved to the port it got)."""
    port, scheme = sock.getsockname()[1], "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def tls_options(cert: str | os.PathLike[str] | None, key: str | os.PathLike[str] | None) -> dict[str, Any]:
    """uvicorn's TLS settings for a certificate and its key (both or neither)."""
    if cert is None or key is None:
        if cert is not None or key is not None:
            raise ValueError("tls_cert and tls_key go together")
        return {}
    return {"ssl_certfile": os.fspath(cert), "ssl_keyfile": os.fspath(key)}


async def serve_app_async(
    app: Any,
    name: str,
    *,
    host: str,
    port: int,
    tls: dict[str, Any],
    then: str = "",
    detail: str = "",
    log_level: str = "warning",
    sock: socket.socket | None = None,
) -> None:
    """Serve a Starlette ``app`` until interrupted, printing ``<name> listening on <url><detail>`` to stdout once
    it serves, then the line ``then`` (``{url}`` filled in) if given. ``tls`` is what `tls_options` made of the
    PEM files (empty: HTTP). The app's startup (its lifespan) runs here before serving, so its errors are raised
    to the caller; a Ctrl-C ends with `KeyboardInterrupt` after a graceful shutdown. ``sock``: a socket the caller
    bound already (`bind`), so a busy port fails before slow work like loading a model; it is closed here."""
    import uvicorn

    sock = sock if sock is not None else bind(host, port)
    try:
        url = url_of(host, sock, bool(tls))
        async with app.router.lifespan_context(app):
            # lifespan off: it runs above, where its errors are ours to report
            config = uvicorn_config(app, host, sock.getsockname()[1], log_level=log_level, lifespan="off",
                                    timeout_graceful_shutdown=5, **tls)  # fmt: skip
            server = uvicorn.Server(config)
            serving = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started:
                if serving.done():
                    serving.result()  # uvicorn's own startup error (TLS files, ...)
                    raise RuntimeError(f"{name} stopped while starting")
                await asyncio.sleep(0.01)
            print(f"{name} listening on {url}{detail}", flush=True)
            if then:
                print(then.format(url=url), flush=True)
            await serving
    finally:
        sock.close()


def serve_app(app: Any, name: str, **options: Any) -> None:
    """`serve_app_async` on a fresh event loop (uvloop when installed), for a command's main thread."""
    run(serve_app_async(app, name, **options))


def run(main: Any) -> Any:
    """Run the coroutine ``main`` on a fresh event loop, uvloop's when installed."""
    if importlib.util.find_spec("uvloop") and sys.platform != "win32":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
