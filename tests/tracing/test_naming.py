"""`lightrail.as_agent` and `LLM.endpoint_for`: plain Python agents name the agent behind each call, no tracer.

Everything is real: a runner over a SQLite store, the gateway (over the `ScriptedBackend` fake model) served by
uvicorn on 127.0.0.1, the openai client and raw httpx. What a user relies on: the name given in the agent's code is
what training selects calls by (`build_episode`'s agent names, a `PolicyMap`'s filters) and what picks the policy
that serves the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from langchain_core.runnables import RunnableLambda
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI
from opentelemetry import trace

from lightrail import Runner, as_agent, rollout
from lightrail.adapters import build_episode
from lightrail.algorithms.policies import PolicyMap, PolicyRouter
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import SQLiteStore
from lightrail.tracing import ListSink, attempt_context, langchain, named_agent, otel
from lightrail.types import AGENT_HEADER, LLM, Attr, Resources, RolloutSpec, Task

TOKEN = "naming-token"
ASK = [{"role": "user", "content": "hi"}]


@rollout
async def debate(task, llm) -> float:
    """Three agents in plain Python: two named by `as_agent` blocks (nested, and across an ``asyncio.to_thread``),
    one by its endpoint; one call names nobody."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0)
    with as_agent("proposer"):
        await client.chat.completions.create(model=llm.model, messages=ASK)
        with as_agent("Senior Critic/2"):  # any printable name: spaces and slashes travel percent-encoded
            await asyncio.to_thread(_sync_call, llm)
        await client.chat.completions.create(model=llm.model, messages=ASK)
    judge = AsyncOpenAI(base_url=llm.endpoint_for("judge"), api_key=llm.api_key, max_retries=0)
    with as_agent("proposer"):  # the endpoint's name wins over the block's
        await judge.chat.completions.create(model=llm.model, messages=ASK)
    await client.chat.completions.create(model=llm.model, messages=ASK)
    await client.close()
    await judge.close()
    return 1.0


def _sync_call(llm) -> None:
    with OpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0) as client:
        client.chat.completions.create(model=llm.model, messages=ASK)


