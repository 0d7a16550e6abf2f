"""Agents and a child-process entry for `bench/attribution.py` (importable by reference, so runner processes load
them too).

* `explicit_names`: a plain Python agent that names each call with lightrail's explicit API only, no tracer: an
  ``as_agent`` block, an ``LLM.endpoint_for`` client, and a raw ``httpx`` POST to the ``/agents/<name>/v1`` route
  (what a client in any language does). Each call says in its prompt which agent it is (``<agent>: ...``), so the
  benchmark can tell who made it without trusting the names under test.
* ``python bench/_attribution_agents.py genai N MODEL_DIR``: the OTel GenAI arm, in a process of its own (the
  OpenTelemetry setup is global, and ``OTEL_SDK_DISABLED`` is read once per process): the Agents SDK's triage agent
  and specialist of ``tests/tracing/test_genai_semconv.py``, traced only by OpenTelemetry's official GenAI
  instrumentations (``opentelemetry-instrumentation-openai-agents-v2`` and ``-openai-v2``; no OpenInference
  instrumentor, the SDK's own processors removed), run by an in-process `Runner` through the gateway over the
  embedded engine. Prints one JSON line: ``[[agent_name, made_by], ...]`` per call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
from openai import AsyncOpenAI

from lightrail import as_agent, rollout

EXPLICIT_AGENTS = ("proposer", "critic", "judge")


def _ask(agent: str, task: dict) -> list[dict]:
    return [{"role": "user", "content": f"{agent}: {task['question']}"}]


@rollout
async def explicit_names(task, llm) -> float:
    """Three agents of plain Python, each named by another form of the explicit API."""
    sampling = {"max_tokens": 16, **llm.sampling}
    async with AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0) as client:
        with as_agent("proposer"):
            await client.chat.completions.create(model=llm.model, messages=_ask("proposer", task), **sampling)
    async with AsyncOpenAI(base_url=llm.endpoint_for("critic"), api_key=llm.api_key or "none", max_retries=0) as c:
        await c.chat.completions.create(model=llm.model, messages=_ask("critic", task), **sampling)
    headers = {"authorization": f"Bearer {llm.api_key or 'none'}"}
    body = {"model": llm.model, "messages": _ask("judge", task), **sampling}
    async with httpx.AsyncClient(timeout=120) as http:  # no openai client, no header: the route alone names it
        answer = await http.post(llm.endpoint_for("judge") + "/chat/completions", json=body, headers=headers)
    answer.raise_for_status()
    return 1.0


def explicit_made_by(request: dict) -> str:
    """Which agent of `explicit_names` sent ``request`` (its prompt says so)."""
    return request["messages"][-1]["content"].split(":", 1)[0]


GENAI_INSTRUCTIONS = {"triage": "Hand the question off.", "specialist": "Look it up, then answer."}
"""The instructions of `tests.tracing.test_genai_semconv.triage_and_specialist`'s agents (its system prompts)."""


def genai_made_by(request: dict) -> str:
    system = request["messages"][0]["content"]
    (agent,) = [name for name, text in GENAI_INSTRUCTIONS.items() if text in system]
    return agent


async def _genai(n: int, model_dir: str, db: str) -> list[list[str | None]]:
    import agents
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    from lightrail import Runner
    from lightrail.adapters import build_episode
    from lightrail.engine import Engine
    from lightrail.gateway import GatewayServer
    from lightrail.store import SQLiteStore
    from lightrail.tracing import otel
    from lightrail.types import LLM, Attr, Resources, RolloutSpec, Task
    from tests.tracing.test_genai_semconv import triage_and_specialist

    handle = otel.setup(instrument=False)  # lightrail's provider, no OpenInference instrumentor
    agents.set_trace_processors([])  # the SDK's own processors upload to OpenAI
    instrumentors = [OpenAIAgentsInstrumentor(), OpenAIInstrumentor()]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=handle.provider)
    engine = await asyncio.to_thread(Engine.from_pretrained, model_dir)
    store = SQLiteStore(db)
    try:
        async with GatewayServer(engine, store, token="bench") as gateway:
            llm = LLM(endpoint=gateway.url, model="policy", api_key="bench", sampling={"max_tokens": 16})
            await store.put_resources(Resources(items={"llm": llm}))
            specs = [RolloutSpec(task=Task(input={"i": i}), resources_version=1) for i in range(n)]
            queued = await store.enqueue(specs)
            await Runner(store, triage_and_specialist, otel=True, handle_signals=False).run(max_rollouts=n)
        out = []
        for row in queued:
            by_attempt: dict[str, list] = {}
            for span in await store.query_spans(row.rollout_id):
                by_attempt.setdefault(span.attempt_id, []).append(span)
            for spans in by_attempt.values():  # a retried attempt's calls count too
                for call in build_episode(spans).calls:
                    out.append([call.agent_name, genai_made_by(call.span.attributes[Attr.REQUEST])])
        return out
    finally:
        for instrumentor in instrumentors:
            instrumentor.uninstrument()
        handle.shutdown()
        await store.close()
        await engine.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _, arm, count, model, database = sys.argv
    assert arm == "genai", arm
    print(json.dumps(asyncio.run(_genai(int(count), model, database))))
