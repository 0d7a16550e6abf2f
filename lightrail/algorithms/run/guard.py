"""The run guard: every training step's health record, and the rules that stop a run that learns nothing.

The failure users of this field report most is the silent one: a run that exits 0 having trained on nothing (every
rollout raised, a sampling typo failed every call, the selection matched no agent, every reward was the same). A
step of a training loop (`GRPO` sync and async, PPO) builds a `StepHealth` from what it already has in hand (its
rollouts, their episodes, the selected transitions, the update's metrics) and hands it to its `RunGuard`::

    rollouts ──► StepHealth (failed and why, calls, token ids, calls selected, reward spread, transitions trained,
                 update finite) ──► metrics.jsonl + the step line ──► RunGuard.check
                     trained nothing? print the cause at this step; N such steps in a row: `RunStopped`

The rules, with their defaults in one place (`lightrail.algorithms.settings.GuardSection`, a section's ``guard``):

* a rollout whose agent raised or timed out is not trained as reward 0 unless ``failure_reward`` is set (that rule
  lives in `select_trainable`, where rollouts are chosen; the guard counts them);
* a step that trains nothing prints why at that step, with the failure digest of its rollouts when some failed;
  ``max_empty_steps`` such steps in a row stop the run (`RunStopped`, exit code 3 from ``lightrail train``);
* a selection (``agents``, ``agents_pattern``, policies) that matches no call at the run's first step stops it at
  once, naming the agents the calls were made by.

Concurrency model: used from one coroutine of the trainer's event loop; no shared state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from lightrail._errors import counted
from lightrail.adapters.records import Episode
from lightrail.adapters.selection import Exclusions, scored_reward
from lightrail.algorithms.settings import GuardSection
from lightrail.inspection.capture import KEY_FIX
from lightrail.types import Rollout, RolloutStatus, Transition

__all__ = [
    "RunGuard",
    "RunStopped",
    "StepHealth",
    "describe_selection",
    "informative_groups",
    "rollout_health",
    "step_health",
    "update_health",
]

NO_SIGNAL = "no learning signal"
"""How the cause of a step whose groups all scored the same begins (`StepHealth.problem`)."""

EXIT_CODE = 3
"""What ``lightrail train`` exits with when the guard stopped the run (2 is a bad config, 1 a crash)."""


class RunStopped(RuntimeError):
    """A run stopped because it learns nothing; the message is the one-line cause (the step and why)."""

    exit_code = EXIT_CODE


class StepHealth(msgspec.Struct, kw_only=True):
    """What one training step did, in numbers a person can check at a glance (every field is also a metric).

    Rollout counts partition ``rollouts``: ``succeeded + failed + timed_out + infra``. Call counts are over the last
    attempts of the step's rollouts of the trained mode: ``calls >= calls_with_token_ids >= calls_selected``.
    """

    step: int
    rollouts: int = 0
    succeeded: int = 0
    failed: int = 0
    """The agent raised (`RolloutStatus.FAILED`)."""
    timed_out: int = 0
    infra: int = 0
    """Infrastructure errors, cancellations and rollouts that had not finished."""
    trainable: int = 0
    """Rollouts `select_trainable` kept."""
    excluded: dict[str, int] = msgspec.field(default_factory=dict)
    """Rollouts left out, by reason (`Exclusions.counts`)."""
    causes: list[str] = msgspec.field(default_factory=list)
    """The failed attempts' causes, most frequent first, each with its first message: ``24x NameError: name 'x' is not
    defined``."""
    keys_refused: int = 0
    """Rollouts in which the gateway refused a call for its key (`Attr.SPAN_KEY_REFUSED`)."""
    calls: int = 0
    """Calls the agents received (abandoned ones are not calls of an episode)."""
    calls_abandoned: int = 0
    """Calls whose client disconnected before the answer (`Attr.ABANDONED`): counted, never trained."""
    calls_with_token_ids: int = 0
    calls_selected: int = 0
    """Calls with token ids whose agent the run trains (its ``agents``/``agents_pattern``/policies)."""
    agents_seen: list[str] = msgspec.field(default_factory=list)
    """The agent names the calls were made by (``(unnamed)`` for calls that named none)."""
    reward_values: int = 0
    """Distinct rewards among the trainable rollouts."""
    rewards_seen: list[float] = msgspec.field(default_factory=list)
    """Up to five of them, smallest first (for the cause line)."""
    groups: int = 0
    groups_with_spread: int = 0
    """Groups with a learning signal: some transition with a non-zero advantage."""
    transitions: int = 0
    """Transitions the update trained on (0 when it was skipped)."""
    update_finite: bool = True
    kl_term: bool = False
    """The update has a KL penalty to the reference (``kl_coef > 0``), which trains rows without an advantage too."""
    loss: float | None = None
    grad_norm: float | None = None
    scope: Literal["step", "rollouts", "update"] = "step"
    """What the record covers: a whole training step (rollouts, calls, update), only rollouts (an APO round, which
    trains no weights), or only an update (an SFT step on rows collected before)."""

    @property
    def calls_per_rollout(self) -> float:
        finished = self.succeeded + self.failed + self.timed_out
        return self.calls / finished if finished else 0.0

    def metrics(self) -> dict[str, Any]:
        """The record's numbers for ``metrics.jsonl`` and the trackers (``rollouts_*``, ``calls_*``, ...)."""
        return {
            "rollouts_succeeded": self.succeeded,
            "rollouts_failed": self.failed,
            "rollouts_timed_out": self.timed_out,
            "rollouts_infra": self.infra,
            "rollouts_trainable": self.trainable,
            "keys_refused": self.keys_refused,
            "calls": self.calls,
            "calls_abandoned": self.calls_abandoned,
            "calls_per_rollout": self.calls_per_rollout,
            "calls_with_token_ids": self.calls_with_token_ids,
            "calls_selected": self.calls_selected,
            "reward_values": self.reward_values,
            "groups_with_spread": self.groups_with_spread,
            "transitions_trained": self.transitions,
            "update_finite": self.update_finite,
        }

    def line(self) -> str:
        """The step line's health part: ``ok 22/24 (2 failed)  calls 3.0/rollout  trained 48``."""
        bad = [f"{n} {what}" for n, what in ((self.failed, "failed"), (self.timed_out, "timed out"),
                                               (self.infra, "infra")) if n]  # fmt: skip
        ok = f"ok {self.succeeded}/{self.rollouts}" + (f" ({', '.join(bad)})" if bad else "")
        abandoned = f" (+{self.calls_abandoned} abandoned)" if self.calls_abandoned else ""
        # no group with a spread, yet an update ran on its KL penalty: only that moved the weights
        kl_only = (
            " (KL term only)"
            if self.kl_term and self.transitions and self.groups and not self.groups_with_spread
            else ""
        )
        return f"{ok}  calls {self.calls_per_rollout:.1f}/rollout{abandoned}  trained {self.transitions}{kl_only}"

    def rewards_line(self) -> str:
        """``0, 0.5, 1`` (``, ...`` when there were more than `rewards_seen` holds)."""
        values = ", ".join(f"{v:g}" for v in self.rewards_seen)
        return values + (", ..." if self.reward_values > len(self.rewards_seen) else "")

    def solved(self, threshold: float) -> bool:
        """Every group's samples all scored the same, each a success (reward >= ``threshold``): the step's tasks
        are solved at its sampling temperature, so there is nothing left to learn from them."""
        return bool(self.groups and self.groups_with_spread == 0 and self.rewards_seen) and (
            self.rewards_seen[0] >= threshold
        )

    def problem(self, *, selection: str | None = None) -> str | None:
        """Why this step trained nothing, in one line (None when it trained). ``selection`` describes the run's
        selection of agents (for the line that says it matched nothing)."""
        if self.scope == "update":
            if not self.update_finite:
                return f"the update was not finite (loss {self.loss}, grad norm {self.grad_norm}): it was skipped"
            return None if self.transitions else "no row was trained"
        if self.rollouts == 0:
            return "no rollout ran"
        if self.keys_refused and (self.trainable == 0 or self.calls == 0):
            return f"the gateway refused the agent's key in {counted(self.keys_refused, 'rollout')}: {KEY_FIX}"
        if self.trainable == 0:
            head = (
                f"every rollout failed ({_summary(self)})"
                if self.failed + self.timed_out + self.infra == self.rollouts
                else f"no rollout could be trained on ({_excluded(self.excluded)})"
            )
            return head + (f": {self.causes[0]}" if self.causes else _exclusion_hint(self.excluded))
        if self.scope == "rollouts":
            return None
        if self.calls == 0:
            return "no LLM call was recorded: the agent did not call llm.endpoint (its own client or base_url?)"
        if self.calls_with_token_ids == 0:
            return "no call has token ids: the backend does not return them (vLLM >= 0.10.2 or lightrail's engine do)"
        if self.calls_selected == 0:
            return (
                f"{selection or 'the selection of agents'} matches no call; the calls were made by "
                f"{_names(self.agents_seen)}"
            )
        if not self.update_finite:
            return f"the update was not finite (loss {self.loss}, grad norm {self.grad_norm}): it was skipped"
        if self.groups and self.groups_with_spread == 0:
            return (
                f"{NO_SIGNAL}: in each of the {counted(self.groups, 'group')} every sample scored the same "
                f"(rewards seen: {self.rewards_line()})"
            )
        if self.transitions == 0:
            return "no transition was trained"
        return None


