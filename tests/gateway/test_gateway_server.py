"""`GatewayServer`: the gateway inside a running event loop: a public bind needs a token, URLs are valid for IPv6,
and the socket is released when it stops."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize(
    ("advertise_url", "message"),
    [("ftp://host/v1", "http"), ("trainer-host:8900", "http"), ("http://0.0.0.0:8900/v1", "wildcard")],
)
def test_a_bad_advertised_url_is_refused_before_binding(advertise_url, message):
    with pytest.raises(ValueError, match=message):
        GatewayServer(ScriptedBackend(["hi"]), MemoryStore(), token="t", advertise_url=advertise_url)


async def test_a_wildcard_bind_advertises_a_reachable_url():
    """Bound to every interface, the gateway gives runners the advertised URL (or this machine's host name), never
    0.0.0.0 or a loopback address, and answers there."""
    gateway = GatewayServer(ScriptedBackend(["hello"]), MemoryStore(), host="0.0.0.0", token="t")
    async with gateway:
        port = gateway.bound_url.rsplit(":", 1)[1].removesuffix("/v1")
        assert gateway.bound_url == f"http://0.0.0.0:{port}/v1"
        assert gateway.url == f"http://{socket.gethostname()}:{port}/v1"
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="t", max_retries=0)
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "hello"
        await client.close()
    advertised = GatewayServer(ScriptedBackend(["hi"]), MemoryStore(), token="t", advertise_url="http://gpu-1:8900")
    assert advertised.url == "http://gpu-1:8900/v1"  # normalized to the OpenAI base URL
    await advertised.stop()  # never started: releases the socket


@pytest.mark.parametrize(
    "command", [["store", "serve", "--db", ":memory:"], ["gateway", "serve", "--store", "x.db", "--fake"]]
)
def test_serve_commands_refuse_an_exposed_bind_without_a_token(command, tmp_path):
    """Both servers anyone might start by hand refuse 0.0.0.0 without a token, saying how to proceed."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("LIGHTRAIL_TOKEN", "LIGHTRAIL_GATEWAY_TOKEN")}
    done = subprocess.run(
        [sys.executable, "-m", "lightrail", *command, "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "refusing to bind 0.0.0.0 without a token" in done.stderr and "--insecure-no-token" in done.stderr


async def test_a_routed_call_is_stored_before_it_is_answered(tmp_path):
    """The moment an agent has its answer, the call is in the store (a store server in its own process, as on a
    cluster): the runner finishes an attempt only after its agent returned, so a finished attempt never misses its
    last call, and a gateway that dies after answering has lost nothing an agent saw. Sequential and concurrent."""
    import asyncio

    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess
    from lightrail.types import LLM, Attr, RolloutSpec, Task

    server = StoreServerProcess(tmp_path / "store.db", token="s")
    store = StoreClient(server.url, token="s")
    try:
        await store.enqueue([RolloutSpec(task=Task(input={}), rollout_id="r")])
        attempt = (await store.lease("w")).attempt
        async with GatewayServer(ScriptedBackend(), store, token="t") as gateway:
            routed = LLM(endpoint=gateway.url, model="m").base_url("r", attempt.attempt_id)
            client = AsyncOpenAI(base_url=routed, api_key="t", max_retries=0)

            async def call(text: str) -> None:
                reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
                stored = {s.attributes.get(Attr.RESPONSE_ID) for s in await store.query_spans("r")}
                assert reply.id in stored, text

            for i in range(10):
                await call(f"one {i}")
            await asyncio.gather(*(call(f"many {i}") for i in range(16)))
            await client.close()
    finally:
        await store.close()
        server.stop()


def test_an_event_loop_ended_while_the_gateway_serves_logs_no_lifespan_traceback():
    """A second Ctrl-C ends the trainer's event loop before `GatewayServer.stop`: the serving tasks are cancelled,
    which uvicorn logs as "Exception in 'lifespan' protocol" with a traceback that buried the command's one line.
    A cancellation is not an app error: that record is filtered out (and only that one)."""
    import asyncio
    import logging

    from lightrail.gateway.fake import ScriptedBackend
    from lightrail.gateway.server import GatewayServer
    from lightrail.store import MemoryStore

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]  (uvicorn's loggers do not propagate to pytest's)
    logger = logging.getLogger("uvicorn.error")

    async def serve_then_end() -> None:
        await GatewayServer(ScriptedBackend(["hi"]), MemoryStore()).start()  # never stopped
        logger.addHandler(handler)  # (after uvicorn configured its loggers, which drops their handlers)

    try:
        asyncio.run(serve_then_end())
        assert not [r for r in records if "lifespan" in r.getMessage()], [r.getMessage() for r in records]
        logger.error("a real error", exc_info=ValueError("kept"))
        assert [r.getMessage() for r in records] == ["a real error"]
    finally:
        logger.removeHandler(handler)
