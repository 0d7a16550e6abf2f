"""Spans → transitions: ids from the engine only, turns, n>1 choices, agent selection, counted skips."""

from __future__ import annotations

import math

import pytest
from adapter_spans import AID, RID, llm_call, reward, span

from lightrail.adapters import AgentFilter, Identical, build_episode, spans_to_transitions
from lightrail.types import Attr


def test_one_transition_per_call_with_engine_ids():
    spans = [
        llm_call("a", [1, 2], [3, 4], version=7, agent="solver"),
        llm_call("b", [1, 2, 3, 4, 5], [6], logprobs=[[-0.25]]),
        reward(1.0),
    ]
    transitions, report = spans_to_transitions(spans, credit=Identical())
    a, b = transitions
    assert (a.rollout_id, a.attempt_id) == (RID, AID)
    assert a.prompt_ids == [1, 2] and a.response_ids == [3, 4] and a.logprobs == [-0.5, -0.5]
    assert a.policy_version == 7 and a.agent_name == "solver" and a.turn == 0
    assert a.metadata == {"response_id": "a", "choice": 0, "finish_reason": "stop"}
    assert b.turn == 1 and b.logprobs == [-0.25] and b.agent_name is None
    assert a.advantage is None and a.reward == b.reward == 1.0
    assert report.calls == 2 and report.transitions == 2 and report.missing_token_ids == 0
    # no copies: the transition shares the span's lists
    assert a.prompt_ids is spans[0].attributes[Attr.PROMPT_IDS]


def test_turn_order_is_gateway_seq_not_list_order():
    spans = [llm_call("late", [9], [9], seq=50), llm_call("early", [1], [1], seq=10)]
    transitions, _ = spans_to_transitions(spans)
    assert [(t.turn, t.metadata["response_id"]) for t in transitions] == [(0, "early"), (1, "late")]


def test_n_choices_give_one_transition_each_on_the_same_turn():
    transitions, report = spans_to_transitions([llm_call("a", [1], [2], [3, 3]), reward(0.5)])
    assert [(t.turn, t.metadata["choice"], t.response_ids) for t in transitions] == [(0, 0, [2]), (0, 1, [3, 3])]
    assert report.choices == 2 and report.transitions == 2


def test_calls_without_ids_are_skipped_and_counted_but_keep_their_turn():
    spans = [
        llm_call("a", [1], [2]),
        llm_call("b", [1, 2, 5], [6], available=False),  # backend could not report ids
        llm_call("c", None, [7]),  # prompt ids missing
        llm_call("d", [1, 2, 5, 6, 7], None, [8]),  # first choice without ids
    ]
    transitions, report = spans_to_transitions(spans)
    assert [(t.turn, t.metadata["response_id"], t.metadata["choice"]) for t in transitions] == [
        (0, "a", 0),
        (3, "d", 1),
    ]
    assert report.missing_token_ids == 3 and report.transitions == 2


def test_abandoned_calls_take_no_turn_and_are_never_trained():
    # an agent timed out on "a" (the gateway cancelled it: no ids, or ids that had just been generated) and retried
    gone = llm_call("a", [1], [2])
    gone.attributes[Attr.ABANDONED] = True
    spans = [gone, llm_call("retry", [1], [3]), reward(1.0)]
    episode = build_episode(spans)
    assert [(c.turn, c.response_id) for c in episode.calls] == [(0, "retry")]
    transitions, report = spans_to_transitions(spans)
    assert [(t.turn, t.metadata["response_id"]) for t in transitions] == [(0, "retry")]
    assert report.abandoned == 1 and report.calls == 1 and report.transitions == 1


def test_bad_logprobs_are_dropped_not_the_transition():
    spans = [
        llm_call("a", [1], [2, 3], logprobs=[[-0.1]]),  # wrong length
        llm_call("b", [1], [2], logprobs=[[math.nan]]),
        llm_call("c", [1], [2], logprobs=[[-math.inf]]),
        llm_call("d", [1], [2], logprobs=[None]),
        llm_call("e", [1], [2], logprobs=[[-0.3]]),
    ]
    transitions, report = spans_to_transitions(spans)
    assert [t.logprobs for t in transitions] == [None, None, None, None, [-0.3]]
    assert report.missing_logprobs == 4