def step_health(
    step: int,
    rollouts: Sequence[Rollout],
    episodes: Mapping[str, Episode],
    trainable: Sequence[Rollout],
    excluded: Exclusions,
    transitions: Sequence[Transition],
    *,
    agents: Callable[[str | None], bool] | None,
    groups: int,
    update: Mapping[str, Any],
    trained: int,
    failure_reward: float | None = None,
    keys_refused: int = 0,
    kl_term: bool = False,
) -> StepHealth:
    """The health record of one step from what the step already holds: its ``rollouts`` (and the ``episodes`` of
    their last attempts, by rollout id), the ``trainable`` ones and the ``excluded`` counts (`select_trainable`), the
    selected ``transitions`` with their advantages, the number of ``groups``, the update's metrics and the number of
    transitions it ``trained`` on (``failure_reward``: what a kept failure scored; ``keys_refused``: rollouts whose
    key the gateway refused; ``kl_term``: the update has a KL penalty, `StepHealth.kl_term`). Pure: the failure causes come from `RunGuard.check`, which reads the store."""
    health = StepHealth(
        step=step, rollouts=len(rollouts), trainable=len(trainable), excluded=dict(excluded.counts),
        keys_refused=keys_refused, kl_term=kl_term,
    )  # fmt: skip
    for rollout in rollouts:
        if rollout.status is RolloutStatus.SUCCEEDED:
            health.succeeded += 1
        elif rollout.status is RolloutStatus.FAILED:
            health.failed += 1
        elif rollout.status is RolloutStatus.TIMEOUT:
            health.timed_out += 1
        else:
            health.infra += 1
    names: set[str] = set()
    for rollout in rollouts:
        episode = episodes.get(rollout.rollout_id)
        if episode is None or rollout.mode != "train":
            continue
        health.calls_abandoned += episode.report.abandoned
        for call in episode.calls:
            health.calls += 1
            names.add(call.agent_name or "(unnamed)")
            if call.prompt_ids is None or all(c.get("token_ids") is None for c in call.choices):
                continue
            health.calls_with_token_ids += 1
            if agents is None or agents(call.agent_name):
                health.calls_selected += 1
    health.agents_seen = sorted(names)
    scored = (scored_reward(r, failure_reward) for r in trainable)
    rewards = sorted({reward for reward in scored if reward is not None and math.isfinite(reward)})
    health.reward_values, health.rewards_seen = len(rewards), rewards[:5]
    health.groups = groups
    health.groups_with_spread = len(informative_groups(transitions))
    health.transitions = trained
    health.loss, health.grad_norm = update.get("loss"), update.get("grad_norm")
    # one policy's update, or each policy's (``write/loss``...)
    measured = [v for k, v in update.items() if k.rpartition("/")[2] in ("loss", "grad_norm")]
    health.update_finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in measured)
    return health


