"""Reading a store after the fact: the runs it holds, its rollouts, one rollout's spans and messages, and the
failure digest. What ``lightrail runs | rollouts | show | failures`` print (`lightrail.inspection.cli`).

**What a run is.** The store records rollouts, attempts, spans and resources, not runs, so runs are derived
(`derive_runs`): rollouts whose metadata names their run form that run (``run``: the trainer tags every rollout of
`Trainer.fit` with the algorithm's ``out_dir`` and of `Trainer.dev` with ``dev-<time>``; ``apo_run`` as `APO` tags
its own). Untagged rollouts (enqueued by other code) are cut into sessions in enqueue order, a new session
starting when a rollout is enqueued more than ``gap_s`` after every earlier untagged rollout had ended. Runs are
numbered 1, 2, ... by their first rollout, which keeps the numbers stable as a store grows.

**Paging.** `rollouts_page` asks the store for one page (`Store.query_rollouts_page`: status, mode and a run's tag
filtered and paged by the store), so a page costs the same in a store of 100,000 rollouts. Only a run named by its
number, or an untagged session, needs the runs derived, which reads every rollout once. Attempts and spans are read
only for the rollouts shown (or, for the digest, the ones that may hold a failed attempt and, for their capture
problems, the ones that succeeded, at most ``limit`` of each).

Rendering uses rich with plain text when the output is not a terminal (no colours, no wrapping of ids).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightrail.inspection.capture import read_capture_problems
from lightrail.inspection.report import (
    FailureGroup,
    attempt_error,
    digest_capture,
    digest_failures,
    failed_attempts,
    may_have_failed,
)
from lightrail.store.base import MAX_PAGE, Store
from lightrail.types import Attempt, AttemptStatus, Attr, Rollout, RolloutStatus, Span, call_agent_name

if TYPE_CHECKING:
    from rich.console import JustifyMethod

__all__ = [
    "DEFAULT_GAP_S",
    "RUN_TAGS",
    "Run",
    "derive_runs",
    "failure_digest",
    "render_rollout",
    "render_rollouts",
    "render_runs",
    "rollouts_page",
    "run_stop",
    "training_stop",
]

RUN_TAGS = ("run", "apo_run")
"""Rollout metadata keys that name a rollout's run, first found wins."""

DEFAULT_GAP_S = 600.0
"""Idle time after which the next untagged rollout starts a new run."""