async def test_a_plain_python_agents_calls_are_trained_under_the_names_it_gave(tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    async with GatewayServer(ScriptedBackend(), store, token=TOKEN) as gateway:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key=TOKEN)}))
        (queued,) = await store.enqueue([RolloutSpec(task=Task(input={}), resources_version=1)])
        stats = await Runner(store, debate, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1, stats
    episode = build_episode(await store.query_spans(queued.rollout_id))
    names = ["proposer", "Senior Critic/2", "proposer", "judge", None]
    assert [c.agent_name for c in episode.calls] == names
    assert [c.span.attributes.get(Attr.CALLER_AGENT) for c in episode.calls] == names
    policies = PolicyMap({"debater": ["proposer"], "critic": ["Senior Critic/2"]})
    assert [c.turn for c in episode.calls if policies.filter("debater")(c.agent_name)] == [0, 2]
    assert [c.turn for c in episode.calls if policies.filter("critic")(c.agent_name)] == [1]
    await store.close()


async def test_a_named_call_is_served_by_its_agents_policy(tmp_path):
    """The name picks the policy's engine at the gateway: by `as_agent` and by `LLM.endpoint_for`."""

    def named(model: str) -> ScriptedBackend:
        return ScriptedBackend(lambda request: model, model=model)

    router = PolicyRouter({"write": named("policy-write")}, {"writer": "write"}, named("policy-base"))
    async with GatewayServer(router, SQLiteStore(tmp_path / "store.db"), token=TOKEN) as gateway:
        llm = LLM(endpoint=gateway.url, model="policy", api_key=TOKEN)
        client = AsyncOpenAI(base_url=llm.base_url(), api_key=TOKEN, max_retries=0)
        writer = AsyncOpenAI(base_url=llm.endpoint_for("writer"), api_key=TOKEN, max_retries=0)

        async def served_by(c: AsyncOpenAI) -> str | None:
            return (await c.chat.completions.create(model="policy", messages=ASK)).choices[0].message.content

        assert await served_by(client) == "policy-base"
        with as_agent("writer"):
            assert await served_by(client) == "policy-write"
        assert await served_by(writer) == "policy-write"

        @as_agent("writer")
        async def write() -> str | None:  # named while the coroutine runs, not while it is created
            return await served_by(client)

        @as_agent("writer")
        def write_sync() -> str | None:
            with OpenAI(base_url=llm.base_url(), api_key=TOKEN, max_retries=0) as sync_client:
                reply = sync_client.chat.completions.create(model="policy", messages=ASK)
            return reply.choices[0].message.content

        pending = write()
        assert named_agent() is None
        assert await pending == "policy-write"
        assert await asyncio.gather(write(), served_by(client)) == ["policy-write", "policy-base"]
        assert await asyncio.to_thread(write_sync) == "policy-write"
        await client.close()
        await writer.close()


async def test_raw_http_clients_name_their_agent_by_route_or_header(tmp_path):
    store = SQLiteStore(tmp_path / "store.db")
    async with GatewayServer(ScriptedBackend(), store, token=TOKEN) as gateway:
        await store.enqueue([RolloutSpec(task=Task(input={}))])
        lease = await store.lease("w")
        assert lease is not None
        llm = LLM(endpoint=gateway.url, model="m")
        routed = llm.base_url(lease.rollout.rollout_id, lease.attempt.attempt_id)
        auth = {"authorization": f"Bearer {TOKEN}"}
        body = {"model": "m", "messages": ASK}
        async with httpx.AsyncClient(headers=auth) as http:
            by_route = await http.post(LLM(endpoint=routed, model="m").endpoint_for("planner") + "/chat/completions",
                                       json=body)  # fmt: skip
            by_header = await http.post(
                routed + "/chat/completions", json=body, headers={AGENT_HEADER: "r%C3%A9viseur"}
            )
            refused = {
                "header, padded": await http.post(
                    routed + "/chat/completions", json=body, headers={AGENT_HEADER: "%20x"}
                ),
                "header, not UTF-8": await http.post(
                    routed + "/chat/completions", json=body, headers={AGENT_HEADER: "%FF"}
                ),
                "header, too long": await http.post(
                    routed + "/chat/completions", json=body, headers={AGENT_HEADER: "x" * 201}
                ),
                "route, control character": await http.post(
                    routed.removesuffix("/v1") + "/agents/a%0Ab/v1/chat/completions", json=body
                ),
            }
            served = await http.post(gateway.url.removesuffix("/v1") + "/agents/planner/v1/chat/completions", json=body)
            models = await http.get(llm.endpoint_for("planner") + "/models")
        assert by_route.status_code == 200 and by_header.status_code == 200, (by_route.text, by_header.text)
        assert served.status_code == 200 and models.status_code == 200
        for case, answer in refused.items():
            assert answer.status_code == 400, case
            error = answer.json()["error"]
            assert error["code"] == "invalid_agent" and error["param"] == "agent", case
            assert "agent name" in error["message"], (case, error["message"])
        spans = await store.query_spans(lease.rollout.rollout_id)
    by_response = {s.attributes.get(Attr.RESPONSE_ID): s for s in spans}
    assert by_response[by_route.json()["id"]].attributes[Attr.CALLER_AGENT] == "planner"
    assert by_response[by_header.json()["id"]].attributes[Attr.CALLER_AGENT] == "réviseur"
    assert [c.agent_name for c in build_episode(spans).calls if c.response_id] == ["planner", "réviseur"]
    assert len([s for s in spans if s.status.code == "error"]) == len(refused)  # refused calls are recorded too
    await store.close()


def test_as_agent_refuses_to_decorate_generator_functions():
    """A block around creating a generator ends before it runs: refused, not silently unnamed."""
    with pytest.raises(TypeError, match="generator function"):

        @as_agent("writer")
        def lines():
            yield 1

    with pytest.raises(TypeError, match="generator function"):

        @as_agent("writer")
        async def chunks():
            yield 1


def test_as_agent_checks_the_name_and_restores_the_outer_one():
    with pytest.raises(ValueError, match="agent name"), as_agent("line\nbreak"):
        pass
    assert named_agent() is None
    with as_agent("outer"):
        with as_agent("inner"):
            assert named_agent() == "inner"
        assert named_agent() == "outer"
    assert named_agent() is None
    block = as_agent("reused")
    for _ in range(2):  # one block after the other
        with block:
            assert named_agent() == "reused"
            with pytest.raises(RuntimeError, match="entered already"), block:
                pass
            assert named_agent() == "reused"
        assert named_agent() is None


async def test_as_agent_wins_over_the_agent_opentelemetry_guesses_and_a_callers_header_over_both():
    seen: list[str | None] = []

    async def app(scope, receive, send):
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(AGENT_HEADER.encode(), b"").decode() or None)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    tracer = trace.get_tracer("lightrail.tests.test_naming")
    handle = otel.setup(instrument=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            guessed = tracer.start_as_current_span("agent", attributes={Attr.AGENT_NAME: "guessed"})
            with attempt_context("r", "a", ListSink()), guessed:
                await client.get("/")
                with as_agent("named"):
                    await client.get("/")
                    await client.get("/", headers={AGENT_HEADER: "callers"})
    finally:
        handle.shutdown()
    assert seen == ["guessed", "named", "callers"]


async def test_which_guess_names_a_call_does_not_depend_on_the_order_the_stamps_were_added():
    """OpenTelemetry's guess wins over LangChain's run name (docs/frameworks.md, "Naming agents"), also after
    OpenTelemetry is set up again once LangChain's stamp was installed (its stamp then comes back after it)."""
    seen: list[str | None] = []

    async def app(scope, receive, send):
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(AGENT_HEADER.encode(), b"").decode() or None)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    tracer = trace.get_tracer("lightrail.tests.test_naming")
    otel.setup(instrument=False).shutdown()
    langchain.install()
    handle = otel.setup(instrument=False)  # its stamp added again, now after LangChain's
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:

            async def writer(_: str) -> None:
                await client.get("/")

            named_run = RunnableLambda(writer)
            guessed = tracer.start_as_current_span("agent", attributes={Attr.AGENT_NAME: "guessed"})
            with attempt_context("r", "a", ListSink()):
                await named_run.ainvoke("x")
                with guessed:
                    await named_run.ainvoke("x")
    finally:
        handle.shutdown()
    assert seen == ["writer", "guessed"]