def test_agent_selection_by_name_and_regex():
    spans = [
        llm_call("a", [1], [2], agent="planner"),
        llm_call("b", [1], [2], agent="coder-1"),
        llm_call("c", [1], [2], agent="coder-x"),
        llm_call("d", [1], [2]),
        reward(1.0),
    ]
    by_name, report = spans_to_transitions(spans, agents=AgentFilter(names={"planner"}))
    assert [t.metadata["response_id"] for t in by_name] == ["a"]
    assert report.not_selected == 3
    by_regex, _ = spans_to_transitions(spans, agents=AgentFilter(pattern=r"coder-\d+"))
    assert [(t.metadata["response_id"], t.turn) for t in by_regex] == [("b", 1)]  # other calls still count as turns
    both, _ = spans_to_transitions(spans, agents=AgentFilter(names={"planner"}, pattern="coder-.*"))
    assert [t.metadata["response_id"] for t in both] == ["a", "b", "c"]
    unnamed, _ = spans_to_transitions(spans, agents=AgentFilter(include_unnamed=True))
    assert [t.metadata["response_id"] for t in unnamed] == ["d"]


def test_agent_name_from_nearest_ancestor():
    root = span("invoke_agent", {"gen_ai.agent.name": "outer"})
    node = span("node", {"langgraph.node": "solver"}, parent_id=root.span_id)
    plain = span("chain", {}, parent_id=node.span_id)
    oi_agent = span("researcher", {"openinference.span.kind": "AGENT"})
    spans = [
        root,
        node,
        plain,
        oi_agent,
        llm_call("a", [1], [2], parent_id=plain.span_id),  # plain → node (langgraph.node)
        llm_call("b", [1], [2], parent_id=root.span_id),
        llm_call("c", [1], [2], parent_id=plain.span_id, agent="own"),  # its own attribute wins
        llm_call("d", [1], [2], parent_id=oi_agent.span_id),  # OpenInference AGENT span: its name
        llm_call("e", [1], [2], parent_id="not-in-this-attempt"),
    ]
    e = build_episode(spans)
    assert [c.agent_name for c in e.calls] == ["solver", "outer", "own", "researcher", None]
    transitions, _ = spans_to_transitions(spans, agents=AgentFilter(names={"solver"}))
    assert [t.metadata["response_id"] for t in transitions] == ["a"]


def test_the_name_a_call_carried_wins_over_its_ancestors():
    """`Attr.CALLER_AGENT` (the gateway's record of the route's or header's name: what picked the call's policy)
    comes before the ancestor walk; a name on the call span itself before both."""
    node = span("node", {"langgraph.node": "solver"})
    spans = [
        node,
        llm_call("a", [1], [2], parent_id=node.span_id, caller="carried"),
        llm_call("b", [1], [2], parent_id=node.span_id, agent="own", caller="x"),
        llm_call("c", [1], [2], parent_id=node.span_id),
    ]
    assert [c.agent_name for c in build_episode(spans).calls] == ["carried", "own", "solver"]


def test_genai_spans_of_other_operations_name_an_agent_only_when_no_ancestor_does():
    """Instrumentations copy (or default) ``gen_ai.agent.name`` onto chat and tool spans; the ``invoke_agent`` span
    above names the agent. A span with both conventions reads as OpenInference."""
    agent = span("invoke_agent triage", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "triage"})
    defaulted = {"gen_ai.operation.name": "chat", "gen_ai.agent.name": "OpenAI Agent"}
    chat = span("chat m", defaulted, parent_id=agent.span_id)
    lone_chat = span("chat m", dict(defaulted))
    both = span("ChatCompletion", {"openinference.span.kind": "LLM", **defaulted, "gen_ai.agent.name": "oi"})
    spans = [
        agent,
        chat,
        lone_chat,
        both,
        llm_call("a", [1], [2], parent_id=chat.span_id),
        llm_call("b", [1], [2], parent_id=lone_chat.span_id),
        llm_call("c", [1], [2], parent_id=both.span_id),
    ]
    assert [c.agent_name for c in build_episode(spans).calls] == ["triage", "OpenAI Agent", "oi"]


