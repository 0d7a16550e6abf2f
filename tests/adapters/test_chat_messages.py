"""Spans → chat conversations (for SFT): request messages + the answer of each choice."""

from __future__ import annotations

from adapter_spans import llm_call, span

from lightrail.adapters import spans_to_messages
from lightrail.types import Attr


def test_conversation_per_choice_in_turn_order():
    system = {"role": "system", "content": "be brief"}
    user = {"role": "user", "content": "2+2?"}
    first = llm_call("a", [1], [2], tool_calls=[("t1", "calc")], messages=[system, user], agent="solver", seq=5)
    first.attributes[Attr.REQUEST]["tools"] = [{"type": "function", "function": {"name": "calc"}}]
    first.attributes[Attr.RESPONSE]["choices"][0]["message"]["refusal"] = None  # dropped: not a chat field
    tool = {"role": "tool", "tool_call_id": "t1", "content": "4"}
    asked = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]}
    second = llm_call("b", [1, 2], [3], [4], messages=[system, user, asked, tool], seq=9)
    completion = span(Attr.SPAN_LLM_CALL, {Attr.ENDPOINT: "completions", Attr.REQUEST: {"prompt": "x"}}, seq=12)
    samples = spans_to_messages([second, completion, first])

    assert [(s.turn, s.choice, s.response_id) for s in samples] == [(0, 0, "a"), (1, 0, "b"), (1, 1, "b")]
    a = samples[0]
    assert a.messages == [
        system,
        user,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}],
        },
    ]
    assert a.tools == [{"type": "function", "function": {"name": "calc"}}]
    assert a.agent_name == "solver" and a.finish_reason == "tool_calls"
    assert samples[1].messages[:-1] == [system, user, asked, tool]
    assert samples[1].messages[-1] == {"role": "assistant", "content": "answer b/0"}
    assert samples[2].messages[-1] == {"role": "assistant", "content": "answer b/1"}
    # the request's list itself is not modified
    assert len(second.attributes[Attr.REQUEST]["messages"]) == 4
