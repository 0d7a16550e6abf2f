"""A small TCP proxy for network-fault tests: it forwards 127.0.0.1:<port> to a target and, on command, drops
every open connection (reset), delays every chunk, or goes half-open (connections stay up, nothing comes back)."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FaultyProxy"]


class FaultyProxy:
    """Concurrency model: one event loop (the test's); ``delay_s`` and ``blackhole`` are read per chunk."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.delay_s = 0.0
        self.blackhole = False
        """Half-open: answers from the target are held back (the client sees a live connection that never answers)."""
        self.connections = 0
        self.dropped = 0
        self.held = 0
        """Answers held back by a blackhole."""
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> FaultyProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def close(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def drop_all(self) -> None:
        """Reset every open connection, both sides (what a crashed NAT or load balancer does)."""
        for writer in list(self._writers):
            writer.transport.abort()
            self.dropped += 1
        self._writers.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, target_w}
        await asyncio.gather(
            self._pump(client_r, target_w, upstream=True), self._pump(target_r, client_w, upstream=False)
        )
        self._writers -= {client_w, target_w}

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(65536):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.blackhole and not upstream:
                    self.held += 1
                while self.blackhole and not upstream and not writer.is_closing():
                    await asyncio.sleep(0.05)  # held back until the blackhole lifts or the connection is dropped
                writer.write(chunk)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()
