"""Agents for the OpenTelemetry tests (importable by reference, so runner processes can load them too).

Each one writes OTel spans with the plain tracer API, tagged with the task id it was given (``test.task``), and
makes its LLM calls through the attempt's gateway route with the real openai client. The tests then check that
every tagged span landed in the rollout of that task, and that the gateway's call spans hang under the span that
made the call.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request

from openai import AsyncOpenAI, OpenAI
from opentelemetry import trace

from lightrail import emit_event, rollout
from lightrail.tracing.otel import traceparent
from lightrail.types import Attr

tracer = trace.get_tracer("lightrail.tests.otel_agents")  # a proxy until setup() installs the provider


async def _chain(task_id: str, depth: int, rng: random.Random) -> int:
    """``depth`` nested spans, yielding to other rollouts between them; returns how many were made."""
    if depth == 0:
        return 0
    with tracer.start_as_current_span(f"step-{depth}", attributes={"test.task": task_id}):
        await asyncio.sleep(rng.random() * 0.002)
        return 1 + await _chain(task_id, depth - 1, rng)


@rollout
async def two_agents(task, llm) -> float:
    """A ``planner`` (async, this task) and a ``solver`` (sync, in a worker thread) each make one LLM call inside
    their own agent span; both write a random number of nested spans. Emits ``otel_spans`` = how many OTel spans
    it wrote, so a test can count them in the store."""
    task_id, rng = task["task_id"], random.Random(task["seed"])
    client = AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    made = 0
    planner_attrs = {Attr.AGENT_NAME: f"planner-{task_id}", "test.task": task_id}
    with tracer.start_as_current_span("planner", attributes=planner_attrs):
        made += 1 + await _chain(task_id, rng.randint(1, 5), rng)
        with tracer.start_as_current_span("ask", attributes={"test.task": task_id}):
            made += 1
            await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task_id}])
    await client.close()
    made += await asyncio.to_thread(_solver, llm, task_id, rng.randint(0, 3))
    emit_event("otel_spans", n=made)
    return 1.0


def _solver(llm, task_id: str, extra: int) -> int:
    made = 0
    with tracer.start_as_current_span("solver", attributes={"agent.name": f"solver-{task_id}", "test.task": task_id}):
        made += 1
        for i in range(extra):
            with tracer.start_as_current_span(f"think-{i}", attributes={"test.task": task_id}):
                made += 1
        with OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"solve {task_id}"}])
    return made


@rollout
async def plain_openai(task, llm) -> float:
    """One chat call and no spans of its own: with the openai instrumentor on, its LLM span is the only
    framework span."""
    async with AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": str(task)}])
    return 1.0


@rollout
async def tagged_spans(task) -> float:
    """``task["n"]`` OTel spans tagged with the task id, interleaved with the other rollouts of the process (no LLM
    call: for the attribution benchmark and the OTLP test)."""
    task_id = task["task_id"]
    for i in range(task["n"]):
        with tracer.start_as_current_span(f"work-{i}", attributes={"test.task": task_id}):
            await asyncio.sleep(0.001)
    return 1.0


@rollout
def padded_role(task, llm) -> float:
    """A CrewAI-shaped agent whose role, read from YAML, ends in a newline: an OpenInference ``AGENT`` span given
    its ``graph.node.id`` after it starts, and two calls inside it: one by the openai client (the runner stamps the
    agent header), one by urllib, which sends only the ``traceparent`` it is given (the call is named from the
    spans)."""
    with tracer.start_as_current_span(
        "researcher._execute_core", attributes={"openinference.span.kind": "AGENT"}
    ) as agent:
        agent.set_attribute("graph.node.id", "Researcher\n")
        ask = [{"role": "user", "content": "research"}]
        with OpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            client.chat.completions.create(model=llm.model, messages=ask)
        headers = {"content-type": "application/json", "traceparent": traceparent() or ""}
        body = json.dumps({"model": llm.model, "messages": ask}).encode()
        request = urllib.request.Request(llm.endpoint + "/chat/completions", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
    return 1.0


@rollout
async def abandons_spans(task, llm) -> float:
    """Leaves spans open (what an abandoned stream's instrumentation does), one of them the current span of an LLM
    call, and ends one."""
    for i in range(3):
        tracer.start_span(f"abandoned-{i}", attributes={"test.task": task["task_id"]})  # never ended
    abandoned = tracer.start_span("abandoned-agent", attributes={"agent.name": "streamer"})
    with trace.use_span(abandoned, end_on_exit=False):
        async with AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0) as client:
            await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "x"}])
    with tracer.start_as_current_span("ended", attributes={"test.task": task["task_id"]}):
        await asyncio.sleep(0)
    return 1.0
