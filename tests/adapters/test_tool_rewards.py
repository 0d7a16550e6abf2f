"""Automatic intermediate rewards from tool outcomes: conversation, tool spans, unanswered calls."""

from __future__ import annotations

import pytest
from adapter_spans import llm_call, reward, tool_span

from lightrail.adapters import PerTurn, ToolRewardRule, build_episode, looks_like_error, spans_to_transitions
from lightrail.types import SpanStatus, StatusCode

RULE = ToolRewardRule(success=0.1, error=-0.1, unanswered=-0.3)


def tool_msg(call_id: str, content) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def conversation():
    """a asks for t1 (ok) and t2 (error); b asks for t3 (never answered); c ends the episode."""
    user = {"role": "user", "content": "do it"}
    asked_a = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}, {"id": "t2"}]}
    asked_b = {"role": "assistant", "content": None, "tool_calls": [{"id": "t3"}]}
    history_b = [user, asked_a, tool_msg("t1", "42"), tool_msg("t2", "Traceback (most recent call last): ...")]
    return [
        llm_call("a", [1], [2], tool_calls=[("t1", "calc"), ("t2", "search")], messages=[user]),
        llm_call("b", [1, 2, 3], [4], tool_calls=[("t3", "calc")], messages=history_b),
        # c's history repeats t1/t2: each tool result is classified once
        llm_call("c", [1, 2, 3, 4, 5], [6], messages=[*history_b, asked_b]),
        reward(1.0),
    ]


def test_from_the_conversation():
    e = build_episode(conversation(), tool_rewards_rule=RULE)
    assert [(r.value, r.response_id, r.name, r.source) for r in e.intermediate] == [
        (0.1, "a", "tool_success:calc", "tool"),
        (-0.1, "a", "tool_error:search", "tool"),
        (-0.3, "b", "tool_unanswered:calc", "tool"),
    ]
    assert (e.report.tool_success, e.report.tool_error, e.report.tool_unanswered) == (1, 1, 1)
    transitions, _ = spans_to_transitions(conversation(), credit=PerTurn(), tool_rewards=RULE)
    assert [t.reward for t in transitions] == pytest.approx([1.0, 0.7, 1.0])


def test_unanswered_without_reward_is_only_counted():
    e = build_episode(conversation(), tool_rewards_rule=ToolRewardRule())
    assert [r.value for r in e.intermediate] == [0.1, -0.1]
    assert e.report.tool_unanswered == 1


def test_tool_spans_win_over_messages_and_link_by_call_id():
    spans = [
        *conversation(),
        tool_span("t1", error=True),  # the span says t1 failed, whatever its message said
        tool_span("t3", genai=True),  # t3 ran fine, its result just never reached the model
        tool_span("t9"),  # no LLM response asked for t9
        tool_span(None),  # no call id at all
    ]
    e = build_episode(spans, tool_rewards_rule=RULE)
    assert [(r.value, r.response_id) for r in e.intermediate] == [(-0.1, "a"), (-0.1, "a"), (0.1, "b")]
    assert (e.report.tool_success, e.report.tool_error, e.report.tool_unanswered, e.report.tool_unlinked) == (
        1,
        2,
        0,
        2,
    )


def test_a_tool_span_with_unset_status_leaves_the_outcome_to_the_message():
    """AutoGen leaves a tool span's status unset when the tool *returns* error text: the span only says the tool
    ran, so the message decides (t2's traceback is an error), and a tool with no message counts as a success."""
    spans = [*conversation(), unset_tool_span("t2"), unset_tool_span("t3")]
    e = build_episode(spans, tool_rewards_rule=RULE)
    assert [(r.value, r.response_id) for r in e.intermediate] == [(0.1, "a"), (-0.1, "a"), (0.1, "b")]
    assert (e.report.tool_success, e.report.tool_error, e.report.tool_unanswered) == (2, 1, 0)


def test_the_latest_span_of_a_retried_tool_decides():
    spans = [*conversation(), tool_span("t1", error=True, seq=10**20), tool_span("t1", seq=10**20 + 1)]
    assert [r.value for r in build_episode(spans, tool_rewards_rule=RULE).intermediate][0] == 0.1
    retried_unset = unset_tool_span("t1")
    retried_unset.seq = 10**20 + 2
    spans = [*conversation(), tool_span("t1", error=True, seq=10**20), retried_unset]
    assert [r.value for r in build_episode(spans, tool_rewards_rule=RULE).intermediate][0] == 0.1  # message: "42"


def unset_tool_span(call_id: str):
    unset = tool_span(call_id)
    unset.status = SpanStatus(code=StatusCode.UNSET)
    return unset


def test_sources_can_be_switched_off():
    spans = [*conversation(), tool_span("t3")]
    only_spans = build_episode(spans, tool_rewards_rule=ToolRewardRule(from_messages=False))
    assert [(r.name, r.response_id) for r in only_spans.intermediate] == [("tool_success:calc", "b")]
    assert only_spans.report.tool_unanswered == 2
    only_messages = build_episode(spans, tool_rewards_rule=ToolRewardRule(from_spans=False))
    assert only_messages.report.tool_unanswered == 1 and only_messages.report.tool_unlinked == 0


def test_custom_predicate_and_content_parts():
    user = {"role": "user", "content": "x"}
    spans = [
        llm_call("a", [1], [2], tool_calls=[("t1", "f")], messages=[user]),
        llm_call("b", [1, 2], [3], messages=[user, tool_msg("t1", [{"type": "text", "text": "FAILED: no"}])]),
    ]
    default = build_episode(spans, tool_rewards_rule=RULE)
    assert default.report.tool_success == 1
    custom = build_episode(spans, tool_rewards_rule=ToolRewardRule(is_error=lambda s: s.startswith("FAILED")))
    assert custom.report.tool_error == 1


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Error: file not found", True),
        ("ValueError: bad input", True),
        ("  [ERROR] timeout", True),
        ("exception raised", True),
        ("Traceback (most recent call last):", True),
        ("42", False),
        ("errors found: 0", False),
        ("no error", False),
        ("", False),
    ],
)
def test_default_error_predicate(text, error):
    assert looks_like_error(text) is error
