"""The per-attempt tracing context: which rollout and attempt the running code belongs to, and where its spans go.

Concurrency model: the context lives in `contextvars.ContextVar`s, never in process globals, so any number of
attempts run side by side in one process. Every asyncio task runs in its own copy of the context, so an
attempt's agent task and everything it spawns (tasks, ``asyncio.to_thread`` calls, threads started through
``contextvars.copy_context().run``) see that attempt and no other. The `AttemptContext` object itself is shared
by those copies; its mutable fields (``final_reward``, ``cancelled``) are single assignments or a
`threading.Event`, safe from any thread.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from lightrail.types import Span

__all__ = ["AttemptContext", "ListSink", "SpanSink", "attempt_context", "current_attempt", "use_attempt"]


@runtime_checkable
class SpanSink(Protocol):
    """Where the spans of an attempt go. ``submit`` must be cheap, must not block the caller for long and must be
    callable from any thread (emitters call it from agent code, sync agents run in worker threads)."""

    def submit(self, span: Span) -> None: ...


class ListSink:
    """A `SpanSink` that keeps spans in a list: for tests of code that emits spans, and for debugging.

    Example::

        sink = ListSink()
        with attempt_context("ro-1", "at-1", sink):
            emit_reward(1.0)
        assert sink.spans[0].attributes[Attr.REWARD] == 1.0
    """

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def submit(self, span: Span) -> None:
        self.spans.append(span)  # list.append is atomic under the GIL: safe from any thread


@dataclass(eq=False)
class AttemptContext:
    """What emitters need to know about the attempt they run in."""

    rollout_id: str
    attempt_id: str
    sink: SpanSink
    trace_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """One trace per attempt: every span the runner and emitters write for it carries this id."""
    final_reward: float | None = None
    """The last final reward emitted in this attempt (what the attempt reports if the agent returns None)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when the attempt stopped being ours (cancelled, lost, timed out, runner shutdown). Async agents are
    cancelled outright; sync agents in threads cannot be interrupted and may check this to stop early."""


_attempt: ContextVar[AttemptContext | None] = ContextVar("lightrail_attempt", default=None)
_parent_span: ContextVar[str | None] = ContextVar("lightrail_parent_span", default=None)


def current_attempt() -> AttemptContext | None:
    """The attempt the calling code runs in, or None outside a rollout."""
    return _attempt.get()


@contextlib.contextmanager
def attempt_context(
    rollout_id: str,
    attempt_id: str,
    sink: SpanSink,
    *,
    trace_id: str | None = None,
    parent_span_id: str | None = None,
) -> Iterator[AttemptContext]:
    """Run the enclosed code as part of an attempt: emitters inside write spans for it into ``sink``.

    The runner does this for every attempt; use it directly to test code that emits spans (with a `ListSink`).
    ``parent_span_id`` makes spans emitted inside children of that span (the runner's root rollout span).
    """
    ctx = AttemptContext(rollout_id, attempt_id, sink)
    if trace_id:
        ctx.trace_id = trace_id
    with use_attempt(ctx, parent_span_id=parent_span_id):
        yield ctx


@contextlib.contextmanager
def use_attempt(ctx: AttemptContext, *, parent_span_id: str | None = None) -> Iterator[AttemptContext]:
    """Like `attempt_context`, for an `AttemptContext` built by the caller (the runner keeps a handle on it)."""
    token = _attempt.set(ctx)
    parent_token = _parent_span.set(parent_span_id)
    try:
        yield ctx
    finally:
        _parent_span.reset(parent_token)
        _attempt.reset(token)