def test_names_read_from_spans_are_spelled_as_the_header_sends_them():
    """A name with surrounding whitespace (a CrewAI role from YAML ends in a newline) is the name without, as the
    runner's header stamps send it; a value that names no agent (blank, control characters inside, too long) is
    passed over for the next span up."""
    node = span("node", {"langgraph.node": "solver"})
    role = span("researcher._execute_core", {"graph.node.id": "Researcher\n"}, parent_id=node.span_id)
    oi_agent = span(" critic\n", {"openinference.span.kind": "AGENT"})
    blank = span("x", {"gen_ai.agent.name": "  "}, parent_id=node.span_id)
    broken = span("x", {"agent.name": "a\x00b"}, parent_id=node.span_id)
    long = span("x", {"agent.name": "x" * 201}, parent_id=node.span_id)
    spans = [
        node, role, oi_agent, blank, broken, long,
        llm_call("a", [1], [2], parent_id=role.span_id),
        llm_call("b", [1], [2], parent_id=node.span_id, caller="Researcher"),  # by the header
        llm_call("c", [1], [2], parent_id=oi_agent.span_id),
        llm_call("d", [1], [2], parent_id=blank.span_id),
        llm_call("e", [1], [2], parent_id=broken.span_id),
        llm_call("f", [1], [2], parent_id=long.span_id),
        llm_call("g", [1], [2], agent="writer\n"),
    ]  # fmt: skip
    names = ["Researcher", "Researcher", "critic", "solver", "solver", "solver", "writer"]
    assert [c.agent_name for c in build_episode(spans).calls] == names


def test_agent_name_from_the_framework_span_of_the_same_response():
    """A framework whose spans are not the current context during the HTTP call (no traceparent reaches the
    gateway) still names the call: its own LLM span recorded the response id."""
    agent = span("writer", {"openinference.span.kind": "AGENT"})
    framework_llm = span(
        "ChatCompletion", {"lightrail.kind": "llm", "gen_ai.response.id": "b"}, parent_id=agent.span_id
    )
    noted = span("ChatCompletion", {"gen_ai.response.id": "c", "gen_ai.agent.name": "critic"})
    spans = [agent, framework_llm, noted, llm_call("a", [1], [2]), llm_call("b", [1], [2]), llm_call("c", [1], [2])]
    assert [c.agent_name for c in build_episode(spans).calls] == [None, "writer", "critic"]
    # a second framework span of call b without an agent (the openai client's, under LangChain's): any order
    unnamed_twin = span("ChatCompletion", {"gen_ai.response.id": "b"})
    for ordered in ([*spans, unnamed_twin], [unnamed_twin, *spans], list(reversed([*spans, unnamed_twin]))):
        assert [c.agent_name for c in build_episode(ordered).calls] == [None, "writer", "critic"]


def test_parent_cycle_does_not_hang():
    a = span("x", {}, span_id="s1", parent_id="s2")
    b = span("y", {}, span_id="s2", parent_id="s1")
    e = build_episode([a, b, llm_call("r", [1], [2], parent_id="s1")])
    assert e.calls[0].agent_name is None


def test_exceptions_counted_and_attempts_not_mixed():
    e = build_episode([llm_call("a", [1], [2]), span(Attr.SPAN_EXCEPTION, {Attr.EXCEPTION_TYPE: "KeyError"})])
    assert e.report.exceptions == 1
    with pytest.raises(ValueError, match="several attempts"):
        build_episode([llm_call("a", [1], [2]), llm_call("b", [1], [2], attempt_id="other")])
    empty = build_episode([], rollout_id="r", attempt_id="x")
    assert empty.calls == [] and empty.final_reward is None
