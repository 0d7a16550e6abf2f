"""What is trained: which rollouts (infrastructure failures, agents that raised or timed out and rollouts without a
reward are excluded, never scored 0) and which agents' calls.

Example::

    trainable, excluded = select_trainable(rollouts, episodes)
    log(excluded.counts)                        # {"infra_error": 2, "failed": 3, "missing_token_ids": 1}
    only_solver = AgentFilter(names={"solver"}, pattern=r"coder-\\d+")
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

import msgspec

from lightrail.adapters.records import Episode
from lightrail.types import Rollout, RolloutStatus

__all__ = ["AgentFilter", "Exclusions", "scored_reward", "select_trainable"]

#: Rollout statuses that are outcomes of the policy (a raise or a timeout is the agent's doing, not the machine's):
#: they count in success rates. Only succeeded ones are trained by default (`select_trainable`'s ``failure_reward``).
POLICY_OUTCOMES = frozenset({RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.TIMEOUT})

#: Policy outcomes that carry no reward of the agent's: trained only with an explicit ``failure_reward``.
UNFINISHED_OUTCOMES = frozenset({RolloutStatus.FAILED, RolloutStatus.TIMEOUT})


def scored_reward(rollout: Rollout, failure_reward: float | None = None) -> float | None:
    """The reward a kept rollout is scored with: ``failure_reward`` for one whose agent raised or timed out (when one
    is given: what `select_trainable` keeps such rollouts for), else its own."""
    return failure_reward if failure_reward is not None and rollout.status in UNFINISHED_OUTCOMES else rollout.reward


class AgentFilter:
    """Which agents' LLM calls are trained: a name in ``names`` or a name that ``pattern`` fully matches.

    Calls without an agent name are trained only with ``include_unnamed=True``. Answers are cached per name
    (an attempt has few distinct agents and many calls).
    """

    __slots__ = ("_cache", "include_unnamed", "names", "pattern")

    def __init__(
        self, names: Iterable[str] = (), pattern: str | re.Pattern[str] | None = None, *, include_unnamed: bool = False
    ) -> None:
        self.names = frozenset(names)
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.include_unnamed = include_unnamed
        self._cache: dict[str | None, bool] = {None: include_unnamed}

    def __call__(self, agent_name: str | None) -> bool:
        hit = self._cache.get(agent_name)
        if hit is None:
            assert agent_name is not None  # None is pre-seeded in the cache
            hit = agent_name in self.names or (
                self.pattern is not None and self.pattern.fullmatch(agent_name) is not None
            )
            self._cache[agent_name] = hit
        return hit

    def __repr__(self) -> str:
        pattern = self.pattern.pattern if self.pattern is not None else None
        return f"AgentFilter(names={sorted(self.names)!r}, pattern={pattern!r}, include_unnamed={self.include_unnamed})"


class Exclusions(msgspec.Struct, kw_only=True):
    """Rollouts left out of training, by reason: ``counts[reason]`` and the ids in ``rollout_ids[reason]``.

    Reasons: ``not_finished``, ``infra_error``, ``cancelled``, ``failed`` (the agent raised) and ``timeout`` (it ran
    past its budget) unless a ``failure_reward`` is given, ``validation`` (mode not trained), ``no_reward`` (the agent
    returned None and emitted no final reward), ``non_finite_reward``, ``no_spans`` (episodes were given but none for
    the rollout), ``no_llm_calls``, ``missing_token_ids`` (no call has the engine's ids).
    """

    counts: dict[str, int] = msgspec.field(default_factory=dict)
    rollout_ids: dict[str, list[str]] = msgspec.field(default_factory=dict)

    def add(self, reason: str, rollout_id: str) -> None:
        """Record one excluded rollout."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.rollout_ids.setdefault(reason, []).append(rollout_id)

    @property
    def total(self) -> int:
        """How many rollouts were excluded."""
        return sum(self.counts.values())


def _reason(
    rollout: Rollout, episode: Episode | None, check_episode: bool, modes: frozenset[str], failure_reward: float | None
) -> str | None:
    status = rollout.status
    if not status.terminal:
        return "not_finished"
    if status not in POLICY_OUTCOMES:
        return status.value  # infra_error, cancelled
    if rollout.mode not in modes:
        return "validation"
    if status in UNFINISHED_OUTCOMES:
        if failure_reward is None:
            return status.value  # failed, timeout: the agent gave no reward, and 0 would be a made-up one
    else:
        reward = episode.final_reward if episode is not None and episode.final_reward is not None else rollout.reward
        if reward is None:
            return "no_reward"
        if not math.isfinite(reward):
            return "non_finite_reward"
    if not check_episode:
        return None
    if episode is None:
        return "no_spans"
    if not episode.calls:
        return "no_llm_calls"
    if all(c.prompt_ids is None or all(ch.get("token_ids") is None for ch in c.choices) for c in episode.calls):
        return "missing_token_ids"
    return None


def select_trainable(
    rollouts: Iterable[Rollout],
    episodes: Mapping[str, Episode] | None = None,
    *,
    modes: Iterable[str] = ("train",),
    failure_reward: float | None = None,
) -> tuple[list[Rollout], Exclusions]:
    """Keep rollouts that succeeded with a finite reward and have data; every other one is excluded and counted.

    Infrastructure failures and cancellations say nothing about the policy: scoring them 0 would teach it to avoid
    whatever the broken machine was doing. Rollouts whose agent raised or timed out, or that reported no reward,
    carry no reward at all: scoring them 0 would train on a number nobody gave (the silent failure users of the field
    report most), so they are excluded too, unless ``failure_reward`` says what a raise or a timeout is worth (then
    they are kept, and `group_advantages` scores them so). With ``episodes`` (by rollout id) rollouts with no LLM
    calls or no token ids at all are excluded too.
    """
    modes = frozenset(modes)
    kept: list[Rollout] = []
    excluded = Exclusions()
    check = episodes is not None
    for rollout in rollouts:
        episode = episodes.get(rollout.rollout_id) if episodes is not None else None
        reason = _reason(rollout, episode, check, modes, failure_reward)
        if reason is None:
            kept.append(rollout)
        else:
            excluded.add(reason, rollout.rollout_id)
    return kept, excluded