@dataclass
class Run:
    """Rollouts of one run, in enqueue order."""

    number: int
    tag: str | None
    """The run id the rollouts carry in their metadata; None for a session derived from enqueue times."""
    rollouts: list[Rollout] = field(default_factory=list)

    @property
    def started(self) -> float:
        return self.rollouts[0].created_at

    @property
    def last_activity(self) -> float:
        return max(r.ended_at or r.created_at for r in self.rollouts)

    @property
    def counts(self) -> dict[RolloutStatus, int]:
        out: dict[RolloutStatus, int] = {}
        for rollout in self.rollouts:
            out[rollout.status] = out.get(rollout.status, 0) + 1
        return out

    @property
    def modes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rollout in self.rollouts:
            out[rollout.mode] = out.get(rollout.mode, 0) + 1
        return out

    @property
    def mean_reward(self) -> float | None:
        rewards = [r.reward for r in self.rollouts if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else None

    @property
    def resources_versions(self) -> tuple[int, int] | None:
        versions = [r.resources_version for r in self.rollouts if r.resources_version is not None]
        return (min(versions), max(versions)) if versions else None


def run_tag(rollout: Rollout) -> str | None:
    """The run a rollout's metadata names (`RUN_TAGS`), if any."""
    for key in RUN_TAGS:
        value = rollout.metadata.get(key)
        if value is not None:
            return str(value)
    return None


def derive_runs(rollouts: Iterable[Rollout], gap_s: float = DEFAULT_GAP_S) -> list[Run]:
    """Group rollouts (in enqueue order) into runs as the module docstring says; runs are numbered by their first
    rollout.

    >>> from lightrail.types import RetryPolicy, Task
    >>> def r(t, end): return Rollout(rollout_id=f"ro-{t}", task=Task(input=0), mode="train", sample_index=0,
    ...     resources_version=None, policy=RetryPolicy(), status=RolloutStatus.SUCCEEDED, created_at=t, ended_at=end)
    >>> [len(run.rollouts) for run in derive_runs([r(0, 5), r(1, 6), r(100, 101)], gap_s=60)]
    [2, 1]
    """
    runs: list[Run] = []
    tagged: dict[str, Run] = {}
    session: Run | None = None
    session_end = 0.0
    for rollout in rollouts:
        tag = run_tag(rollout)
        if tag is not None:
            run = tagged.get(tag)
            if run is None:
                run = tagged[tag] = Run(number=0, tag=tag)
                runs.append(run)
            run.rollouts.append(rollout)
            continue
        if session is None or rollout.created_at - session_end > gap_s:
            session = Run(number=0, tag=None)
            runs.append(session)
            session_end = rollout.created_at
        session.rollouts.append(rollout)
        # a rollout still running keeps its session open for as long as it has been running
        session_end = max(session_end, rollout.ended_at or rollout.created_at)
    runs.sort(key=lambda run: run.started)
    for number, run in enumerate(runs, 1):
        run.number = number
    return runs


def _pick_run(runs: Sequence[Run], run: str) -> Run:
    for candidate in runs:
        if str(candidate.number) == run or candidate.tag == run:
            return candidate
    known = ", ".join(str(r.number) + (f" ({r.tag})" if r.tag else "") for r in runs) or "none"
    raise LookupError(f"no run {run!r} in this store (runs: {known})")


async def rollouts_page(
    store: Store,
    *,
    status: Sequence[RolloutStatus] | None = None,
    mode: str | None = None,
    run: str | None = None,
    limit: int = 20,
    offset: int = 0,
    gap_s: float = DEFAULT_GAP_S,
) -> tuple[list[Rollout], int]:
    """The matching rollouts newest first, ``offset`` skipped, at most ``limit``; and how many match in all."""
    tags = None if run is None or run.isdigit() else {RUN_TAGS[0]: run}
    if limit <= MAX_PAGE and (run is None or tags is not None):  # the store pages; else read all, derive runs
        page = await store.query_rollouts_page(status=status, mode=mode, metadata=tags, limit=limit, offset=offset)
        if run is None or page.total:  # a tag no rollout carries as "run" may still name a run (apo_run)
            return page.rollouts, page.total
    if run is not None:
        chosen = _pick_run(derive_runs(await store.query_rollouts(), gap_s), run).rollouts
        wanted = None if status is None else set(status)
        matching = [r for r in chosen if wanted is None or r.status in wanted]
    else:
        matching = await store.query_rollouts(status=status)
    if mode is not None:
        matching = [r for r in matching if r.mode == mode]
    matching.reverse()
    return matching[offset : offset + limit], len(matching)


async def failure_digest(
    store: Store,
    *,
    run: str | None = None,
    limit: int = 500,
    gap_s: float = DEFAULT_GAP_S,
    since: float | None = None,
) -> tuple[list[FailureGroup], int, int]:
    """The digest of failed attempts among the newest ``limit`` rollouts that may hold one (of a run, or of the
    whole store; enqueued at or after ``since``, a Unix time, when given), with the capture problems of the newest
    ``limit`` that succeeded; returns it with how many rollouts that may have failed were read and how many could
    have been."""
    rollouts = await store.query_rollouts()
    if run is not None:
        rollouts = _pick_run(derive_runs(rollouts, gap_s), run).rollouts
    if since is not None:
        rollouts = [r for r in rollouts if r.created_at >= since]
    candidates = [r for r in rollouts if may_have_failed(r)]
    read = candidates[-limit:] if limit > 0 else candidates
    succeeded = [r for r in rollouts if r.status is RolloutStatus.SUCCEEDED]
    captured = await read_capture_problems(store, succeeded[-limit:] if limit > 0 else succeeded)
    return digest_capture(captured) + digest_failures(await failed_attempts(store, read)), len(read), len(candidates)


def training_stop(run: Run) -> str | None:
    """Why ``run``'s training stopped early (e.g. a weight sync that did not take), from the last ``kind: stop`` line
    of the ``metrics.jsonl`` in its tag's folder (the algorithm's ``out_dir``); None when it did not stop, or when
    that folder cannot be read from here."""
    if not run.tag:
        return None
    try:
        lines = (Path(run.tag) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "stop":
            return f"at step {record.get('step', '?')}: {record.get('cause', '')}"
    return None


async def run_stop(store: Store, run: str, gap_s: float = DEFAULT_GAP_S) -> str | None:
    """`training_stop` of the run named ``run`` (its number or tag) in ``store``."""
    return training_stop(_pick_run(derive_runs(await store.query_rollouts(), gap_s), run))


async def rollout_details(store: Store, rollout_id: str, attempt: int | None = None) -> RolloutDetails:
    """A rollout, its attempts and the spans of one attempt (``attempt`` is its index: 1, 2, ...; default the
    last)."""
    rollout = await store.get_rollout(rollout_id)
    attempts = await store.query_attempts(rollout_id)
    if attempt is None:
        shown = attempts[-1] if attempts else None
    else:  # an index the rollout does not have is an error, also when it has none yet
        shown = next((a for a in attempts if a.index == attempt), None)
        if shown is None:
            raise LookupError(f"rollout {rollout_id} has attempts {[a.index for a in attempts]}, not {attempt}")
    spans = [] if shown is None else await store.query_spans(rollout_id, shown.attempt_id)
    return RolloutDetails(rollout, attempts, shown, spans)


@dataclass
class RolloutDetails:
    rollout: Rollout
    attempts: list[Attempt]
    attempt: Attempt | None
    """The attempt whose spans are shown."""
    spans: list[Span]


# -- rendering ------------------------------------------------------------------------------------------------

_STATUS_STYLE = {"succeeded": "green", "running": "cyan", "queued": "cyan", "cancelled": "yellow"}


def _status(status: RolloutStatus | AttemptStatus) -> str:
    style = _STATUS_STYLE.get(status.value, "red")
    return f"[{style}]{status.value}[/{style}]"


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _counts(counts: dict[Any, int]) -> str:
    return ", ".join(f"{n} {getattr(k, 'value', k)}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_runs(runs: Sequence[Run], console: Any, *, store_label: str = "") -> None:
    """One row per run: when, how many rollouts by status and mode, mean reward, resources versions."""
    from rich.markup import escape
    from rich.table import Table

    if not runs:
        console.print(f"no rollouts in {escape(store_label) or 'this store'}")
        return
    table = Table(title=f"runs in {escape(store_label)}" if store_label else "runs", title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("run", "right"), ("tag", "left"), ("started", "left"), ("last activity", "left"), ("rollouts", "right"),
        ("status", "left"), ("modes", "left"), ("mean reward", "right"), ("resources", "left"),
    ]  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("run", "tag", "started", "last activity"))
    for run in runs:
        versions = run.resources_versions
        table.add_row(
            str(run.number),
            escape(run.tag or "-"),
            _when(run.started),
            _when(run.last_activity),
            str(len(run.rollouts)),
            _counts(run.counts),
            _counts(run.modes),
            _reward(run.mean_reward),
            "-"
            if versions is None
            else f"v{versions[0]}" + (f"..v{versions[1]}" if versions[1] != versions[0] else ""),
        )
    console.print(table)


def render_rollouts(
    rollouts: Sequence[Rollout], errors: dict[str, str], console: Any, *, total: int, offset: int, what: str
) -> None:
    """A table of rollouts (newest first) with the last error of each, and which slice of ``total`` it is."""
    from rich.markup import escape
    from rich.table import Table

    if not rollouts:
        console.print(f"no {what}" + (f" past offset {offset} (of {total})" if total else ""))
        return
    table = Table(title=what, title_justify="left")
    columns: list[tuple[str, JustifyMethod]] = [
        ("rollout", "left"), ("status", "left"), ("mode", "left"), ("task", "left"), ("reward", "right"),
        ("attempts", "right"), ("enqueued", "left"), ("seconds", "right"), ("error", "left"),
    ]  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name != "error", overflow="fold")
    for r in rollouts:
        table.add_row(
            r.rollout_id,
            _status(r.status),
            r.mode,
            escape(r.task.task_id),
            _reward(r.reward),
            str(r.attempts),
            _when(r.created_at),
            "-" if r.ended_at is None else f"{r.ended_at - r.created_at:.2f}",
            escape(errors.get(r.rollout_id, "")),
        )
    console.print(table)
    more = total - offset - len(rollouts)
    console.print(
        f"{offset + 1}-{offset + len(rollouts)} of {total} {what}, newest first"
        + (f"; --offset {offset + len(rollouts)} for the next {min(more, len(rollouts))}" if more > 0 else "")
    )


def last_error(attempts: Sequence[Attempt]) -> str:
    """``Type: message`` of the last attempt that ended without success ('' if none did)."""
    failed = [a for a in attempts if a.status not in (AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING)]
    if not failed:
        return ""
    type_, message = attempt_error(failed[-1])
    return _short(f"{type_}: {message}" if message else type_, 120)


def render_rollout(details: RolloutDetails, console: Any, *, full: bool = False) -> None:
    """The rollout, its attempts, the span tree of the attempt shown and the conversation its LLM calls had."""
    from rich.markup import escape
    from rich.table import Table

    r = details.rollout
    limit = None if full else 2000
    console.print(f"[bold]rollout {r.rollout_id}[/bold]  {_status(r.status)}  reward {_reward(r.reward)}")
    task = json.dumps(r.task.input, ensure_ascii=False, default=str)
    lines = [
        f"task {escape(r.task.task_id)}: {escape(_clip(task, limit))}",
        f"mode {r.mode}, sample {r.sample_index}, resources version {r.resources_version}, "
        f"enqueued {_when(r.created_at)}, ended {_when(r.ended_at)}",
    ]
    if r.metadata:
        lines.append(f"metadata: {escape(json.dumps(r.metadata, default=str))}")
    for line in lines:
        console.print(line, soft_wrap=True)
    if details.attempts:
        table = Table(title="attempts", title_justify="left")
        for name in ("#", "attempt", "worker", "status", "reward", "seconds", "error"):
            table.add_column(name, no_wrap=name != "error", overflow="fold")
        for a in details.attempts:
            error = ""
            if a.status not in (AttemptStatus.SUCCEEDED, AttemptStatus.RUNNING):
                type_, message = attempt_error(a)
                error = f"{type_}: {message}" if message else type_
            table.add_row(
                str(a.index), a.attempt_id, escape(a.worker_id), _status(a.status), _reward(a.reward),
                "-" if a.ended_at is None else f"{a.ended_at - a.started_at:.2f}", escape(_short(error, 200)),
            )  # fmt: skip
        console.print(table)
    else:
        console.print("no attempts yet")
        return
    attempt = details.attempt
    assert attempt is not None
    console.print(f"[bold]spans of attempt {attempt.index}[/bold] ({len(details.spans)})")
    if details.spans:
        console.print(span_tree(details.spans))
    if attempt.error is not None and attempt.error.traceback:
        console.print("[bold]traceback[/bold]")
        console.print(escape(_clip(attempt.error.traceback.rstrip(), limit)), soft_wrap=True, highlight=False)
    conversation = list(_conversation(details.spans, limit))
    if conversation:
        console.print("[bold]messages[/bold]")
        for line in conversation:
            console.print(line, soft_wrap=True, highlight=False)


def _clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + f"… ({len(text) - limit} more characters; --full shows all)"


def ordered_spans(spans: Iterable[Span]) -> list[Span]:
    """Spans in the order they started (``seq`` breaks ties)."""
    return sorted(spans, key=lambda s: (s.start_time, s.seq))


def span_children(spans: Sequence[Span]) -> tuple[list[Span], dict[str, list[Span]]]:
    """An attempt's spans as a tree by parent id: the roots and each span's children, all in start order. Spans
    whose parent is not among them (the gateway's call spans without a ``traceparent``) hang under the runner's
    rollout span when there is exactly one."""
    by_id = {s.span_id: s for s in spans}
    roots: list[Span] = []
    children: dict[str, list[Span]] = {}
    for span in ordered_spans(spans):
        if span.parent_id in by_id:
            children.setdefault(span.parent_id, []).append(span)
        else:
            roots.append(span)
    top = [s for s in roots if s.name == Attr.SPAN_ROLLOUT]
    if len(top) == 1:
        children[top[0].span_id] = ordered_spans(
            children.get(top[0].span_id, []) + [s for s in roots if s is not top[0]]
        )
        roots = top
    return roots, children


def span_tree(spans: Sequence[Span]) -> Any:
    """A rich `Tree` of an attempt's spans (`span_children`)."""
    from rich.tree import Tree

    roots, children = span_children(spans)
    tree = Tree(f"attempt {spans[0].attempt_id}", guide_style="dim")

    def add(node: Any, span: Span) -> None:
        branch = node.add(span_label(span))
        for child in children.get(span.span_id, []):
            add(branch, child)

    for root in roots:
        add(tree, root)
    return tree


def span_label(span: Span) -> str:
    """One line saying what a span is: its kind, duration and the attributes that matter for it."""
    from rich.markup import escape

    a = span.attributes
    took = "" if span.end_time is None else f"  {1000 * (span.end_time - span.start_time):.0f} ms"
    error = ""
    if span.status.code == "error":
        error = f"  [red]error: {escape(_short(span.status.message, 160))}[/red]"
    if span.name == Attr.SPAN_LLM_CALL:
        prompt = a.get(Attr.PROMPT_IDS)
        choices = a.get(Attr.CHOICES) or []
        answer = [len(c.get("token_ids") or []) for c in choices if isinstance(c, dict)]
        parts = [
            f"[bold]llm call[/bold] {escape(str(a.get(Attr.ENDPOINT, '')))}",
            f"model {escape(str(a.get(Attr.MODEL)))}",
        ]
        if isinstance(prompt, list):
            parts.append(f"{len(prompt)} prompt tokens → {'+'.join(map(str, answer)) or 0} generated")
        if a.get(Attr.POLICY_VERSION) is not None:
            parts.append(f"policy v{a[Attr.POLICY_VERSION]}")
        if agent := call_agent_name(a):
            parts.append(f"agent {escape(str(agent))}")
        return "  ".join(parts) + took + error
    if span.name == Attr.SPAN_REWARD:
        kind = "final" if a.get(Attr.REWARD_FINAL, True) else "intermediate"
        return f"[bold]reward[/bold] {escape(str(a.get(Attr.REWARD_NAME, 'reward')))} = {a.get(Attr.REWARD)} ({kind})"
    if span.name == Attr.SPAN_EVENT:
        rest = {k: v for k, v in a.items() if k != Attr.EVENT_NAME}
        shown = escape(_short(json.dumps(rest, default=str), 160)) if rest else ""
        return f"[bold]event[/bold] {escape(str(a.get(Attr.EVENT_NAME, '')))} {shown}".rstrip()
    if span.name == Attr.SPAN_MESSAGE:
        return f"[bold]message[/bold] {escape(_short(str(a.get(Attr.MESSAGE_BODY, '')), 160))}"
    if span.name == Attr.SPAN_EXCEPTION:
        message = escape(_short(str(a.get(Attr.EXCEPTION_MESSAGE, "")), 160))
        return f"[bold red]exception[/bold red] {escape(str(a.get(Attr.EXCEPTION_TYPE, '')))}: {message}"
    if span.name == Attr.SPAN_ROLLOUT:
        return (
            f"[bold]rollout[/bold] attempt {a.get('lightrail.attempt.index')} {a.get('lightrail.attempt.status')} "
            f"on {escape(str(a.get('lightrail.worker_id')))}{took}{error}"
        )
    extra = [f"{k.rsplit('.', 1)[-1]} {escape(str(a[k]))}" for k in (Attr.KIND, Attr.TOOL_NAME) if a.get(k)]
    return "  ".join([escape(span.name), *extra]) + took + error


def _conversation(spans: Sequence[Span], limit: int | None) -> Iterable[str]:
    """Lines of the conversation the attempt's LLM calls had: each call's messages not already shown by the call
    before it (agents resend the whole history), then its answer."""
    shown: list[Any] = []
    calls = [s for s in ordered_spans(spans) if s.name == Attr.SPAN_LLM_CALL]
    for number, span in enumerate(calls, 1):
        request, response = span.attributes.get(Attr.REQUEST), span.attributes.get(Attr.RESPONSE)
        yield f"[dim]── call {number}[/dim]"
        if isinstance(request, dict) and isinstance(request.get("messages"), list):
            messages = request["messages"]
            seen = [_said(m) for m in shown]
            new = messages[len(shown) :] if [_said(m) for m in messages[: len(shown)]] == seen else messages
            if new is messages and shown:
                yield "[dim](a new conversation)[/dim]"
            for message in new:
                yield _message_line(message, limit)
            shown = list(messages)
        elif isinstance(request, dict) and "prompt" in request:
            yield _message_line({"role": "prompt", "content": request["prompt"]}, limit)
        if not isinstance(response, dict):
            if span.status.message:
                yield f"[red]no answer: {_escape(span.status.message)}[/red]"
            continue
        choices = response.get("choices") or []
        for i, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            message = choice.get("message") or {"role": "completion", "content": choice.get("text", "")}
            label = f" (choice {i})" if len(choices) > 1 else ""
            yield _message_line(message, limit, suffix=label)
            if i == 0 and isinstance(choice.get("message"), dict):
                shown.append(choice["message"])


def _said(message: Any) -> tuple[Any, str, Any]:
    """What a message says, for telling whether a request repeats the history: the recorded answer carries fields
    (``refusal``, ``annotations``, nulls) the agent drops when it sends the answer back."""
    if not isinstance(message, dict):
        return (None, str(message), None)
    calls = [c.get("function") if isinstance(c, dict) else c for c in message.get("tool_calls") or ()]
    return (message.get("role"), _content_text(message.get("content")), calls or None)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(p.get("text", f"<{p.get('type')}>") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, default=str)


_ROLE_STYLE = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}


def _message_line(message: Any, limit: int | None, *, suffix: str = "") -> str:
    if not isinstance(message, dict):
        return _escape(_clip(str(message), limit))
    role = str(message.get("role", "?"))
    style = _ROLE_STYLE.get(role, "bold")
    head = f"[{style}]{_escape(role)}[/{style}]{_escape(suffix)}"
    if message.get("name"):
        head += f" ({_escape(str(message['name']))})"
    if message.get("tool_call_id"):
        head += f" [{_escape(str(message['tool_call_id']))}]"
    text = _content_text(message.get("content"))
    if text and not text.strip():  # whitespace only: show it quoted rather than as blank lines
        text = json.dumps(text)
    lines = [f"{head}: {_escape(_clip(text, limit))}" if text else f"{head}:"]
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = _clip(str(fn.get("arguments", "")), limit)
        lines.append(f"    → {_escape(str(fn.get('name')))}({_escape(arguments)}) [{_escape(str(call.get('id', '')))}]")
    return "\n".join(lines)
