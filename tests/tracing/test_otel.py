"""`lightrail.tracing.otel`: OpenTelemetry spans in runners, stamped per attempt, linked to the gateway's calls.

Everything is real: the OTel SDK, the OpenInference openai instrumentor, the openai client, the gateway (over the
`ScriptedBackend` fake upstream) served by uvicorn on 127.0.0.1, runners, and a store server for OTLP.

OTel's global TracerProvider is set once per process: `otel.setup` keeps one provider and processor per process
and `OTel.shutdown` deactivates them, so every test shuts its setup down (the autouse fixture) and tests run in any
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import AsyncIterator

import httpx
import otel_agents
import pytest
import uvicorn
from openai import AsyncOpenAI
from opentelemetry import context as otel_context
from opentelemetry import trace

from lightrail.adapters import build_episode
from lightrail.agent import Runner, run_runners
from lightrail.algorithms.policies import PolicyMap
from lightrail.cli import main
from lightrail.gateway import ScriptedBackend, create_gateway_app
from lightrail.gateway.app import parse_traceparent
from lightrail.store import MemoryStore, StoreClient
from lightrail.store.server import serve_in_thread
from lightrail.tracing import ListSink, attempt_context, otel
from lightrail.trainer import Trainer
from lightrail.types import LLM, Attr, Resources, RolloutSpec, RolloutStatus, StatusCode, Task

tracer = trace.get_tracer("lightrail.tests.test_otel")


@pytest.fixture(autouse=True)
def otel_off():
    yield
    handle = otel.current()
    if handle is not None:
        handle.shutdown()


@contextlib.asynccontextmanager
async def serve(app) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in this event loop; yields its root URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def enqueue(store, agent_inputs: list[dict], llm_url: str | None = None) -> list[str]:
    if llm_url is not None:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=llm_url + "/v1", model="scripted")}))
    specs = [RolloutSpec(task=Task(input=i, task_id=i["task_id"])) for i in agent_inputs]
    return [r.rollout_id for r in await store.enqueue(specs)]


async def test_concurrent_rollouts_keep_otel_spans_apart_and_calls_name_their_agents():
    store = MemoryStore()
    handle = otel.setup(instrument=["openai"])
    assert handle.instrumented == ["openai"] and otel.setup() is handle  # idempotent: the active setup
    async with serve(create_gateway_app(ScriptedBackend(), store)) as url:
        ids = await enqueue(store, [{"task_id": f"t{i}", "seed": i} for i in range(8)], url)
        runner = Runner(store, "otel_agents:two_agents", concurrency=8, otel=True, handle_signals=False)
        stats = await runner.run(max_rollouts=8)
    assert stats.ended["succeeded"] == 8, stats
    assert handle.unattributed == 0
    exported = 0
    for i, rollout_id in enumerate(ids):
        task_id = f"t{i}"
        (attempt,) = await store.query_attempts(rollout_id)
        spans = await store.query_spans(rollout_id)
        by_id = {s.span_id: s for s in spans}
        (root,) = [s for s in spans if s.name == Attr.SPAN_ROLLOUT]
        assert {s.attempt_id for s in spans} == {attempt.attempt_id}
        assert {s.trace_id for s in spans} == {root.trace_id}  # one trace: runner, framework and gateway spans

        tagged = [s for s in spans if "test.task" in s.attributes]
        assert {s.attributes["test.task"] for s in tagged} == {task_id}  # nothing of the 7 other rollouts
        (count,) = [s.attributes["n"] for s in spans if s.attributes.get(Attr.EVENT_NAME) == "otel_spans"]
        assert len(tagged) == count  # every span the agent made is here
        assert all(s.attributes[Attr.ROLLOUT_ID] == rollout_id for s in tagged)
        roots = sorted(s.name for s in tagged if s.parent_id == root.span_id)
        assert roots == ["planner", "solver"]  # the agent's root spans hang under the rollout span
        assert all(s.parent_id in by_id for s in spans if s is not root)

        llm_spans = [s for s in spans if s.attributes.get(Attr.KIND) == "llm"]
        calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
        assert len(llm_spans) == 2 and len(calls) == 2
        for call in calls:  # the gateway's span is a child of the openai instrumentor's span of the same call
            parent = by_id[call.parent_id]
            assert parent in llm_spans
            assert parent.attributes[Attr.GENAI_RESPONSE_ID] == call.attributes[Attr.RESPONSE_ID]
        episode = build_episode(spans)
        assert [c.agent_name for c in episode.calls] == [f"planner-{task_id}", f"solver-{task_id}"]
        assert episode.final_reward == 1.0
        exported += len(tagged) + len(llm_spans)
    assert handle.exported == exported


async def test_an_agent_is_trained_under_one_name_whether_its_header_or_its_spans_named_the_call():
    """A CrewAI role from YAML ends in a newline: the header the runner stamps cannot carry it and sends
    ``Researcher``; the spans that name the agent of a call made without the header say the same, as do the
    agent span's normalized attributes, and a policy of ``Researcher`` trains both calls."""
    store = MemoryStore()
    otel.setup(instrument=False)
    async with serve(create_gateway_app(ScriptedBackend(), store)) as url:
        (rollout_id,) = await enqueue(store, [{"task_id": "crew"}], url)
        stats = await Runner(store, otel_agents.padded_role, otel=True, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1, stats
    spans = await store.query_spans(rollout_id)
    (agent,) = [s for s in spans if s.attributes.get(Attr.KIND) == "agent"]
    assert agent.attributes[Attr.AGENT_NAME] == "Researcher"
    calls = build_episode(spans).calls
    assert [c.span.attributes.get(Attr.CALLER_AGENT) for c in calls] == ["Researcher", None]  # header, spans
    assert [c.agent_name for c in calls] == ["Researcher", "Researcher"]
    trained = PolicyMap({"research": ["Researcher"]}).filter("research")
    assert all(trained(c.agent_name) for c in calls)


async def test_ended_attempts_leave_none_of_their_spans_behind():
    """Spans an agent never ends (an abandoned stream) are kept while their attempt runs (a call made under one is
    named by it) and forgotten when it ends: a runner that lives for days does not keep every attempt's spans."""
    store = MemoryStore()
    handle = otel.setup(instrument=False)
    async with serve(create_gateway_app(ScriptedBackend(), store)) as url:
        ids = await enqueue(store, [{"task_id": f"t{i}"} for i in range(4)], url)
        runner = Runner(store, otel_agents.abandons_spans, concurrency=2, otel=True, handle_signals=False)
        stats = await runner.run(max_rollouts=4)
    assert stats.ended["succeeded"] == 4, stats
    processor = handle.processor
    assert processor.live == {} and processor._open == {} and processor._of_attempt == {}
    for rollout_id in ids:
        spans = await store.query_spans(rollout_id)
        assert [c.span.attributes.get(Attr.CALLER_AGENT) for c in build_episode(spans).calls] == ["streamer"]
        assert [s.name for s in spans if "test.task" in s.attributes] == ["ended"]


async def test_openai_instrumentor_llm_span_is_the_parent_of_the_gateway_span():
    store = MemoryStore()
    handle = otel.setup(instrument=["openai"])
    async with serve(create_gateway_app(ScriptedBackend(), store)) as url:
        (rollout_id,) = await enqueue(store, [{"task_id": "q"}], url)
        stats = await Runner(store, otel_agents.plain_openai, otel=True, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1
    spans = await store.query_spans(rollout_id)
    (root,) = [s for s in spans if s.name == Attr.SPAN_ROLLOUT]
    (llm,) = [s for s in spans if s.attributes.get(Attr.KIND) == "llm"]
    (call,) = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
    assert llm.attributes["openinference.span.kind"] == "LLM" and llm.status.code is StatusCode.OK
    assert llm.parent_id == root.span_id and call.parent_id == llm.span_id
    assert llm.trace_id == call.trace_id == root.trace_id
    assert llm.attributes[Attr.GENAI_RESPONSE_ID] == call.attributes[Attr.RESPONSE_ID]
    assert llm.end_time >= llm.start_time > 0 and handle.exported == 1


async def test_spans_outside_an_attempt_are_counted_not_exported_and_attempts_stay_apart():
    handle = otel.setup(instrument=False)
    with tracer.start_as_current_span("outside"):
        pass
    assert handle.unattributed == 1 and handle.exported == 0

    sinks = {f"r{i}": ListSink() for i in range(8)}

    def work_in_thread(name: str) -> None:
        with tracer.start_as_current_span("in-thread", attributes={"who": name}):
            pass

    async def attempt(name: str) -> None:
        with (
            attempt_context(name, "a-" + name, sinks[name]),
            tracer.start_as_current_span("outer", attributes={"who": name}),
        ):
            await asyncio.sleep(0.001)
            await asyncio.gather(*(asyncio.to_thread(work_in_thread, name) for _ in range(3)))
            with tracer.start_as_current_span("inner", attributes={"who": name}) as inner:
                inner.add_event("tick", {"n": (1, 2)})
                inner.set_status(trace.Status(trace.StatusCode.ERROR, "boom"))

    await asyncio.gather(*(attempt(name) for name in sinks))
    for name, sink in sinks.items():
        assert sorted(s.name for s in sink.spans) == ["in-thread"] * 3 + ["inner", "outer"]
        assert {(s.rollout_id, s.attempt_id, s.attributes["who"]) for s in sink.spans} == {(name, "a-" + name, name)}
        outer = next(s for s in sink.spans if s.name == "outer")
        inner = next(s for s in sink.spans if s.name == "inner")
        assert all(s.parent_id == outer.span_id for s in sink.spans if s is not outer)
        assert inner.status.code is StatusCode.ERROR and inner.status.message == "boom"
        assert inner.events[0].name == "tick" and inner.events[0].attributes == {"n": [1, 2]}
        assert len({s.seq for s in sink.spans}) == 5
    assert handle.unattributed == 1 and handle.exported == 40

    # a framework thread started without the contextvars, carrying only the OTel context it was handed: the
    # trace id names the attempt (the runner registers it in `OTel.attempt_parent`)
    def framework_thread(otel_ctx) -> None:
        token = otel_context.attach(otel_ctx)
        try:
            with tracer.start_as_current_span("handed-over"):
                pass
        finally:
            otel_context.detach(token)

    with attempt_context("r9", "a9", sink9 := ListSink()) as ctx, handle.attempt_parent(ctx, "00f067aa0ba902b7"):
        thread = threading.Thread(target=framework_thread, args=(otel_context.get_current(),))
        thread.start()
        thread.join()
    ((span,),) = [sink9.spans]
    assert (span.name, span.attempt_id, span.trace_id, span.parent_id) == (
        "handed-over",
        "a9",
        ctx.trace_id,
        "00f067aa0ba902b7",
    )

    handle.shutdown()
    assert otel.current() is None
    with attempt_context("r", "a", sink := ListSink()), tracer.start_as_current_span("after shutdown"):
        pass
    assert sink.spans == []


def test_setup_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown instrumentor 'nope'"):
        otel.setup(instrument=["nope"])
    with pytest.raises(ValueError, match="store_url"):
        otel.setup(exporter="otlp")
    with pytest.raises(ValueError, match="exporter"):
        otel.setup(exporter="zipkin")  # type: ignore[arg-type]
    otel.setup(instrument=False)
    with pytest.raises(ValueError, match="already set up with exporter='sink'"):
        otel.setup(exporter="otlp", store_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="'sink' or 'otlp'"):
        run_runners("http://127.0.0.1:1", "otel_agents:tagged_spans", 1, 1, otel="yes")


def test_parse_traceparent():
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse_traceparent(good) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert parse_traceparent(good.upper()) == ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
    assert parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future") is not None
    for bad in [
        None,
        "",
        "garbage",
        good + "-extra",  # version 00 has exactly four fields
        "ff" + good[2:],  # version ff is invalid
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
        "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ]:
        assert parse_traceparent(bad) is None, bad


async def test_gateway_sets_the_call_parent_from_traceparent_and_ignores_a_malformed_one():
    store = MemoryStore()
    app = create_gateway_app(ScriptedBackend(), store)
    async with serve(app) as url:
        await store.enqueue([RolloutSpec(task=Task(input="q"))])
        lease = await store.lease("w")
        base = f"{url}/rollouts/{lease.rollout.rollout_id}/attempts/{lease.attempt.attempt_id}/v1"
        headers = {
            "good": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "bad": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "zero": "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "none": None,
        }
        async with AsyncOpenAI(base_url=base, api_key="none", max_retries=0) as client:
            for label, value in headers.items():
                reply = await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": label}],
                    extra_headers={"traceparent": value} if value else None,
                )
                assert reply.choices[0].message.content == label  # a malformed header never fails the call
        await app.state.recorder.flush()
    spans = await store.query_spans(lease.rollout.rollout_id)
    by_label = {s.attributes[Attr.REQUEST]["messages"][0]["content"]: s for s in spans}
    assert by_label["good"].trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert by_label["good"].parent_id == "00f067aa0ba902b7"
    for label in ("bad", "zero", "none"):
        assert by_label[label].parent_id is None and by_label[label].trace_id != "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_traceparent_is_injected_into_httpx_requests_and_removed_at_shutdown():
    seen: list[str | None] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append(dict(scope["headers"]).get(b"traceparent", b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    try:
        handle = otel.setup(instrument=False)
        with attempt_context("r", "a", ListSink()), tracer.start_as_current_span("caller") as caller:
            async with httpx.AsyncClient() as client:
                await client.get(url)
            await asyncio.to_thread(lambda: httpx.get(url))  # the sync client, in a thread (context copied)
            sc = caller.get_span_context()
        await httpx.AsyncClient().get(url)  # no current span: no header
        handle.shutdown()
        with attempt_context("r", "a", ListSink()), tracer.start_as_current_span("after"):
            async with httpx.AsyncClient() as client:
                await client.get(url)
    finally:
        server.should_exit = True
        await task
        sock.close()
    expected = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
    assert seen == [expected, expected, None, None]


def test_otlp_exporter_end_to_end_through_the_store_servers_traces_route(tmp_path):
    token = "s3cret"
    server = serve_in_thread(tmp_path / "store.db", token=token)
    tasks = [{"task_id": f"t{i}", "n": 3 + i} for i in range(6)]

    async def go() -> dict[str, list]:
        store = StoreClient(server.url, token=token)
        try:
            ids = await enqueue(store, tasks)

            async def spans_when_finished(rollout_id: str) -> list:
                # read the spans the moment the rollout is reported finished: the runner's force_flush must have
                # put them in the store already (the exporter alone would send them up to 200 ms later)
                (rollout,) = await store.wait([rollout_id], timeout_s=80)
                spans = await store.query_spans(rollout_id)
                assert rollout.status is RolloutStatus.SUCCEEDED
                return spans

            with run_runners(
                server.url, "otel_agents:tagged_spans", 1, 6, token, otel="otlp", max_rollouts=6, idle_exit_s=2
            ) as procs:
                spans = await asyncio.gather(*(spans_when_finished(rid) for rid in ids))
                assert procs.join(30)
            return dict(zip(ids, spans, strict=True))
        finally:
            await store.close()

    try:
        spans_by_rollout = asyncio.run(go())
    finally:
        server.stop()
    for task, (rollout_id, spans) in zip(tasks, spans_by_rollout.items(), strict=True):
        (root,) = [s for s in spans if s.name == Attr.SPAN_ROLLOUT]
        tagged = [s for s in spans if "test.task" in s.attributes]
        # finished only after a force_flush: all of them are stored, under the rollout that made them
        assert len(tagged) == task["n"] and {s.attributes["test.task"] for s in tagged} == {task["task_id"]}
        assert all(s.parent_id == root.span_id and s.trace_id == root.trace_id for s in tagged)
        assert all(s.rollout_id == rollout_id for s in tagged)


def test_the_runner_fails_fast_with_a_clear_message_without_opentelemetry(tmp_path):
    """A child interpreter where opentelemetry cannot be imported (a meta path finder refuses it)."""
    import subprocess
    import sys

    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('opentelemetry'): raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from lightrail import Runner, MemoryStore\n"
        "try:\n"
        "    Runner(MemoryStore(), lambda task: 1.0, otel=True)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'lightrail[otel]'" in out.stdout, out.stderr


def test_trainer_otel_stores_framework_spans_in_every_rollout():
    from rich.console import Console

    tasks = [Task(input={"task_id": f"t{i}", "n": i + 1}, task_id=f"t{i}") for i in range(4)]
    console = Console(file=open(os.devnull, "w"), width=200)  # noqa: SIM115 - closed with the process
    report = Trainer(n_runners=1, store=MemoryStore(), concurrency=4, otel=True, console=console).dev(
        "otel_agents:tagged_spans", tasks
    )
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 4
    assert [row.spans for row in report.rows] == [i + 1 + 2 for i in range(4)]  # n OTel spans + root + reward


def test_lightrail_runner_otel_flag(tmp_path, capsys, monkeypatch):
    from lightrail.agent.processes import RUNNER_ENV

    monkeypatch.setenv(RUNNER_ENV, "")  # the command marks its process as a runner: undone after the test
    code = main(["runner", "--store", str(tmp_path / "s.db"), "--agent", "otel_agents:tagged_spans", "--otel", "otlp"])
    assert code == 2 and "--otel otlp needs a store server URL" in capsys.readouterr().err
    code = main(["runner", "--store", str(tmp_path / "s.db"), "--agent", "otel_agents:tagged_spans", "--otel",
                 "--max-rollouts", "0"])  # fmt: skip
    assert code == 0 and otel.current() is not None and otel.current().exporter == "sink"
