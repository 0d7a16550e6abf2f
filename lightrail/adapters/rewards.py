"""Automatic intermediate rewards from tool outcomes: no change to the agent, only a rule.

A tool call belongs to the LLM call whose response asked for it, so its outcome becomes an intermediate reward
linked to that call's response id (which `PerTurn` / `Discounted` credit then use). Outcomes come from two
places, both optional:

* **the conversation** — a later call's request carries a ``{"role": "tool", "tool_call_id": ...}`` message;
  its content is classified by ``rule.is_error`` (default `looks_like_error`);
* **tool spans** — OpenInference (``openinference.span.kind == "TOOL"``) or GenAI
  (``gen_ai.operation.name == "execute_tool"``) spans, linked through ``gen_ai.tool.call.id``. A span whose
  status is ``error`` or ``ok`` is the authority; one whose status is unset only says the tool ran (AutoGen
  leaves it unset for a tool that *returns* error text), so the tool message decides, and without one it is a
  success.

A tool call with neither is *unanswered* (the agent never ran it, or never showed the model its result).

Example::

    rule = ToolRewardRule(success=0.1, error=-0.1, unanswered=-0.2)
    episode = build_episode(spans, tool_rewards_rule=rule)   # episode.intermediate now holds the tool rewards
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightrail.adapters.records import AdapterReport, IntermediateReward, LLMCall
from lightrail.types import Attr, Span, StatusCode, content_text

__all__ = ["TOOL_CALL_ID", "ToolRewardRule", "is_tool_span", "looks_like_error", "tool_rewards"]

TOOL_CALL_ID = "gen_ai.tool.call.id"
"""Attribute linking a tool span to the tool call (``tool_calls[].id``) an LLM response made."""
_OI_KIND = "openinference.span.kind"
_GENAI_OP = "gen_ai.operation.name"

# "Error: ...", "ValueError: ...", "[ERROR] ...", "Exception", "Traceback (most recent call last)", after any
# leading punctuation; "errors found: 0" does not match (the word must end at "error"/"exception").
_ERROR_RE = re.compile(r"^[\W_]*(\w*error|\w*exception|traceback)\b", re.IGNORECASE)


def looks_like_error(content: str) -> bool:
    """The default tool-result classifier: True when the text starts (after whitespace or punctuation) with a
    word ending in "error" or "exception", or with "traceback" — case-insensitive.

    >>> looks_like_error("ValueError: bad input"), looks_like_error("[error] timeout"), looks_like_error("42")
    (True, True, False)
    """
    return _ERROR_RE.match(content) is not None


@dataclass(frozen=True, slots=True)
class ToolRewardRule:
    """How tool outcomes become intermediate rewards.

    ``unanswered`` None gives no reward for unanswered tool calls (they are still counted).
    ``is_error`` sees the tool message's text (list-of-parts content is joined).
    """

    success: float = 0.1
    """Intermediate reward after a tool call that succeeded."""
    error: float = -0.1
    """Intermediate reward after a tool call whose result looks like an error."""
    unanswered: float | None = None
    """Reward for a tool call no tool message answered (null: none, only counted)."""
    is_error: Callable[[str], bool] = looks_like_error
    from_messages: bool = True
    """Read tool outcomes from the tool messages of later requests."""
    from_spans: bool = True
    """Read tool outcomes from the framework's tool spans (needs ``otel``)."""


def is_tool_span(span: Span) -> bool:
    """True for a framework's tool-execution span (OpenInference kind TOOL or GenAI ``execute_tool``)."""
    a = span.attributes
    return a.get(_OI_KIND) == "TOOL" or a.get(_GENAI_OP) == "execute_tool"


def tool_rewards(
    calls: Sequence[LLMCall], tool_spans: Sequence[Span], rule: ToolRewardRule, report: AdapterReport
) -> list[IntermediateReward]:
    """Intermediate rewards for every tool call the LLM responses of one attempt made, in request order.

    ``calls`` are in turn order and ``tool_spans`` in ``seq`` order (a later span for the same tool call wins,
    e.g. a retried tool). Counts go to ``report``.
    """
    # tool call id -> (response id of the call that asked for it, tool name); first request wins
    requested: dict[str, tuple[str | None, str | None]] = {}
    for call in calls:
        response = call.span.attributes.get(Attr.RESPONSE)
        if not isinstance(response, dict):
            continue
        for choice in response.get("choices") or ():
            message = choice.get("message") or {}
            for tc in message.get("tool_calls") or ():
                tc_id = tc.get("id")
                if tc_id is not None and tc_id not in requested:
                    requested[tc_id] = (call.response_id, (tc.get("function") or {}).get("name"))
    if not requested and not tool_spans:
        return []

    decided: dict[str, bool] = {}  # tool call id -> error, from a span whose status says how it went
    ran: dict[str, bool] = {}  # tool spans with status unset: ran, outcome unknown (success unless a message says)
    if rule.from_spans:
        for span in tool_spans:
            tc_id = span.attributes.get(TOOL_CALL_ID)
            if tc_id not in requested:
                report.tool_unlinked += 1
                continue
            code = span.status.code  # the latest span of a tool call wins (a retried tool)
            if code is StatusCode.UNSET:
                ran[tc_id] = False
                decided.pop(tc_id, None)
            else:
                decided[tc_id] = code is StatusCode.ERROR
                ran.pop(tc_id, None)
    said: dict[str, bool] = {}  # tool call id -> error, from the tool message's text
    if rule.from_messages:
        for call in calls:
            request = call.span.attributes.get(Attr.REQUEST)
            if not isinstance(request, dict):
                continue
            for message in request.get("messages") or ():
                if message.get("role") != "tool":
                    continue
                tc_id = message.get("tool_call_id")
                # the same tool message repeats in every later request's history: classify it once
                if tc_id in requested and tc_id not in decided and tc_id not in said:
                    said[tc_id] = bool(rule.is_error(content_text(message.get("content"))))
    failed = {**ran, **said, **decided}

    out: list[IntermediateReward] = []
    for tc_id, (response_id, tool) in requested.items():
        outcome = failed.get(tc_id)
        if outcome is None:
            report.tool_unanswered += 1
            if rule.unanswered is None:
                continue
            value, kind = rule.unanswered, "unanswered"
        elif outcome:
            report.tool_error += 1
            value, kind = rule.error, "error"
        else:
            report.tool_success += 1
            value, kind = rule.success, "success"
        name = f"tool_{kind}:{tool}" if tool else f"tool_{kind}"
        out.append(IntermediateReward(value=value, response_id=response_id, name=name, source="tool"))
    return out
