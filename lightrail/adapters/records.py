"""Records the adapters pass between their steps: parsed LLM calls, rewards, one attempt's episode, counters.

These are adapter-internal views of `lightrail.types.Span`s; they never cross a process boundary, so they may
hold references to the spans' own lists and dicts (ids are never copied on the way to a `Transition`: treat
everything here and in the transitions built from it as read-only).

The structs are ``gc=False``: they only point down at spans and never form reference cycles, and leaving them
out of the cyclic garbage collector's generations keeps full collections rarer on the hot path.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from lightrail.types import Span

__all__ = ["AdapterReport", "Episode", "IntermediateReward", "LLMCall"]


class LLMCall(msgspec.Struct, kw_only=True, gc=False):
    """One LLM-call span of an attempt, as the adapters read it.

    ``turn`` is the call's position among all LLM calls of the attempt, ordered by the gateway's ``seq``
    (every call the agent received counts, including ones of agents that are not trained and ones without token
    ids; abandoned calls, which it never received, do not).
    """

    span: Span
    turn: int
    response_id: str | None
    agent_name: str | None
    prompt_ids: list[int] | None
    """The engine's prompt token ids; None when the backend could not report them."""
    choices: list[dict[str, Any]]
    """The span's `Attr.CHOICES`: ``{"token_ids", "logprobs", "finish_reason"}`` per choice."""
    policy_version: int | None = None


class IntermediateReward(msgspec.Struct, kw_only=True, gc=False):
    """A reward given during the episode, linked to the LLM call it follows by that call's response id.

    ``response_id`` is None (or names no call of the attempt) when the emitter did not know the call: such a
    reward is *unlinked* and counted in `AdapterReport.unlinked_rewards`.
    """

    value: float
    response_id: str | None = None
    name: str | None = None
    source: Literal["agent", "tool"] = "agent"
    """``agent``: an `Attr.SPAN_REWARD` span; ``tool``: derived from a tool outcome by a `ToolRewardRule`."""


class AdapterReport(msgspec.Struct, kw_only=True):
    """What an adapter did and left out, so nothing is dropped silently. Add reports with ``+=``/`merge`."""

    calls: int = 0
    """LLM-call spans read as calls (abandoned ones are not)."""
    abandoned: int = 0
    """LLM-call spans left out because the client disconnected before the answer (`Attr.ABANDONED`)."""
    choices: int = 0
    """Choices seen over all calls (n > 1 gives several per call)."""
    transitions: int = 0
    not_selected: int = 0
    """Choices of calls whose agent is not trained (they still count as turns for credit)."""
    missing_token_ids: int = 0
    """Choices skipped because the engine's prompt or response ids were unavailable."""
    missing_logprobs: int = 0
    """Transitions kept without sampler logprobs (absent, wrong length or not finite)."""
    final_rewards: int = 0
    """Final-reward spans seen (the last by ``seq`` wins when there are several)."""
    no_final_reward: int = 0
    """Episodes without any final-reward span."""
    intermediate_rewards: int = 0
    """Intermediate rewards, agent-emitted plus tool-derived."""
    unlinked_rewards: int = 0
    """Intermediate rewards that name no LLM call of the attempt (ignored by credit unless it says otherwise)."""
    tool_success: int = 0
    tool_error: int = 0
    tool_unanswered: int = 0
    tool_unlinked: int = 0
    """Tool spans whose call id matches no tool call any LLM response made."""
    exceptions: int = 0
    """`Attr.SPAN_EXCEPTION` spans seen."""

    def merge(self, other: AdapterReport) -> AdapterReport:
        """Add ``other``'s counts into this report (in place) and return it."""
        for field in self.__struct_fields__:
            setattr(self, field, getattr(self, field) + getattr(other, field))
        return self

    def __iadd__(self, other: AdapterReport) -> AdapterReport:
        return self.merge(other)


class Episode(msgspec.Struct, kw_only=True, gc=False):
    """The spans of one attempt, read once: its LLM calls in turn order and its rewards.

    Invariant: ``calls[i].turn == i``. ``final_reward`` is None when no final-reward span was written (the caller
    may still know the outcome, e.g. `Rollout.reward`).
    """

    rollout_id: str
    attempt_id: str
    calls: list[LLMCall]
    final_reward: float | None
    intermediate: list[IntermediateReward]
    report: AdapterReport
