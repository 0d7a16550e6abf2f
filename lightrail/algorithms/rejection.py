"""Rejection sampling: which finished rollouts are worth imitating. Pure functions over `Rollout`s; no I/O.

Two decisions, in this order:

1. `TraceFilter` picks the candidates: rollouts whose outcome came from the policy (succeeded, failed, timeout;
   infrastructure failures and cancellations are never data), of the given modes (``train`` by default: held-out
   rollouts must not leak into training), created inside a time window, whose task metadata match.
2. `keep_best` keeps the best of them by the rollout's final reward: at least ``min_reward``, and at most
   ``best_of`` per task (the top rewards among the task's samples; ties go to the earlier rollout).

Every rollout left out is counted by reason in an `Exclusions` (the same report `select_trainable` writes), so a
run's ``metrics.jsonl`` says what was dropped and why.

Example::

    candidates, dropped = TraceFilter(task_metadata={"split": "easy"}, since=t0).apply(rollouts)
    kept = keep_best(candidates, min_reward=1.0, best_of=1, dropped=dropped)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from lightrail.adapters.selection import Exclusions, select_trainable
from lightrail.types import JSON, Rollout

__all__ = ["TraceFilter", "keep_best"]


class TraceFilter(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Which stored rollouts are candidates for supervised training (see the module docstring).

    ``since`` / ``until`` bound `Rollout.created_at` (Unix seconds, ``since <= created_at < until``);
    ``task_metadata`` must match the task's metadata key by key (equal values); ``modes`` are the rollout modes
    taken. ``store`` (a SQLite path, ``postgresql://`` or ``http://`` URL; token in ``$LIGHTRAIL_TOKEN``) reads the
    rollouts of another run; None reads the trainer's own store.
    """

    store: str | None = None
    """Read the rollouts of another run's store (SQLite path, ``postgresql://`` or ``http://`` URL; token in
    $LIGHTRAIL_TOKEN); null: the trainer's own store."""
    since: float | None = None
    """Only rollouts created at or after this Unix time."""
    until: float | None = None
    """Only rollouts created before this Unix time."""
    task_metadata: dict[str, JSON] = msgspec.field(default_factory=dict)
    """Only rollouts whose task metadata has these keys with these values."""
    modes: tuple[str, ...] = ("train",)
    """Rollout modes taken (``train``, ``val``)."""

    def apply(self, rollouts: Iterable[Rollout]) -> tuple[list[Rollout], Exclusions]:
        """The candidates among ``rollouts`` (order kept) and the others counted by reason: ``not_finished``,
        ``infra_error``, ``cancelled``, ``validation`` (mode not taken), ``outside_window``, ``task_metadata``."""
        finished, dropped = select_trainable(rollouts, modes=self.modes)
        kept = []
        for rollout in finished:
            if (self.since is not None and rollout.created_at < self.since) or (
                self.until is not None and rollout.created_at >= self.until
            ):
                dropped.add("outside_window", rollout.rollout_id)
            elif not _matches(rollout.task.metadata, self.task_metadata):
                dropped.add("task_metadata", rollout.rollout_id)
            else:
                kept.append(rollout)
        return kept, dropped


def _matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(key in metadata and metadata[key] == value for key, value in wanted.items())


def keep_best(
    rollouts: Sequence[Rollout],
    *,
    min_reward: float | None = None,
    best_of: int | None = None,
    dropped: Exclusions | None = None,
) -> list[Rollout]:
    """The rollouts worth imitating, in their given order: reward at least ``min_reward`` (None: any reward), then
    at most ``best_of`` per task (``task_id``; None: all), the highest rewards first, ties to the earlier rollout.

    Rollouts without a final reward are never kept (``no_reward``); the others left out are counted in ``dropped``
    as ``below_threshold`` or ``not_best_of_n``.
    """
    if best_of is not None and best_of < 1:
        raise ValueError(f"best_of must be >= 1, not {best_of}")
    dropped = dropped if dropped is not None else Exclusions()
    passing: list[int] = []
    for i, rollout in enumerate(rollouts):
        if rollout.reward is None:
            dropped.add("no_reward", rollout.rollout_id)
        elif min_reward is not None and rollout.reward < min_reward:
            dropped.add("below_threshold", rollout.rollout_id)
        else:
            passing.append(i)
    if best_of is None:
        return [rollouts[i] for i in passing]
    by_task: dict[str, list[int]] = {}
    for i in passing:
        by_task.setdefault(rollouts[i].task.task_id, []).append(i)
    chosen: set[int] = set()
    for members in by_task.values():
        ranked = sorted(members, key=lambda i: (-(rollouts[i].reward or 0.0), rollouts[i].created_at, i))
        chosen.update(ranked[:best_of])
        for i in ranked[best_of:]:
            dropped.add("not_best_of_n", rollouts[i].rollout_id)
    return [rollouts[i] for i in passing if i in chosen]
