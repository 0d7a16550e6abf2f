"""A lean keep-alive HTTP/1.1 client: the one lightrail uses wherever a hop's overhead counts (the gateway's
upstream calls; the store client, through `lightrail.store.client.LeanHTTPTransport`).

Why not httpx's own transport: measured on loopback, an ``httpx.AsyncClient`` request costs 0.4–0.65 ms of
client-side Python (httpcore + anyio), versus ~0.1 ms here; that was most of a runner's CPU in
``bench/store.py`` and most of the gateway's overhead budget. These hops need little of what httpx offers: one
origin, a request with a body, status, headers and body back. Parsing is done by httptools (llhttp, shipped with
uvicorn[standard], which serves our own endpoints), including chunked transfer encoding.

Not supported, on purpose: proxies from the environment, HTTP/2, redirects, streaming responses, ``HEAD``, and
responses whose body ends only when the server closes the connection (neither length nor chunked). TLS is.

Concurrency model: one event loop per pool. Each connection carries one request at a time; idle connections are
kept in a LIFO list (the warmest first) and at most ``max_connections`` requests are in flight.

Errors: `ConnectFailedError` (could not connect), `ConnectTimeoutError`, `PoolTimeoutError`, `TimeoutError` (no
complete response in time), `StaleConnectionError` (the connection closed before a byte of the answer) and
`ConnectionError` (lost or malformed mid-response).

Resending. A kept-alive connection the server closed while idle is replaced transparently when the request was
not written yet. Once written, a request whose connection closes before any answer may or may not have been
processed, so it is sent again on a new connection only if it is idempotent: ``GET``/``PUT``/``DELETE``/``OPTIONS``,
or what the caller declares so (``exchange(..., idempotent=True)``: the store client does, every store write
carries the ids that make a replay a no-op). A ``POST`` to a model server is never sent twice. Idle connections
older than ``keepalive_expiry_s`` (default 4 s, under the 5 s keep-alive timeout of uvicorn, vLLM and most
servers) are closed instead of reused, so that race is rare to begin with.

Header names and values, methods and paths are checked for CR, LF and NUL (`ValueError`): a value read from
configuration or an agent can never add a header or a request of its own.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from types import EllipsisType
from typing import NamedTuple, cast
from urllib.parse import urlsplit

import httptools

__all__ = [
    "ConnectFailedError",
    "ConnectTimeoutError",
    "HTTPPool",
    "PoolTimeoutError",
    "Reply",
    "StaleConnectionError",
]


class StaleConnectionError(ConnectionError):
    """The connection was closed by the server before a byte of the response. ``written``: whether the request
    had been written (then the server may have processed it)."""

    def __init__(self, message: str, *, written: bool = True):
        super().__init__(message)
        self.written = written


class ConnectFailedError(ConnectionError):
    """No connection could be made (refused, unreachable, DNS)."""


class ConnectTimeoutError(TimeoutError):
    """Connecting took longer than the connect timeout."""


class PoolTimeoutError(TimeoutError):
    """Every connection stayed busy for longer than the pool timeout."""


class Reply(NamedTuple):
    status: int
    reason: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    keep_alive: bool


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; `send` writes a request and waits for the complete response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[Reply] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._got_bytes = False
        self.idle_since = 0.0
        """`time.monotonic` when the connection last went idle."""

    # -- asyncio.Protocol -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP (or TLS over TCP) connection's transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._parser is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._got_bytes:
            self._fail(ConnectionError("connection closed in the middle of a response"))
        else:
            self._fail(StaleConnectionError("connection closed before the response"))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        parser, waiter = self._parser, self._waiter
        self._parser = None
        if waiter is not None and not waiter.done() and parser is not None:
            reply = Reply(
                parser.get_status_code(),
                self._reason,
                self._headers,
                b"".join(self._chunks),
                parser.should_keep_alive(),
            )
            waiter.set_result(reply)

    # -- requests -------------------------------------------------------------------------------------------

    async def send(self, message: bytes, timeout_s: float | None) -> Reply:
        """Write ``message`` (head and body) and return the complete reply."""
        assert self.transport is not None
        if self.closed or self.transport.is_closing():  # a write would vanish and the reply never come
            raise StaleConnectionError("connection closed before the request", written=False)
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._reason, self._headers, self._chunks = b"", [], []
        self._got_bytes = False
        self.transport.write(message)
        # call_later is cheaper than wait_for/timeout() on this path and does the same job
        timer = None
        if timeout_s is not None:
            timer = loop.call_later(timeout_s, self._fail, TimeoutError(f"no response within {timeout_s:g}s"))
        try:
            return await self._waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
            if not isinstance(exc, StaleConnectionError):
                self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


_UNSAFE = re.compile(r"[\r\n\x00]")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token: methods and header names
_IDEMPOTENT = frozenset({b"GET", b"PUT", b"DELETE", b"OPTIONS"})


def _check_token(what: str, value: str) -> None:
    if not _TOKEN.match(value):
        raise ValueError(f"{what} {value[:80]!r} is not a valid HTTP token")


class HTTPPool:
    """Keep-alive connections to one origin (``http://host:port`` or ``https://...``), with a path prefix.

    >>> pool = HTTPPool("http://127.0.0.1:8000/v1", headers={"authorization": "Bearer x"})  # doctest: +SKIP
    >>> status, body = await pool.request("POST", "/chat/completions", b"{...}")           # doctest: +SKIP

    `request` builds the message from the pool's headers; `exchange` sends a complete message built by the caller.
    See the module docstring for when a request is sent again and how long idle connections are kept.
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        max_connections: int = 512,
        timeout_s: float | None = 600.0,
        connect_timeout_s: float | None = 10.0,
        keepalive_expiry_s: float | None = 4.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        host_header = parts.netloc.rsplit("@", 1)[-1]
        for name, value in (headers or {}).items():
            _check_token("header name", name)
            if _UNSAFE.search(value):
                raise ValueError(f"header {name!r}: its value contains CR, LF or NUL")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._common = f"host: {host_header}\r\n{extra}".encode("latin-1")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.keepalive_expiry_s = keepalive_expiry_s
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one JSON request; returns ``(status, body)``."""
        _check_token("method", method)
        if _UNSAFE.search(path) or " " in path:
            raise ValueError(f"path {path[:80]!r} contains a space, CR, LF or NUL")
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._common
        if body or method != "GET":
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        reply = await self.exchange(head + b"\r\n" + body)
        return reply.status, reply.body

    async def exchange(
        self,
        message: bytes,
        *,
        timeout_s: float | None | EllipsisType = ...,
        connect_timeout_s: float | None | EllipsisType = ...,
        pool_timeout_s: float | None = None,
        idempotent: bool | None = None,
    ) -> Reply:
        """Send a complete HTTP/1.1 request message on an idle or new connection and return the reply.

        Timeouts default to the pool's. ``idempotent``: whether the request may be sent again when a kept-alive
        connection closes before answering (None: by its method; see the module docstring).
        """
        if idempotent is None:
            idempotent = message.split(b" ", 1)[0] in _IDEMPOTENT
        if timeout_s is ...:
            timeout_s = self.timeout_s
        if connect_timeout_s is ...:
            connect_timeout_s = self.connect_timeout_s
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        slots = self._slots
        if slots.locked() and pool_timeout_s is not None:  # only then can acquiring wait
            try:
                await asyncio.wait_for(slots.acquire(), pool_timeout_s)
            except TimeoutError:
                raise PoolTimeoutError(f"no free connection within {pool_timeout_s:g}s") from None
        else:
            await slots.acquire()
        try:
            while True:
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(connect_timeout_s)
                try:
                    reply = await conn.send(message, timeout_s)
                except StaleConnectionError as exc:
                    # the server dropped an idle keep-alive connection: another one, if sending again is safe
                    if reused and (idempotent or not exc.written):
                        continue
                    raise
                except BaseException:  # timeout, cancellation: the connection's state is unknown
                    conn.close()
                    raise
                if reply.keep_alive and not conn.closed:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
                return reply
        finally:
            slots.release()

    def _take_idle(self) -> _Connection | None:
        idle, expiry = self._idle, self.keepalive_expiry_s
        if expiry is not None and idle:
            oldest_kept = time.monotonic() - expiry
            while idle and idle[0].idle_since < oldest_kept:  # LIFO: the oldest are at the front
                idle.pop(0).close()
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self, timeout_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        connecting = loop.create_connection(
            _Connection, self.host, self.port, ssl=self._ssl, server_hostname=self.host if self._ssl else None
        )
        try:
            _, conn = await asyncio.wait_for(connecting, timeout_s)
        except TimeoutError:
            raise ConnectTimeoutError(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise ConnectFailedError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    async def aclose(self) -> None:
        """Close the idle connections (busy ones close when their request ends)."""
        while self._idle:
            self._idle.pop().close()