_together: asyncio.Barrier | None = None
"""Both rollouts of `two_names_at_once` meet here before each of their calls, so the calls are in flight together."""


async def _meet() -> None:
    assert _together is not None
    await asyncio.wait_for(_together.wait(), 30)


@rollout
async def two_names_at_once(task, llm) -> float:
    """A call in an `as_agent` block of the task's name, then one by a LangChain chat model run under the task's
    run name, each made while the other rollout of the process makes the same."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0)
    model = ChatOpenAI(base_url=llm.endpoint, api_key=llm.api_key, model=llm.model, max_retries=0)
    with as_agent(task["agent"]):
        await _meet()
        await client.chat.completions.create(model=llm.model, messages=ASK)
    await _meet()
    await model.with_config(run_name=task["run"]).ainvoke("hi")
    await client.close()
    return 1.0


async def test_concurrent_rollouts_of_one_runner_each_name_their_calls_with_their_own_names(tmp_path):
    global _together
    _together = asyncio.Barrier(2)
    store = SQLiteStore(tmp_path / "store.db")
    tasks = [{"agent": "proposer", "run": "drafter"}, {"agent": "critic", "run": "reviewer"}]
    async with GatewayServer(ScriptedBackend(), store, token=TOKEN) as gateway:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key=TOKEN)}))
        queued = await store.enqueue([RolloutSpec(task=Task(input=t), resources_version=1) for t in tasks])
        runner = Runner(store, two_names_at_once, concurrency=2, handle_signals=False)
        stats = await runner.run(max_rollouts=2)
    assert stats.ended["succeeded"] == 2, stats
    for rollout_, task in zip(queued, tasks, strict=True):
        calls = [s for s in await store.query_spans(rollout_.rollout_id) if s.name == Attr.SPAN_LLM_CALL]
        calls.sort(key=lambda s: s.seq)
        assert [s.attributes.get(Attr.CALLER_AGENT) for s in calls] == [task["agent"], task["run"]]
    await store.close()


@contextlib.asynccontextmanager
async def _reverse_proxy(prefix: str, target: str) -> AsyncIterator[str]:
    """An HTTP reverse proxy on 127.0.0.1 (uvicorn, httpx) that serves ``target`` under ``prefix``, stripped before
    forwarding (as nginx's ``location /agents/gw/ { proxy_pass http://gateway/; }``); yields its root URL."""
    upstream = httpx.AsyncClient(base_url=target)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        path = scope["path"]
        if not path.startswith(prefix + "/"):
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"not under the prefix"})
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"host", b"content-length")]
        query = f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        answer = await upstream.request(
            scope["method"], path.removeprefix(prefix) + query, headers=headers, content=body
        )
        out = [
            (k.encode(), v.encode())
            for k, v in answer.headers.items()
            if k not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": out})
        await send({"type": "http.response.body", "body": answer.content})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "the proxy did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
        await upstream.aclose()


@rollout
async def behind_a_proxy(resources) -> float:
    """One unnamed call, one by `LLM.endpoint_for`, one by an LLM of the resources that names its agent."""
    llm = resources["llm"]
    for base_url in (llm.endpoint, llm.endpoint_for("writer"), resources["judge"].endpoint):
        async with AsyncOpenAI(base_url=base_url, api_key=llm.api_key, max_retries=0) as client:
            await client.chat.completions.create(model=llm.model, messages=ASK)
    return 1.0


async def test_a_gateway_behind_a_reverse_proxy_prefix_that_reads_like_an_agent_route(tmp_path):
    """``http://proxy/agents/gw/v1`` is the gateway's own URL: routing an attempt and naming an agent keep the prefix
    (it was read as the agent ``gw`` and dropped, so every call went to the proxy's root and failed)."""
    store = SQLiteStore(tmp_path / "store.db")
    async with (
        GatewayServer(ScriptedBackend(), store, token=TOKEN) as gateway,
        _reverse_proxy("/agents/gw", gateway.url.removesuffix("/v1")) as proxy,
    ):
        endpoint = f"{proxy}/agents/gw/v1"
        llm = LLM(endpoint=endpoint, model="m", api_key=TOKEN)
        judge = LLM(endpoint=endpoint, model="m", api_key=TOKEN, agent="judge")
        await store.put_resources(Resources(items={"llm": llm, "judge": judge}))
        (queued,) = await store.enqueue([RolloutSpec(task=Task(input={}), resources_version=1)])
        stats = await Runner(store, behind_a_proxy, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1, stats
    calls = [s for s in await store.query_spans(queued.rollout_id) if s.name == Attr.SPAN_LLM_CALL]
    assert [s.attributes.get(Attr.CALLER_AGENT) for s in sorted(calls, key=lambda s: s.seq)] == [
        None,
        "writer",
        "judge",
    ]
    await store.close()
