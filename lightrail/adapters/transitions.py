"""Episode → `Transition`s: one per choice of every trained LLM call, built only from the engine's token ids.

A transition shares its id lists with the span it came from (no copies: the adapter runs on every span of every
training step); treat both as read-only.

Example::

    transitions, report = spans_to_transitions(spans, credit=PerTurn(), agents=AgentFilter(names={"solver"}))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from lightrail.adapters.credit import CreditAssignment, PerTurn
from lightrail.adapters.episode import AGENT_NAME_KEYS, build_episode
from lightrail.adapters.records import AdapterReport, Episode
from lightrail.adapters.rewards import ToolRewardRule
from lightrail.types import Attr, Span, Transition, next_seq

__all__ = ["episode_transitions", "spans_to_transitions", "training_spans"]

_isfinite = math.isfinite


def episode_transitions(
    episode: Episode,
    returns: Sequence[float],
    advantages: Sequence[float] | None = None,
    *,
    agents: Callable[[str | None], bool] | None = None,
    group_id: str | None = None,
) -> list[Transition]:
    """Transitions of ``episode`` with ``reward`` = the call's return and ``advantage`` = ``advantages[turn]``.

    ``returns``/``advantages`` have one value per call (turn order), as a `CreditAssignment` gives them.
    Calls whose agent ``agents`` rejects are left out; choices without the engine's prompt or response ids are
    skipped; logprobs that are absent, of the wrong length or not finite are dropped (the transition is kept).
    All three are counted in ``episode.report``. ``metadata`` holds ``response_id``, ``choice`` (index),
    ``finish_reason`` and, when given, ``group_id`` (the GRPO group, carried on to training rows).
    """
    calls = episode.calls
    if len(returns) != len(calls) or (advantages is not None and len(advantages) != len(calls)):
        raise ValueError(f"need one return (and advantage) per call: {len(calls)} calls, {len(returns)} returns")
    report = episode.report
    rollout_id, attempt_id = episode.rollout_id, episode.attempt_id
    out: list[Transition] = []
    append = out.append
    not_selected = missing_ids = missing_lp = 0
    for t, call in enumerate(calls):
        choices = call.choices
        if agents is not None and not agents(call.agent_name):
            not_selected += len(choices)
            continue
        prompt = call.prompt_ids
        if prompt is None:
            missing_ids += len(choices)
            continue
        ret = returns[t]
        adv = advantages[t] if advantages is not None else None
        for i, choice in enumerate(choices):
            ids = choice.get("token_ids")
            if ids is None:
                missing_ids += 1
                continue
            lps = choice.get("logprobs")
            # sum() propagates nan/inf in one C loop; logprobs are <= 0 and bounded, so it cannot overflow
            if lps is not None and (len(lps) != len(ids) or not _isfinite(sum(lps))):
                lps = None
            if lps is None:
                missing_lp += 1
            metadata = {"response_id": call.response_id, "choice": i, "finish_reason": choice.get("finish_reason")}
            if group_id is not None:
                metadata["group_id"] = group_id
            append(
                Transition(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    prompt_ids=prompt,
                    response_ids=ids,
                    logprobs=lps,
                    reward=ret,
                    advantage=adv,
                    policy_version=call.policy_version,
                    agent_name=call.agent_name,
                    turn=call.turn,
                    metadata=metadata,
                )
            )
    report.not_selected += not_selected
    report.missing_token_ids += missing_ids
    report.missing_logprobs += missing_lp
    report.transitions += len(out)
    return out


def spans_to_transitions(
    spans: Sequence[Span],
    *,
    credit: CreditAssignment = PerTurn(),  # noqa: B008 - frozen, stateless
    agents: Callable[[str | None], bool] | None = None,
    tool_rewards: ToolRewardRule | None = None,
    final_reward: float | None = None,
    agent_name_keys: Sequence[str] = AGENT_NAME_KEYS,
) -> tuple[list[Transition], AdapterReport]:
    """Spans of one attempt → its transitions (``reward`` = per-call return, ``advantage`` unset) and a report.

    ``final_reward`` overrides the episode's final-reward span (e.g. `Rollout.reward`); with neither, the final
    reward is 0.0 and `AdapterReport.no_final_reward` says so. For GRPO advantages use `group_advantages`.
    """
    episode = build_episode(spans, tool_rewards_rule=tool_rewards, agent_name_keys=agent_name_keys)
    final = final_reward if final_reward is not None else episode.final_reward
    returns = credit(episode.calls, 0.0 if final is None else final, episode.intermediate)
    return episode_transitions(episode, returns, agents=agents), episode.report


def training_spans(transitions: Sequence[Transition], *, step: int, algorithm: str) -> list[Span]:
    """One `Attr.SPAN_TRAINING` span per attempt of ``transitions``: what an update trained on (each choice's
    response id, turn, agent, return, advantage and length; with `GRPO`'s ``policies``, the policy that trained it),
    stored next to the calls so that a rollout can be read back with the credit it received (``lightrail dashboard``)."""
    by_attempt: dict[tuple[str, str], list[dict]] = {}
    for t in transitions:
        by_attempt.setdefault((t.rollout_id, t.attempt_id), []).append({
            "response_id": t.metadata.get("response_id"), "choice": t.metadata.get("choice"), "turn": t.turn,
            "agent": t.agent_name, "return": t.reward, "advantage": t.advantage, "tokens": len(t.response_ids),
            **({"policy": t.metadata["policy"]} if "policy" in t.metadata else {}),
        })  # fmt: skip
    return [
        Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            seq=next_seq(),
            name=Attr.SPAN_TRAINING,
            attributes={Attr.TRAINING_STEP: step, Attr.TRAINING_ALGORITHM: algorithm, Attr.TRAINING_CALLS: calls},
        )  # fmt: skip
        for (rollout_id, attempt_id), calls in by_attempt.items()
    ]
