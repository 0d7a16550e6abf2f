"""OpenTelemetry GenAI semantic conventions (``gen_ai.operation.name``, ``gen_ai.agent.name``, ``gen_ai.tool.name``)
read for attribution next to OpenInference, from a runner's in-process tracing and from OTLP ingest alike.

The spans come from the official GenAI instrumentations, not from hand-built spans: OpenTelemetry's OpenAI Agents
instrumentation (``invoke_agent``, ``chat``, ``execute_tool``, ``agent_handoff`` spans for an OpenAI Agents SDK run)
and its OpenAI instrumentation (``chat`` spans of the openai client, with ``gen_ai.response.id``). The Agents one
stamps its configured default agent name (``OpenAI Agent``) on every span, the real name only on ``invoke_agent``
spans (and only at their end): each call must still be trained under the agent that made it. Everything else is
real too: the Agents SDK with a triage agent handing off to a specialist that uses a tool, the gateway over the
`ScriptedBackend` fake model, a runner, a SQLite store (behind a store server for OTLP).
"""

from __future__ import annotations

import msgspec
import pytest
from openai import AsyncOpenAI

from lightrail import Runner, rollout
from lightrail.adapters import build_episode
from lightrail.adapters.rewards import is_tool_span
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import SQLiteStore, StoreClient
from lightrail.store.server import serve_in_thread
from lightrail.tracing import otel
from lightrail.types import LLM, Attr, Resources, RolloutSpec, Task
from tests.tracing.switch_agents import scripted

agents = pytest.importorskip("agents")
openai_agents_v2 = pytest.importorskip("opentelemetry.instrumentation.openai_agents")
openai_v2 = pytest.importorskip("opentelemetry.instrumentation.openai_v2")


@rollout
async def triage_and_specialist(task, llm) -> float:
    from agents import Agent, OpenAIChatCompletionsModel, function_tool
    from agents import Runner as AgentsRunner

    @function_tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"facts about {topic}"

    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0)
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
    specialist = Agent(name="specialist", instructions="Look it up, then answer.", model=model, tools=[lookup])
    triage = Agent(name="triage", instructions="Hand the question off.", model=model, handoffs=[specialist])
    result = await AgentsRunner.run(triage, "tides?", max_turns=6)
    await client.close()
    return float(result.final_output == "done")


@pytest.fixture
def genai_instrumented():
    """``setup(exporter, store_url, token)``: lightrail's OTel with no OpenInference instrumentor, and the two GenAI
    instrumentations on its provider (the Agents SDK's own processors, which upload to OpenAI, removed meanwhile)."""
    provider = agents.tracing.get_trace_provider()
    before = list(provider._multi_processor._processors)
    instrumentors = [openai_agents_v2.OpenAIAgentsInstrumentor(), openai_v2.OpenAIInstrumentor()]

    def setup(**kwargs):
        handle = otel.setup(instrument=False, **kwargs)
        agents.set_trace_processors([])
        for instrumentor in instrumentors:
            instrumentor.instrument(tracer_provider=handle.provider)
        return handle

    yield setup
    for instrumentor in instrumentors:
        instrumentor.uninstrument()
    if (handle := otel.current()) is not None:
        handle.shutdown()
    agents.set_trace_processors(before)


async def _run(store, reader) -> list:
    async with GatewayServer(ScriptedBackend(scripted), store, token="gw") as gateway:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key="gw")}))
        (queued,) = await store.enqueue([RolloutSpec(task=Task(input={}), resources_version=1)])
        stats = await Runner(store, triage_and_specialist, otel=True, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1, stats
    return await reader.query_spans(queued.rollout_id)


def _check(spans) -> None:
    episode = build_episode(spans)
    assert episode.final_reward == 1.0
    expected = ["triage", "specialist", "specialist"]
    assert [c.agent_name for c in episode.calls] == expected
    assert [c.span.attributes.get(Attr.CALLER_AGENT) for c in episode.calls] == expected  # named while made
    # and from the spans alone (an OTLP exporter in another process sends no header): the walk up from each call
    unnamed = [
        msgspec.structs.replace(s, attributes={k: v for k, v in s.attributes.items() if k != Attr.CALLER_AGENT})
        for s in spans
    ]
    assert [c.agent_name for c in build_episode(unnamed).calls] == expected
    by_kind: dict[str, list] = {}
    for s in spans:
        by_kind.setdefault(s.attributes.get(Attr.KIND), []).append(s)
    agents_seen = {s.attributes.get(Attr.AGENT_NAME) for s in by_kind["agent"]}
    assert {"triage", "specialist"} <= agents_seen  # invoke_agent spans name the agent they are
    (tool,) = by_kind["tool"]  # execute_tool: read once, as a tool span
    assert tool.attributes[Attr.TOOL_NAME] == "lookup" and is_tool_span(tool)
    chat_ids = {s.attributes.get(Attr.GENAI_RESPONSE_ID) for s in by_kind["llm"]}
    assert {c.response_id for c in episode.calls} <= chat_ids  # the openai instrumentation's chat spans


async def test_genai_spans_of_a_runner_in_process_name_every_call(tmp_path, genai_instrumented):
    genai_instrumented()
    store = SQLiteStore(tmp_path / "store.db")
    try:
        _check(await _run(store, store))
    finally:
        await store.close()


async def test_genai_spans_through_otlp_ingest_name_every_call(tmp_path, genai_instrumented):
    server = serve_in_thread(tmp_path / "store.db", token="s3cret")
    store = StoreClient(server.url, token="s3cret")
    try:
        genai_instrumented(exporter="otlp", store_url=server.url, token="s3cret")
        spans = await _run(store, store)
        assert any(s.attributes.get(Attr.ROLLOUT_ID) for s in spans if s.attributes.get(Attr.KIND) == "agent")
        _check(spans)
    finally:
        await store.close()
        server.stop()
