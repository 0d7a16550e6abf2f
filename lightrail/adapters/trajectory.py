"""Transitions → `lightrail.types.TrainingRow`s: the token sequences a policy update consumes.

A row's ``input_ids``, ``loss_mask``, ``old_logprobs`` and ``advantages`` are aligned per token (see the
contract in `lightrail.types`); its ``group_id`` is the GRPO group (`Transition.metadata["group_id"]`, set by
`group_advantages`), its ``policy_version`` the oldest of its calls (what staleness checks must see), and its
``metadata`` holds ``attempt_id``, ``turns``, ``policy_versions``, ``prompt_len`` and ``agent_name``.

Without merging, each transition is one row (its prompt masked out). With ``merge=True`` (trajectory mode) a
call whose prompt ids *start with* an open row's ids (previous prompts + responses + the environment tokens in
between) extends that row: the new tokens between the row's end and the new response (tool results, the next
user turn, chat-template glue) are added with loss mask 0, the response with mask 1. This trains each response
once, in its real context, without recomputing the shared history per call.

When a call's prompt extends no open row, a new row starts and, if the call is not the attempt's first, a
`PrefixBreak` is recorded: the turn, the first position where the prompt differs from the previous call's row
(``position``) and that row's length. The usual cause is the chat template re-rendering history differently
from what was sampled (e.g. a reasoning block stripped, tool-call JSON re-serialised); ``position`` tells where.
Choices after the first of an n>1 call start their own rows and are not breaks (they are siblings, not drift).

A transition without sampler logprobs cannot be trained by a clipped-ratio loss: it is left out and counted
(`DriftReport.no_logprobs`); in trajectory mode its tokens then simply become masked context of the next call
that extends the row. Transitions must carry an advantage (`group_advantages`), else ValueError.

Rows are per (rollout, attempt); transitions must come in turn order within an attempt, as the adapters
return them. Example::

    rows, drift = to_rows(transitions, merge=True)
    breaks = sum(d.breaks for d in drift)
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from lightrail.types import TrainingRow, Transition

__all__ = ["DriftReport", "PrefixBreak", "to_rows"]


class PrefixBreak(msgspec.Struct, kw_only=True, frozen=True):
    """A call that extended no open sequence, compared with the previous call's sequence."""

    turn: int
    position: int
    """First index where the call's prompt differs from the previous row (= its length if it is a prefix)."""
    previous_len: int
    prompt_len: int


class DriftReport(msgspec.Struct, kw_only=True):
    """Prefix drift of one attempt in trajectory mode."""

    rollout_id: str
    attempt_id: str
    transitions: int = 0
    rows: int = 0
    merged: int = 0
    """Calls appended to an earlier row."""
    no_logprobs: int = 0
    """Transitions left out because they lack sampler logprobs (or have an empty prompt)."""
    details: list[PrefixBreak] = msgspec.field(default_factory=list)

    @property
    def breaks(self) -> int:
        """How many calls (after the attempt's first) extended no open sequence and started a new row."""
        return len(self.details)


class _Open:
    """A row under construction."""

    __slots__ = ("advs", "ids", "lps", "mask", "prompt_len", "t", "turns", "versions")

    def __init__(self, t: Transition, advantage: float, logprobs: list[float]) -> None:
        prompt, resp = t.prompt_ids, t.response_ids
        p, r = len(prompt), len(resp)
        self.t = t
        self.ids = prompt + resp  # a new list: the row grows, the span's lists must not
        self.mask = [0] * p + [1] * r
        self.lps = [0.0] * p + logprobs
        self.advs = [0.0] * p + [advantage] * r
        self.prompt_len = p
        self.turns = [t.turn]
        self.versions = [t.policy_version]

    def extend(self, t: Transition, advantage: float, logprobs: list[float]) -> None:
        prompt, resp = t.prompt_ids, t.response_ids
        gap = len(prompt) - len(self.ids)
        r = len(resp)
        self.ids += prompt[len(self.ids) :]
        self.ids += resp
        self.mask += [0] * gap
        self.mask += [1] * r
        self.lps += [0.0] * gap
        self.lps += logprobs
        self.advs += [0.0] * gap
        self.advs += [advantage] * r
        self.turns.append(t.turn)
        self.versions.append(t.policy_version)

    def row(self) -> TrainingRow:
        t = self.t
        known = [v for v in self.versions if v is not None]
        return TrainingRow(
            input_ids=self.ids,
            loss_mask=self.mask,
            old_logprobs=self.lps,
            advantages=self.advs,
            rollout_id=t.rollout_id,
            group_id=t.metadata.get("group_id", ""),
            policy_version=min(known) if known else None,
            metadata={
                "attempt_id": t.attempt_id,
                "turns": self.turns,
                "policy_versions": self.versions,
                "prompt_len": self.prompt_len,
                "agent_name": t.agent_name,
            },
        )


def _extends(prompt: list[int], ids: list[int]) -> bool:
    n = len(ids)
    return len(prompt) >= n and prompt[:n] == ids


def _first_mismatch(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]; slices compare in C
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _attempt_rows(ts: Sequence[Transition], merge: bool, drift: DriftReport) -> list[TrainingRow]:
    open_rows: list[_Open] = []
    previous: _Open | None = None  # the row the previous call (choice 0) ended in
    prev_turn: int | None = None
    for t in ts:
        drift.transitions += 1
        advantage, logprobs = t.advantage, t.logprobs
        if advantage is None:
            raise ValueError(f"transition of {t.rollout_id!r} turn {t.turn} has no advantage: use group_advantages")
        if logprobs is None or not t.prompt_ids:
            drift.no_logprobs += 1
            continue
        sibling = t.turn == prev_turn
        target: _Open | None = None
        if merge and not sibling:
            # most recent first: in a linear conversation the previous row matches at once
            for row in reversed(open_rows):
                if _extends(t.prompt_ids, row.ids):
                    target = row
                    break
        if target is not None:
            target.extend(t, advantage, logprobs)
            drift.merged += 1
        else:
            target = _Open(t, advantage, logprobs)
            open_rows.append(target)
            if merge and previous is not None and not sibling:
                drift.details.append(
                    PrefixBreak(
                        turn=t.turn,
                        position=_first_mismatch(t.prompt_ids, previous.ids),
                        previous_len=len(previous.ids),
                        prompt_len=len(t.prompt_ids),
                    )
                )
        if not sibling:
            previous = target
        prev_turn = t.turn
    drift.rows = len(open_rows)
    return [row.row() for row in open_rows]


def to_rows(transitions: Sequence[Transition], *, merge: bool = False) -> tuple[list[TrainingRow], list[DriftReport]]:
    """Rows of ``transitions`` and, per attempt, a `DriftReport` (breaks are recorded only when merging).

    Rows come out per attempt in first-seen order, within an attempt in the order each row was started.
    """
    by_attempt: dict[tuple[str, str], list[Transition]] = {}
    for t in transitions:
        by_attempt.setdefault((t.rollout_id, t.attempt_id), []).append(t)
    rows: list[TrainingRow] = []
    reports: list[DriftReport] = []
    for (rollout_id, attempt_id), ts in by_attempt.items():
        drift = DriftReport(rollout_id=rollout_id, attempt_id=attempt_id)
        rows.extend(_attempt_rows(ts, merge, drift))
        reports.append(drift)
    return rows, reports
