"""`semconv.normalize` names agents the way users name them in `AgentFilter` (``agents: [writer]``): an
OpenInference ``AGENT`` span's ``graph.node.id`` (the bare agent name) before its span name."""

from __future__ import annotations

import pytest

from lightrail.tracing.semconv import normalize
from lightrail.types import Attr

AGENT = {"openinference.span.kind": "AGENT"}


@pytest.mark.parametrize(
    ("span_name", "framework_attributes", "agent"),
    [
        ("writer._execute_core", {**AGENT, "graph.node.id": "writer"}, "writer"),  # CrewAI (role)
        ("solver.on_messages_stream", {**AGENT, "graph.node.id": "solver"}, "solver"),  # AutoGen AgentChat
        ("triage", {**AGENT, "graph.node.id": "triage"}, "triage"),  # OpenAI Agents SDK
        ("planner", dict(AGENT), "planner"),  # an AGENT span that names nothing else: its span name
        ("x.run", {**AGENT, "graph.node.id": "x", "agent.name": "named"}, "named"),  # agent.name is explicit
        ("x.run", {**AGENT, "graph.node.id": "x", Attr.AGENT_NAME: "kept"}, "kept"),  # never overwritten
        # a CrewAI role from YAML: the name the runner's header sends, without its newline
        ("researcher._execute_core", {**AGENT, "graph.node.id": "Researcher\n"}, "Researcher"),
        (" critic ", dict(AGENT), "critic"),
        ("x.run", {**AGENT, "graph.node.id": "a\x00b"}, "x.run"),  # names no agent: the next candidate
    ],
)
def test_agent_spans_are_named_by_their_node_id_before_their_span_name(span_name, framework_attributes, agent):
    attributes = normalize(span_name, dict(framework_attributes))
    assert attributes[Attr.AGENT_NAME] == agent and attributes[Attr.KIND] == "agent"


def test_graph_node_id_of_a_span_that_is_not_an_agent_names_no_agent():
    attributes = normalize("step", {"openinference.span.kind": "CHAIN", "graph.node.id": "step-3"})
    assert Attr.AGENT_NAME not in attributes


@pytest.mark.parametrize(
    "output",
    [
        '{"id": "chatcmpl-1", "choices": []}',  # the openai instrumentor: the OpenAI response itself
        # LangChain's LLMResult: the provider's id under llm_output (its message ids are LangChain run ids)
        '{"generations": [[{"message": {"kwargs": {"id": "lc_run--x"}}}]], "llm_output": {"id": "chatcmpl-1"}}',
    ],
)
def test_llm_spans_carry_the_provider_response_id(output):
    attributes = normalize("ChatOpenAI", {"openinference.span.kind": "LLM", "output.value": output})
    assert attributes[Attr.GENAI_RESPONSE_ID] == "chatcmpl-1"
