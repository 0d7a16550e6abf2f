"""Attribution of LLM calls to agents when a framework's own tracing is switched off.

Users of non-OpenAI backends are told to switch the OpenAI Agents SDK's tracing off (``set_tracing_disabled``,
``RunConfig(tracing_disabled=True)``, ``OPENAI_AGENTS_DISABLE_TRACING``), since its default exporter uploads to
OpenAI. Inside lightrail's runners the SDK's trace processors are only lightrail's (OpenInference's exclusive
processor, never OpenAI's exporter), so lightrail keeps the SDK's spans flowing to itself and every call still names
the agent that made it.
"""

from __future__ import annotations

import pytest

from lightrail.adapters import build_episode
from lightrail.agent import Runner
from lightrail.gateway import ScriptedBackend, create_gateway_app
from lightrail.store import MemoryStore
from lightrail.tracing import otel
from lightrail.types import LLM, Resources, RolloutSpec, Task
from tests._frameworks import needs_agents_sdk, needs_langgraph
from tests.tracing.switch_agents import scripted
from tests.tracing.test_otel import serve

pytestmark = [needs_agents_sdk, needs_langgraph]


@pytest.fixture(autouse=True)
def otel_off():
    from agents import set_tracing_disabled

    set_tracing_disabled(False)  # the SDK's default, whatever an earlier test in this process left
    yield
    handle = otel.current()
    if handle is not None:
        handle.shutdown()
    set_tracing_disabled(False)


@pytest.mark.parametrize("switch", ["on", "global", "run"])
async def test_agents_sdk_calls_name_their_agent_with_tracing_switched_off(switch, monkeypatch):
    store = MemoryStore()
    otel.setup(instrument=["openai_agents"])
    async with serve(create_gateway_app(ScriptedBackend(scripted), store)) as url:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=url + "/v1", model="scripted")}))
        specs = [RolloutSpec(task=Task(input={"switch": switch, "question": f"q{i}"})) for i in range(2)]
        ids = [r.rollout_id for r in await store.enqueue(specs)]
        runner = Runner(store, "tests.tracing.switch_agents:triage_and_specialist", otel=True, handle_signals=False)
        stats = await runner.run(max_rollouts=2)
    assert stats.ended["succeeded"] == 2, stats
    for rollout_id in ids:
        episode = build_episode(await store.query_spans(rollout_id))
        assert episode.final_reward == 1.0
        assert [c.agent_name for c in episode.calls] == ["triage", "specialist", "specialist"]

    from agents.tracing import get_trace_provider
    from agents.tracing.traces import NoOpTrace

    provider = get_trace_provider()
    outside = provider.create_trace("outside an attempt")  # the user's switch still holds outside attempts
    assert isinstance(outside, NoOpTrace) is (switch == "global")
    otel.current().shutdown()
    assert provider._disabled is (switch == "global")  # and is the SDK's own flag again after shutdown


def test_an_uploading_processor_keeps_the_switch_and_warns_once(caplog):
    """If a processor that uploads to OpenAI is registered, lightrail does not turn tracing back on for it."""
    from agents import add_trace_processor, set_tracing_disabled
    from agents.tracing import get_trace_provider
    from agents.tracing.processors import BackendSpanExporter, BatchTraceProcessor
    from agents.tracing.traces import NoOpTrace

    from lightrail.tracing import ListSink, attempt_context

    otel.setup(instrument=["openai_agents"])
    set_tracing_disabled(True)
    uploader = BatchTraceProcessor(BackendSpanExporter(api_key="sk-never-used"))
    add_trace_processor(uploader)
    try:
        with attempt_context("ro-1", "at-1", ListSink()):
            first = get_trace_provider().create_trace("inside")
            second = get_trace_provider().create_trace("inside again")
        assert isinstance(first, NoOpTrace) and isinstance(second, NoOpTrace)
        warnings = [r for r in caplog.records if "uploads to OpenAI" in r.getMessage()]
        assert len(warnings) == 1 and "set_tracing_disabled" in warnings[0].getMessage()
    finally:
        uploader.shutdown()


_SWITCHES_OFF = {
    # LangChain / LangSmith tracing switches (LangSmith only: lightrail's LangChain instrumentation is a callback)
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
    # CrewAI's telemetry switches; OTEL_SDK_DISABLED would also turn any OpenTelemetry SDK provider into a no-op
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    # AutoGen's own runtime tracing (autogen-core); lightrail's AutoGen instrumentation does not use it
    "AUTOGEN_DISABLE_RUNTIME_TRACING": "true",
    "OPENAI_AGENTS_DISABLE_TRACING": "true",
}


@pytest.mark.parametrize(
    ("agent", "instrument", "expected"),
    [
        ("tests.tracing.switch_agents:write_then_check", ["langchain"], ["write", "check"]),
        (
            "tests.tracing.switch_agents:triage_and_specialist",
            ["openai_agents"],
            ["triage", "specialist", "specialist"],
        ),
    ],
)
def test_calls_name_their_agent_with_every_tracing_variable_switched_off(agent, instrument, expected):
    """Switches read from the environment once per process (OTEL_SDK_DISABLED, OPENAI_AGENTS_DISABLE_TRACING):
    a fresh process with all of them set."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, **_SWITCHES_OFF, "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests' / 'tracing'}"}
    task = {"switch": "on", "question": "q"}  # the switches are the environment's
    script = (
        "import asyncio, json; from tests.tracing.switch_agents import agent_names; "
        f"print(json.dumps(asyncio.run(agent_names({agent!r}, {instrument!r}, {task!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=root, env=env, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [expected, expected]
