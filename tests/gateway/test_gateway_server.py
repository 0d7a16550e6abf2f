"""`GatewayServer`: the gateway inside a running event loop: a public bind needs a token, URLs are valid for IPv6,
and the socket is released when it stops."""

from __future__ import annotations

import socket

import httpx
import pytest
from openai import AsyncOpenAI

from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import MemoryStore


def test_a_public_bind_without_a_token_is_refused():
    with pytest.raises(ValueError, match="without a token"):
        GatewayServer(ScriptedBackend(["hi"]), MemoryStore(), host="0.0.0.0")


async def test_serves_on_ipv6_loopback_and_releases_its_port():
    if not socket.has_ipv6:
        pytest.fail("this machine has no IPv6 stack")
    gateway = GatewayServer(ScriptedBackend(["hello"]), MemoryStore(), host="::1", token="t")
    async with gateway:
        assert gateway.url.startswith("http://[::1]:")
        client = AsyncOpenAI(base_url=gateway.url, api_key="t", max_retries=0)
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "hello"
        await client.close()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(gateway.url.replace("/v1", "/health"))
