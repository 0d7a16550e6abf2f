"""Emitters: what agent code calls to record rewards, events, messages, exceptions and its own spans.

Every emitter turns into one `Span` handed to the current attempt's sink (see `lightrail.tracing._context`);
creating it is a cheap in-memory append, never I/O, so emitting inside a hot agent loop costs microseconds.
Outside a rollout (the agent run by hand, a unit test) emitters warn once and do nothing: instrumentation
must never crash user code.

Concurrency model: no shared mutable state besides the once-only warning set; everything else comes from the
caller's context (contextvars), so concurrent attempts in tasks or threads never see each other's spans.
"""

from __future__ import annotations

import math
import numbers
import time
import traceback
import uuid
import warnings
from contextvars import Token
from typing import Any

from lightrail.tracing._context import AttemptContext, _attempt, _parent_span
from lightrail.types import JSON, Attr, Span, SpanEvent, SpanStatus, StatusCode, next_seq

__all__ = ["emit_event", "emit_exception", "emit_message", "emit_reward", "exception_attributes", "span"]

_warned: set[str] = set()


def _context(emitter: str) -> AttemptContext | None:
    ctx = _attempt.get()
    if ctx is None and emitter not in _warned:
        _warned.add(emitter)  # once per process and emitter: a warning per call would flood an agent's loop
        warnings.warn(
            f"lightrail.{emitter}() called outside a rollout; ignored (this warning is shown once)",
            RuntimeWarning,
            stacklevel=3,
        )
    return ctx


def _instant_span(
    ctx: AttemptContext, name: str, attributes: dict[str, JSON], status: SpanStatus | None = None
) -> Span:
    now = time.time()
    return Span(
        rollout_id=ctx.rollout_id,
        attempt_id=ctx.attempt_id,
        seq=next_seq(),
        name=name,
        trace_id=ctx.trace_id,
        parent_id=_parent_span.get(),
        start_time=now,
        end_time=now,
        attributes=attributes,
        status=status if status is not None else SpanStatus(code=StatusCode.OK),
    )


def emit_reward(
    value: float,
    *,
    name: str = "reward",
    intermediate: bool = False,
    response_id: str | None = None,
    attributes: dict[str, JSON] | None = None,
) -> Span | None:
    """Record a reward for the current attempt; returns the span written (None outside a rollout).

    A final reward (the default) is what the attempt reports when the agent returns None: the last one emitted
    wins, and a float returned by the agent wins over all of them. ``intermediate=True`` records a per-step
    reward for credit assignment, linked to the LLM call it follows by ``response_id`` (the ``id`` of the chat
    completion the agent received), when given.

    Example::

        reply = client.chat.completions.create(...)
        emit_reward(0.2, intermediate=True, response_id=reply.id)   # this step was useful
        ...
        emit_reward(1.0)                                            # the episode succeeded
    """
    if not isinstance(value, numbers.Real):
        raise TypeError(f"reward must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):  # NaN is stored as null and would read as "no reward": refused where it is made
        raise ValueError(f"reward must be a finite number, got {value}")
    ctx = _context("emit_reward")
    if ctx is None:
        return None
    reward = float(value)
    attrs: dict[str, JSON] = dict(attributes) if attributes else {}
    attrs[Attr.REWARD] = reward
    attrs[Attr.REWARD_NAME] = name
    attrs[Attr.REWARD_FINAL] = not intermediate
    if response_id is not None:
        attrs[Attr.LINKED_RESPONSE_ID] = response_id
    span = _instant_span(ctx, Attr.SPAN_REWARD, attrs)
    if not intermediate:
        ctx.final_reward = reward
    ctx.sink.submit(span)
    return span


def emit_event(name: str, **attributes: JSON) -> Span | None:
    """Record that something happened (a tool call, a retrieval, a decision), with JSON-serialisable attributes.

    Example::

        emit_event("tool_call", tool="calculator", expression="3*4")
    """
    ctx = _context("emit_event")
    if ctx is None:
        return None
    attrs: dict[str, JSON] = dict(attributes)
    attrs[Attr.EVENT_NAME] = name
    span = _instant_span(ctx, Attr.SPAN_EVENT, attrs)
    ctx.sink.submit(span)
    return span


def emit_message(message: str, **attributes: JSON) -> Span | None:
    """Record a free-text message (a log line, the agent's reasoning, a note for whoever reads the trace) as a
    span of the current attempt, with JSON-serialisable attributes; the dashboard shows it in the attempt's
    timeline. Returns the span written (None outside a rollout).

    Example::

        emit_message(f"retrying with a shorter query ({len(docs)} hits)", step=3)
    """
    if not isinstance(message, str):
        raise TypeError(f"message must be a str, got {type(message).__name__}")
    ctx = _context("emit_message")
    if ctx is None:
        return None
    attrs: dict[str, JSON] = dict(attributes)
    attrs[Attr.MESSAGE_BODY] = message
    span = _instant_span(ctx, Attr.SPAN_MESSAGE, attrs)
    ctx.sink.submit(span)
    return span


def exception_attributes(exc: BaseException) -> dict[str, JSON]:
    """OpenTelemetry's ``exception.*`` attributes for ``exc``."""
    cls = type(exc)
    qualname = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return {
        Attr.EXCEPTION_TYPE: qualname,
        Attr.EXCEPTION_MESSAGE: str(exc),
        Attr.EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exc)),
    }


