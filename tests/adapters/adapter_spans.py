"""Hand-built spans for the adapter tests: one attempt's LLM calls, rewards, tool and framework spans."""

from __future__ import annotations

import itertools
from typing import Any

from lightrail.types import Attr, Span, SpanStatus, StatusCode

RID, AID = "ro-1", "at-1"
_seq = itertools.count(1)


def span(name: str, attributes: dict[str, Any] | None = None, **kw: Any) -> Span:
    """A span of attempt (RID, AID) with the next sequence number unless ``seq`` is given."""
    kw.setdefault("seq", next(_seq))
    kw.setdefault("rollout_id", RID)
    kw.setdefault("attempt_id", AID)
    return Span(name=name, attributes=attributes or {}, **kw)


def llm_call(
    response_id: str,
    prompt_ids: list[int] | None,
    *responses: list[int] | None,
    logprobs: list[list[float] | None] | None = None,
    agent: str | None = None,
    caller: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    tool_calls: list[tuple[str, str]] | None = None,
    available: bool = True,
    version: int | None = 1,
    **kw: Any,
) -> Span:
    """An LLM-call span as the gateway writes it; one choice per ``responses`` entry.

    ``tool_calls`` are (id, function name) pairs on the first choice's message. Logprobs default to
    ``-0.5`` per token.
    """
    if logprobs is None:
        logprobs = [None if r is None else [-0.5] * len(r) for r in responses]
    choices = [
        {"token_ids": r, "logprobs": lp, "finish_reason": "tool_calls" if tool_calls else "stop"}
        for r, lp in zip(responses, logprobs, strict=True)
    ]
    out_messages = []
    for i, _ in enumerate(responses):
        message: dict[str, Any] = {"role": "assistant", "content": f"answer {response_id}/{i}"}
        if tool_calls and i == 0:
            message["content"] = None
            message["tool_calls"] = [
                {"id": tc_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
                for tc_id, name in tool_calls
            ]
        out_messages.append(message)
    attributes: dict[str, Any] = {
        Attr.REQUEST: {"model": "m", "messages": messages or [{"role": "user", "content": "hi"}]},
        Attr.RESPONSE: {
            "id": response_id,
            "object": "chat.completion",
            "choices": [
                {"index": i, "message": m, "finish_reason": choices[i]["finish_reason"], "logprobs": None}
                for i, m in enumerate(out_messages)
            ],
        },
        Attr.ENDPOINT: "chat.completions",
        Attr.PROMPT_IDS: prompt_ids,
        Attr.CHOICES: choices,
        Attr.TOKEN_IDS_AVAILABLE: available,
        Attr.POLICY_VERSION: version,
        Attr.RESPONSE_ID: response_id,
    }
    if agent is not None:
        attributes[Attr.AGENT_NAME] = agent
    if caller is not None:  # the name the call carried (route or header), as the gateway records it
        attributes[Attr.CALLER_AGENT] = caller
    return span(Attr.SPAN_LLM_CALL, attributes, **kw)


def reward(value: float, *, final: bool | None = True, linked: str | None = None, **kw: Any) -> Span:
    """A reward span as the runner's emitter writes it."""
    attributes: dict[str, Any] = {Attr.REWARD: value}
    if final is not None:
        attributes[Attr.REWARD_FINAL] = final
    if linked is not None:
        attributes[Attr.LINKED_RESPONSE_ID] = linked
    return span(Attr.SPAN_REWARD, attributes, **kw)


def tool_span(call_id: str | None, *, error: bool = False, genai: bool = False, **kw: Any) -> Span:
    """A framework's tool-execution span (OpenInference, or GenAI semconv with ``genai=True``)."""
    attributes: dict[str, Any] = (
        {"gen_ai.operation.name": "execute_tool"} if genai else {"openinference.span.kind": "TOOL"}
    )
    if call_id is not None:
        attributes["gen_ai.tool.call.id"] = call_id
    status = SpanStatus(code=StatusCode.ERROR if error else StatusCode.OK)
    return span("tool", attributes, status=status, **kw)
