"""The lean HTTP client (`lightrail._http`) against a real TCP server on loopback that misbehaves on purpose: when a
request is sent again after a kept-alive connection drops, how long idle connections are kept, and what a header
or path may contain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from lightrail._http import HTTPPool, StaleConnectionError


class Server:
    """Answers ``200 ok`` with keep-alive, except the requests whose numbers are in ``drop``: for those it reads the
    request and closes the connection without a byte of answer (a server that crashed while processing it)."""

    def __init__(self, drop: set[int]):
        self.drop = drop
        self.requests: list[bytes] = []  # request lines, in arrival order
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests.append(head.split(b"\r\n", 1)[0])
                if len(self.requests) in self.drop:
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serve(drop: set[int] = frozenset()) -> AsyncIterator[tuple[Server, str]]:
    server = Server(set(drop))
    tcp = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        tcp.close()
        await tcp.wait_closed()


async def test_a_post_whose_connection_drops_is_not_sent_twice():
    async with serve(drop={2}) as (server, url):
        pool = HTTPPool(url)
        assert await pool.request("POST", "/generate", b"{}") == (200, b"ok")
        with pytest.raises(StaleConnectionError):  # it reached the server: sending it again could run it twice
            await pool.request("POST", "/generate", b"{}")
        assert server.requests == [b"POST /generate HTTP/1.1"] * 2
        assert await pool.request("POST", "/generate", b"{}") == (200, b"ok")  # the pool recovers
        await pool.aclose()


async def test_an_idempotent_request_is_sent_again_on_a_new_connection():
    async with serve(drop={2}) as (server, url):
        pool = HTTPPool(url)
        assert await pool.request("GET", "/a") == (200, b"ok")
        assert await pool.request("GET", "/a") == (200, b"ok")  # dropped once, answered on a new connection
        message = b"POST /spans HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        server.drop.add(4)
        reply = await pool.exchange(message, idempotent=True)  # a write whose ids make a replay a no-op
        assert reply.status == 200
        assert server.requests == [b"GET /a HTTP/1.1"] * 3 + [b"POST /spans HTTP/1.1"] * 2
        assert server.connections == 3
        await pool.aclose()


async def test_idle_connections_expire_instead_of_being_reused():
    async with serve() as (server, url):
        keep = HTTPPool(url, keepalive_expiry_s=None)
        expire = HTTPPool(url, keepalive_expiry_s=0.0)
        for pool in (keep, expire):
            for _ in range(3):
                assert await pool.request("GET", "/") == (200, b"ok")
            await pool.aclose()
        assert server.connections == 1 + 3  # one kept alive for three requests; then one per request
        assert len(server.requests) == 6


@pytest.mark.parametrize(
    "build",
    [
        lambda url: HTTPPool(url, headers={"authorization": "Bearer t\r\nx-admin: yes"}),
        lambda url: HTTPPool(url, headers={"x-bad\nname": "v"}),
        lambda url: HTTPPool(url, headers={"x-nul": "a\x00b"}),
    ],
)
def test_headers_with_cr_lf_or_nul_are_refused(build):
    with pytest.raises(ValueError, match="CR, LF or NUL|not a valid HTTP token"):
        build("http://127.0.0.1:1")


async def test_paths_and_methods_that_would_split_a_request_are_refused():
    async with serve() as (server, url):
        pool = HTTPPool(url)
        for method, path in [("GET", "/a HTTP/1.1\r\nhost: evil\r\n\r\nGET /b"), ("GET /x", "/"), ("GET", "/a\nb")]:
            with pytest.raises(ValueError):
                await pool.request(method, path)
        assert server.requests == []  # nothing reached the server
        await pool.aclose()
