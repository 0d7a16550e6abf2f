"""Tracing inside rollouts: the per-attempt context, emitters, and shipping spans to the store.

Agent code calls `emit_reward`, `emit_event`, `emit_message`, `emit_exception` and `span`; each becomes a `Span` of
the attempt the code runs in. `as_agent` names the agent behind the LLM calls made inside it (`naming`). The attempt is found through `contextvars` (never a process global), so one process can run
many rollouts at once in asyncio tasks and threads without mixing their spans; the runner sets the context up
and gives each attempt a `SpanBatcher` as its sink. Pure Python: OpenTelemetry is not imported here.

Example::

    from lightrail import emit_reward, emit_event

    def my_agent(task, llm):
        emit_event("start", difficulty=task["level"])
        ...
        emit_reward(1.0 if correct else 0.0)
"""

from lightrail.tracing._context import (
    AttemptContext,
    ListSink,
    SpanSink,
    attempt_context,
    current_attempt,
    use_attempt,
)
from lightrail.tracing.batcher import SpanBatcher
from lightrail.tracing.emitters import (
    emit_event,
    emit_exception,
    emit_message,
    emit_reward,
    exception_attributes,
    span,
)
from lightrail.tracing.naming import as_agent, named_agent

__all__ = [
    "AttemptContext",
    "ListSink",
    "SpanBatcher",
    "SpanSink",
    "as_agent",
    "attempt_context",
    "current_attempt",
    "emit_event",
    "emit_exception",
    "emit_message",
    "emit_reward",
    "exception_attributes",
    "named_agent",
    "span",
    "use_attempt",
]