def emit_exception(exc: BaseException, **attributes: JSON) -> Span | None:
    """Record an exception (type, message, stack trace) as a span; the runner does this for an agent's uncaught
    exception, agents may do it for ones they handle."""
    ctx = _context("emit_exception")
    if ctx is None:
        return None
    attrs: dict[str, JSON] = dict(attributes)
    attrs.update(exception_attributes(exc))
    span = _instant_span(ctx, Attr.SPAN_EXCEPTION, attrs, SpanStatus(code=StatusCode.ERROR, message=str(exc)))
    ctx.sink.submit(span)
    return span


class span:  # noqa: N801 - used like a function: ``with span("retrieve"):``
    """A span around a block of user code (``with`` or ``async with``), nested under the enclosing span.

    Records start and end time and the status: OK, or ERROR with an ``exception`` event when the block raises
    (the exception propagates). Spans emitted inside the block get it as their parent. Outside a rollout it
    does nothing.

    Example::

        with span("retrieve", query=q) as s:
            docs = search(q)
            s.set_attribute("hits", len(docs))
    """

    __slots__ = ("name", "attributes", "span_id", "_ctx", "_start", "_seq", "_parent", "_token")

    def __init__(self, name: str, **attributes: JSON) -> None:
        self.name = name
        self.attributes: dict[str, JSON] = attributes
        self.span_id = uuid.uuid4().hex[:16]
        self._ctx: AttemptContext | None = None
        self._token: Token[str | None] | None = None

    def set_attribute(self, key: str, value: JSON) -> None:
        """Add or replace an attribute before the span ends."""
        self.attributes[key] = value

    def __enter__(self) -> span:
        self._ctx = _context("span")
        if self._ctx is not None:
            self._start = time.time()
            self._seq = next_seq()
            self._parent = _parent_span.get()
            self._token = _parent_span.set(self.span_id)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        if self._token is not None:
            _parent_span.reset(self._token)
            self._token = None
        events: list[SpanEvent] = []
        if exc is None:
            status = SpanStatus(code=StatusCode.OK)
        else:
            status = SpanStatus(code=StatusCode.ERROR, message=f"{exc_type.__name__ if exc_type else ''}: {exc}")
            events.append(SpanEvent(name="exception", time=time.time(), attributes=exception_attributes(exc)))
        ctx.sink.submit(
            Span(
                rollout_id=ctx.rollout_id,
                attempt_id=ctx.attempt_id,
                seq=self._seq,
                name=self.name,
                span_id=self.span_id,
                trace_id=ctx.trace_id,
                parent_id=self._parent,
                start_time=self._start,
                end_time=time.time(),
                attributes=self.attributes,
                events=events,
                status=status,
            )
        )

    async def __aenter__(self) -> span:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)