def rollout_health(step: int, rollouts: Sequence[Rollout]) -> StepHealth:
    """The health record of a step that runs rollouts but trains no weights on them (an APO round): rollout counts
    and what `select_trainable` would keep, nothing about calls or updates."""
    from lightrail.adapters.selection import select_trainable

    trainable, excluded = select_trainable(rollouts)
    health = step_health(step, rollouts, {}, trainable, excluded, [], agents=None, groups=0, update={}, trained=0)
    return msgspec.structs.replace(health, scope="rollouts")


def update_health(step: int, update: Mapping[str, Any], rows: int) -> StepHealth:
    """The health record of an optimizer step on rows collected before (an SFT step): ``rows`` trained, and whether
    the update (``loss``/``grad_norm`` of its metrics) was finite."""
    health = step_health(step, [], {}, [], Exclusions(), [], agents=None, groups=0, update=update, trained=rows)
    return msgspec.structs.replace(health, scope="update")


def informative_groups(transitions: Sequence[Transition]) -> set[Any]:
    """Group ids of the transitions with a non-zero advantage: the groups an update learns from."""
    return {t.metadata.get("group_id") for t in transitions if abs(t.advantage or 0.0) > 1e-9}


class RunGuard:
    """Applies the `GuardSection` rules to each step's `StepHealth` (module docstring). ``selection`` describes what
    the run selects to train (``agents_pattern 'write|rewrite'``), None when it trains every call; ``console``: where
    cause lines go (rich's global console by default, as the failure digests)."""

    def __init__(
        self, settings: GuardSection, *, selection: str | None = None, console: Any = None,
        success_threshold: float | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.selection = selection
        self.console = console
        self.success_threshold = success_threshold
        self.empty_steps = 0
        """Steps in a row that trained nothing, up to the last one checked."""
        self.learned = False
        """Some step so far had a learning signal (a group with a spread). A resumed run sets it from its history."""
        self._first = True

    async def check(self, store: Any, health: StepHealth, rollouts: Sequence[Rollout], *, stage: str = "step") -> None:
        """Print the step's cause when it trained nothing (and the failure digest of its rollouts when some failed);
        raise `RunStopped` when the rules say the run must stop. Reads the failed attempts' causes from ``store``
        into ``health.causes`` first (only when some rollout did not succeed). ``stage`` names the step in the lines
        (``GRPO step``, ``APO round``)."""
        from lightrail.inspection.report import digest_failures, failed_attempts, render_digest

        first, self._first = self._first, False
        digest = []
        if health.failed or health.timed_out or health.infra:
            digest = digest_failures(await failed_attempts(store, rollouts))
            health.causes = [f"{g.count}x {g.type.rpartition('.')[2]}: {g.example}" for g in digest]
        problem = health.problem(selection=self.selection)
        learned, self.learned = self.learned, self.learned or health.groups_with_spread > 0
        if problem is None:
            self.empty_steps = 0
            return
        where = f"{stage} {health.step}"
        console = self.console if self.console is not None else _console()
        threshold = self.success_threshold
        if learned and threshold is not None and health.solved(threshold) and problem.startswith(NO_SIGNAL):
            # a run that learned its way to solving the step's tasks is healthy, not empty (it is an empty step
            # when it never had a signal: a reward that is constant from the start reads the same)
            self.empty_steps = 0
            console.print(
                f"[dim]{where}: every sample of every group succeeded (rewards seen: {health.rewards_line()}): "
                "nothing left to learn from these tasks[/dim]", soft_wrap=True,
            )  # fmt: skip
            return
        self.empty_steps += 1
        if first and health.calls_with_token_ids and not health.calls_selected:
            raise RunStopped(f"{where}: {problem}")  # a selection that matches nothing never will
        limit = self.settings.max_empty_steps
        if limit and self.empty_steps >= limit:
            if digest:
                render_digest(digest, console, title=f"{where}: failure digest")
            raise RunStopped(f"{where}: {counted(self.empty_steps, 'step')} in a row trained nothing: {problem}")
        from rich.markup import escape

        console.print(f"[bold yellow]{escape(where)} trained nothing[/bold yellow]: {escape(problem)}", soft_wrap=True)
        if digest:
            render_digest(digest, console, title=f"{where}: failure digest")


def describe_selection(agents: Any) -> str | None:
    """How a run's selection of agents (an `AgentFilter`, or None: every call) reads in a cause line."""
    if agents is None:
        return None
    names, pattern = sorted(getattr(agents, "names", ()) or ()), getattr(agents, "pattern", None)
    parts = ([f"agents {names}"] if names else []) + ([f"agents_pattern {pattern.pattern!r}"] if pattern else [])
    return " / ".join(parts) or repr(agents)


def _summary(health: StepHealth) -> str:
    parts = [(health.failed, "failed"), (health.timed_out, "timed out"), (health.infra, "infrastructure")]
    return ", ".join(f"{n} {what}" for n, what in parts if n)


def _excluded(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))


_HINTS = {
    "no_reward": "the agent returned None and emitted no reward (return a float or call emit_reward)",
    "non_finite_reward": "the rewards were not finite numbers",
    "no_llm_calls": "no LLM call was recorded (the agent did not call llm.endpoint)",
    "missing_token_ids": "no call has token ids (the backend does not return them)",
    "no_spans": "no spans reached the store",
}


def _exclusion_hint(counts: Mapping[str, int]) -> str:
    for reason, _ in sorted(counts.items(), key=lambda kv: -kv[1]):
        if reason in _HINTS:
            return f": {_HINTS[reason]}"
    return ""


def _names(names: Sequence[str]) -> str:
    return f"{names}" if len(names) <= 8 else f"{list(names[:8])} and {len(names) - 8} more"


def _console() -> Any:
    from rich import get_console

    return get_console()
