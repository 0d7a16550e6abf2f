"""`DevReport`: what `Trainer.dev` found, per rollout and as a failure digest, and how it is printed.

The digest groups failed attempts by exception type and message *pattern*: numbers, ids, hex values and quoted
strings are replaced by placeholders, so "no such file 'a.txt'" and "no such file 'b.txt'" are one line with a
count instead of a hundred lines to scroll through. Next to them, rollouts that succeeded but captured nothing to
train on (`lightrail.inspection.capture`: no LLM call through lightrail's endpoint, calls without token ids, no reward)
are groups of their own, one per cause.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightrail._errors import counted
from lightrail.inspection.capture import (
    CaptureCause,
    CaptureProblem,
    capture_problems,
    llm_expected,
    read_capture_problems,
)
from lightrail.store.base import Store
from lightrail.types import Attempt, AttemptStatus, Attr, Rollout, RolloutStatus

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

__all__ = [
    "DevReport",
    "FailureGroup",
    "RolloutRow",
    "build_report",
    "digest_capture",
    "digest_failures",
    "attempt_error",
    "failed_attempts",
    "message_pattern",
    "print_failure_digest",
    "render_digest",
]

# Order matters: quoted strings first (they may contain anything), then ids and hex, then plain numbers.
_PLACEHOLDERS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"'[^'\n]*'|\"[^\"\n]*\""), "<str>"),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b[a-z]+-[0-9a-f]{8,}\b"), "<id>"),  # lightrail ids: ro-3f2a..., at-..., task-...
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?"), "<n>"),
]


def message_pattern(message: str) -> str:
    """``message`` with numbers, ids, hex and quoted strings replaced by ``<n>``, ``<id>``, ``<hex>``, ``<str>``.

    >>> message_pattern("bad answer 42 for 'x' at 0x1f (attempt at-0123456789abcdef)")
    'bad answer <n> for <str> at <hex> (attempt <id>)'
    """
    first = message.strip().splitlines()[0] if message.strip() else ""
    for pattern, placeholder in _PLACEHOLDERS:
        first = pattern.sub(placeholder, first)
    return first[:300]


@dataclass(frozen=True)
class RolloutRow:
    """One rollout of a dev run."""

    rollout_id: str
    task_id: str
    status: RolloutStatus
    reward: float | None
    attempts: int
    spans: int
    seconds: float | None
    """From the first attempt's start to the rollout's end (retries included); None if it did not end."""
    error: str | None = None
    """``Type: message`` of the last attempt that did not succeed, if any."""
    llm_calls: int = 0
    """LLM calls the gateway recorded in the last attempt (through lightrail's endpoint)."""
    capture: tuple[CaptureProblem, ...] = ()
    """What the rollout failed to capture although it succeeded (`capture_problems`)."""


@dataclass
class FailureGroup:
    """Failed attempts sharing an exception type and message pattern."""

    status: AttemptStatus
    type: str
    pattern: str
    count: int = 0
    example: str = ""
    example_rollout_id: str = ""
    rollout_ids: list[str] = field(default_factory=list)
    cause: CaptureCause | None = None
    """Set for a group of rollouts that succeeded but captured nothing to train on (``status`` is then
    succeeded, ``type`` the cause)."""


@dataclass
class DevReport:
    """The outcome of `Trainer.dev`: one `RolloutRow` per rollout (enqueue order) and the failure digest
    (most frequent first). ``store`` says where the full record lives (a SQLite path or a URL)."""

    rows: list[RolloutRow]
    digest: list[FailureGroup]
    store: str = ""
    seconds: float = 0.0

    @property
    def counts(self) -> dict[RolloutStatus, int]:
        """Rollouts per final status (only statuses that occur)."""
        out: dict[RolloutStatus, int] = {}
        for row in self.rows:
            out[row.status] = out.get(row.status, 0) + 1
        return out

    @property
    def mean_reward(self) -> float | None:
        """Mean reward of the rollouts that have one."""
        rewards = [r.reward for r in self.rows if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def capture_counts(self) -> dict[CaptureCause, int]:
        """Rollouts per capture problem (only causes that occur), in `CaptureCause` order."""
        out = {cause: sum(1 for r in self.rows if any(p.cause is cause for p in r.capture)) for cause in CaptureCause}
        return {cause: n for cause, n in out.items() if n}

    def render(self, console: Console | None = None, *, max_rows: int = 50) -> None:
        """Print the per-rollout table (first ``max_rows``), a status summary and the failure digest with rich."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        out = console if console is not None else Console()
        table = Table(title="rollouts", title_justify="left")
        columns: list[tuple[str, JustifyMethod]] = [
            ("rollout", "left"),
            ("status", "left"),
            ("reward", "right"),
            ("attempts", "right"),
            ("spans", "right"),
            ("seconds", "right"),
        ]
        noted = any(row.capture for row in self.rows[:max_rows])
        if noted:
            columns.append(("not captured", "left"))
        for name, justify in columns:
            table.add_column(name, justify=justify)
        for row in self.rows[:max_rows]:
            style = "green" if row.status is RolloutStatus.SUCCEEDED else "red"
            table.add_row(
                row.rollout_id,
                f"[{style}]{row.status.value}[/{style}]",
                "-" if row.reward is None else f"{row.reward:.3g}",
                str(row.attempts),
                str(row.spans),
                "-" if row.seconds is None else f"{row.seconds:.2f}",
                *(["[yellow]" + escape("; ".join(p.message for p in row.capture)) + "[/yellow]"] if noted else []),
            )
        if len(self.rows) > max_rows:
            table.caption = f"... {counted(len(self.rows) - max_rows, 'more rollout')} in the report"
        out.print(table)
        summary = ", ".join(f"{n} {s.value}" for s, n in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        mean = self.mean_reward
        out.print(
            f"{counted(len(self.rows), 'rollout')} in {self.seconds:.1f}s: {summary}"
            + ("" if mean is None else f"; mean reward {mean:.3g}")
            + (f"; store: {self.store}" if self.store else "")
        )
        if self.capture_counts:
            causes = ", ".join(f"{n} {cause.value}" for cause, n in self.capture_counts.items())
            out.print(
                f"[yellow]not trainable[/yellow]: {counted(len([r for r in self.rows if r.capture]), 'rollout')} "
                f"captured nothing to train on ({causes})"
            )
        render_digest(self.digest, out)


def render_digest(
    digest: Sequence[FailureGroup], console: object, *, title: str = "failure digest", stopped: str | None = None
) -> None:
    """Print failure groups (most frequent first) with rich: count, status, exception type, message pattern and
    one example; a single line when there are none. ``stopped``: where and why training stopped (``at step 3: <one-line
    cause>``, e.g. a weight sync that did not take, `lightrail.model.mismatch`), printed first."""
    from rich.markup import escape

    out: Any = console
    if stopped:
        out.print(f"[bold red]training stopped[/bold red] {escape(stopped)}", soft_wrap=True)
    failures = [g for g in digest if g.cause is None]
    captures = [g for g in digest if g.cause is not None]
    if not failures:
        head = f"{escape(title)}: no failed attempts"
    else:
        failed = sum(g.count for g in failures)
        head = f"[bold]{escape(title)}[/bold]: {counted(failed, 'attempt')} in {counted(len(failures), 'group')}"
    if captures:
        head += f"; {counted(sum(g.count for g in captures), 'capture problem')} in succeeded rollouts"
    out.print(head, soft_wrap=True)  # one line however long: a piped log is read by grep
    for group in captures:
        out.print(
            f"  [bold]{group.count}x[/bold] [yellow]{group.type}[/yellow] in {counted(len(group.rollout_ids), 'rollout')}"
            f": {escape(group.example.partition(': ')[2] or group.example)}\n      e.g. {group.example_rollout_id}",
            soft_wrap=True,
        )
    for group in failures:
        rollouts = len(group.rollout_ids)
        out.print(
            f"  [bold]{group.count}x[/bold] {group.status.value} in {counted(rollouts, 'rollout')}  "
            f"[red]{escape(group.type)}[/red]: {escape(group.pattern)}\n"
            f"      e.g. {group.example_rollout_id}: {escape(group.example)}",
            soft_wrap=True,
        )


def attempt_error(attempt: Attempt) -> tuple[str, str]:
    """``(type, message)`` of what ended ``attempt``: its error, or what a lost or timed-out attempt means."""
    if attempt.error is not None:
        return attempt.error.type, attempt.error.message
    if attempt.status is AttemptStatus.LOST:
        return "LeaseExpired", "the runner stopped heartbeating (crashed, killed or cut off)"
    if attempt.status is AttemptStatus.TIMEOUT:
        return "Timeout", "the attempt ran past its time budget"
    return attempt.status.value, ""


def digest_failures(attempts: Iterable[Attempt]) -> list[FailureGroup]:
    """Group attempts that ended failed, infra_error, timeout or lost by (status, type, message pattern)."""
    groups: dict[tuple[AttemptStatus, str, str], FailureGroup] = {}
    for attempt in attempts:
        if attempt.status in (AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING, AttemptStatus.CANCELLED):
            continue
        type_, message = attempt_error(attempt)
        key = (attempt.status, type_, message_pattern(message))
        group = groups.get(key)
        if group is None:
            group = groups[key] = FailureGroup(
                attempt.status, type_, key[2], example=message.strip()[:300], example_rollout_id=attempt.rollout_id
            )
        group.count += 1
        if attempt.rollout_id not in group.rollout_ids:
            group.rollout_ids.append(attempt.rollout_id)
    return sorted(groups.values(), key=lambda g: -g.count)


def digest_capture(problems: Mapping[str, Sequence[CaptureProblem]]) -> list[FailureGroup]:
    """Group the capture problems of rollouts (by rollout id) by cause, most frequent first; the first message of a
    cause is its example (``3 calls without token ids`` differs only in its count)."""
    groups: dict[CaptureCause, FailureGroup] = {}
    for rollout_id, found in problems.items():
        for problem in found:
            group = groups.get(problem.cause)
            if group is None:
                group = groups[problem.cause] = FailureGroup(
                    AttemptStatus.SUCCEEDED, problem.cause.value, message_pattern(problem.message),
                    example=problem.message, example_rollout_id=rollout_id, cause=problem.cause,
                )  # fmt: skip
            group.count += 1
            group.rollout_ids.append(rollout_id)
    return sorted(groups.values(), key=lambda g: -g.count)


async def build_report(
    store: Store, rollouts: Sequence[Rollout], *, store_label: str = "", seconds: float = 0.0
) -> DevReport:
    """Read attempts and span counts of ``rollouts`` from the store and assemble the report."""
    rows: list[RolloutRow] = []
    all_attempts: list[Attempt] = []
    expects_llm = llm_expected(store)
    for rollout in rollouts:
        attempts = await store.query_attempts(rollout.rollout_id)
        spans = await store.query_spans(rollout.rollout_id)
        all_attempts.extend(attempts)
        failed = [a for a in attempts if a.status not in (AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING)]
        error = None
        if failed:
            type_, message = attempt_error(failed[-1])
            error = f"{type_}: {message}"
        seconds_ = None
        if rollout.ended_at is not None and attempts:
            seconds_ = rollout.ended_at - attempts[0].started_at
        last = [s for s in spans if attempts and s.attempt_id == attempts[-1].attempt_id]
        capture = capture_problems(rollout, last, expects_llm=await expects_llm(rollout.resources_version))
        rows.append(
            RolloutRow(
                rollout_id=rollout.rollout_id,
                task_id=rollout.task.task_id,
                status=rollout.status,
                reward=rollout.reward,
                attempts=len(attempts),
                spans=len(spans),
                seconds=seconds_,
                error=error,
                llm_calls=sum(1 for s in last if s.name == Attr.SPAN_LLM_CALL),
                capture=tuple(capture),
            )
        )
    digest = digest_capture({r.rollout_id: r.capture for r in rows if r.capture}) + digest_failures(all_attempts)
    return DevReport(rows=rows, digest=digest, store=store_label, seconds=seconds)


def may_have_failed(rollout: Rollout) -> bool:
    """True when a rollout can hold a failed attempt: it did not succeed, or it was retried."""
    return rollout.attempts > 1 or rollout.status not in (RolloutStatus.SUCCEEDED, RolloutStatus.QUEUED)


async def failed_attempts(store: Store, rollouts: Iterable[Rollout], *, concurrency: int = 16) -> list[Attempt]:
    """Attempts of ``rollouts`` for `digest_failures`, reading only the rollouts that `may_have_failed` (at most
    ``concurrency`` reads at once), in the order given."""
    import asyncio

    limit = asyncio.Semaphore(concurrency)

    async def one(rollout_id: str) -> list[Attempt]:
        async with limit:
            return await store.query_attempts(rollout_id)

    wanted = [r.rollout_id for r in rollouts if may_have_failed(r)]
    return [a for attempts in await asyncio.gather(*(one(i) for i in wanted)) for a in attempts]


async def print_failure_digest(
    store: Store,
    rollouts: Sequence[Rollout],
    *,
    title: str = "failure digest",
    console: object | None = None,
    stopped: str | None = None,
) -> list[FailureGroup]:
    """Digest the failed attempts of ``rollouts`` and the capture problems of those that succeeded, and print it
    (on rich's global console by default, so a live progress bar stays below it); returns the groups. What training
    loops call after each validation, and when they stop (``stopped``: the cause, printed first)."""
    from rich import get_console

    digest = digest_capture(await read_capture_problems(store, rollouts))
    digest += digest_failures(await failed_attempts(store, rollouts))
    render_digest(digest, console if console is not None else get_console(), title=title, stopped=stopped)
    return digest
