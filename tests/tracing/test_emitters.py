"""Emitters and the per-attempt context: spans land in their own attempt, in tasks and threads alike."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
import warnings

import pytest

from lightrail.tracing import (
    ListSink,
    attempt_context,
    current_attempt,
    emit_event,
    emit_exception,
    emit_message,
    emit_reward,
    span,
)
from lightrail.tracing import emitters as emitters_module
from lightrail.types import Attr, StatusCode


@pytest.fixture(autouse=True)
def fresh_warnings():
    emitters_module._warned.clear()  # the once-per-process warning must be observable in each test
    yield
    emitters_module._warned.clear()


def test_emit_outside_a_rollout_warns_once_and_does_nothing():
    with pytest.warns(RuntimeWarning, match="outside a rollout"):
        assert emit_reward(1.0) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second call must not warn again (nor raise)
        assert emit_reward(2.0) is None
    with pytest.warns(RuntimeWarning):
        assert emit_event("x", a=1) is None
    with pytest.warns(RuntimeWarning), span("block") as s:
        s.set_attribute("k", 1)  # usable, just not recorded


def test_rewards_final_intermediate_and_linked():
    sink = ListSink()
    with attempt_context("ro-1", "at-1", sink) as ctx:
        emit_reward(0.25, intermediate=True, response_id="chatcmpl-1")
        assert ctx.final_reward is None
        emit_reward(0.5)
        emit_reward(1, name="accuracy", attributes={"judge": "exact"})
        assert ctx.final_reward == 1.0
    step, first, last = sink.spans
    assert step.name == Attr.SPAN_REWARD
    assert step.attributes[Attr.REWARD_FINAL] is False
    assert step.attributes[Attr.LINKED_RESPONSE_ID] == "chatcmpl-1"
    assert last.attributes == {
        "judge": "exact",
        Attr.REWARD: 1.0,
        Attr.REWARD_NAME: "accuracy",
        Attr.REWARD_FINAL: True,
    }
    assert {s.rollout_id for s in sink.spans} == {"ro-1"} and {s.attempt_id for s in sink.spans} == {"at-1"}
    assert len({s.trace_id for s in sink.spans}) == 1
    assert step.seq < first.seq < last.seq
    with attempt_context("ro-1", "at-1", sink), pytest.raises(TypeError):
        emit_reward("high")  # type: ignore[arg-type]


def test_events_exceptions_and_nested_spans():
    sink = ListSink()
    with attempt_context("ro-1", "at-1", sink, parent_span_id="root"):
        emit_event("tool_call", tool="calc")
        with span("outer", k=1) as outer:
            emit_event("inside")
            with pytest.raises(KeyError), span("inner"):
                raise KeyError("boom")
        try:
            raise ValueError("bad value 3")
        except ValueError as exc:
            emit_exception(exc, where="parse")
    by_name = {s.name if s.name != Attr.SPAN_EVENT else s.attributes[Attr.EVENT_NAME]: s for s in sink.spans}
    assert by_name["tool_call"].attributes["tool"] == "calc"
    assert by_name["tool_call"].parent_id == "root"
    assert by_name["inside"].parent_id == outer.span_id
    assert by_name["outer"].parent_id == "root"
    assert by_name["outer"].status.code is StatusCode.OK
    assert by_name["outer"].end_time >= by_name["outer"].start_time
    inner = by_name["inner"]
    assert inner.parent_id == outer.span_id and inner.status.code is StatusCode.ERROR
    assert inner.events[0].attributes[Attr.EXCEPTION_TYPE] == "KeyError"
    exc_span = by_name[Attr.SPAN_EXCEPTION]
    assert exc_span.attributes[Attr.EXCEPTION_TYPE] == "ValueError"
    assert exc_span.attributes[Attr.EXCEPTION_MESSAGE] == "bad value 3"
    assert "raise ValueError" in exc_span.attributes[Attr.EXCEPTION_STACKTRACE]
    assert exc_span.attributes["where"] == "parse"
    assert current_attempt() is None


def test_messages_are_spans_of_their_attempt_under_the_enclosing_span():
    sink = ListSink()
    with attempt_context("ro-1", "at-1", sink, parent_span_id="root"):
        with span("plan") as plan:
            message = emit_message("retrying with a shorter query", step=3)
        with pytest.raises(TypeError):
            emit_message({"not": "text"})  # type: ignore[arg-type]
    assert message is not None and sink.spans[0] is message
    assert message.name == Attr.SPAN_MESSAGE and message.parent_id == plan.span_id
    assert message.attributes == {Attr.MESSAGE_BODY: "retrying with a shorter query", "step": 3}
    assert (message.rollout_id, message.attempt_id) == ("ro-1", "at-1")
    with pytest.warns(RuntimeWarning, match="emit_message"):
        assert emit_message("nobody listens") is None


async def test_concurrent_tasks_keep_their_own_attempt_and_parents():
    sink = ListSink()

    async def one(i: int) -> None:
        with attempt_context(f"ro-{i}", f"at-{i}", sink):
            async with span("work", i=i) as s:
                for step in range(5):
                    emit_event("step", i=i, step=step)
                    await asyncio.sleep(0)  # interleave with the other attempts
                    assert current_attempt().attempt_id == f"at-{i}"
            emit_reward(float(i))
            assert current_attempt().final_reward == float(i)
            spans_of_work[i] = s.span_id

    spans_of_work: dict[int, str] = {}
    await asyncio.gather(*(one(i) for i in range(20)))
    assert len(sink.spans) == 20 * 7
    for s in sink.spans:
        i = int(s.attempt_id.removeprefix("at-"))
        assert s.rollout_id == f"ro-{i}"
        if s.name == Attr.SPAN_EVENT:
            assert s.attributes["i"] == i and s.parent_id == spans_of_work[i]


def test_context_propagates_into_threads_only_when_copied():
    sink = ListSink()
    seen: dict[str, object] = {}
    with attempt_context("ro-1", "at-1", sink):
        copied = threading.Thread(target=contextvars.copy_context().run, args=(lambda: emit_event("in_thread"),))
        copied.start()
        copied.join()
        bare = threading.Thread(target=lambda: seen.setdefault("ctx", current_attempt()))
        bare.start()
        bare.join()
    assert [s.attributes[Attr.EVENT_NAME] for s in sink.spans] == ["in_thread"]
    assert sink.spans[0].attempt_id == "at-1"
    assert seen["ctx"] is None  # a plain thread starts with an empty context: no attempt leaks into it


def test_emitting_a_span_is_cheap():
    sink = ListSink()
    n = 20_000
    with attempt_context("ro-1", "at-1", sink):
        t0 = time.perf_counter()
        for i in range(n):
            emit_event("step", i=i)
        per_span = (time.perf_counter() - t0) / n
    assert len(sink.spans) == n
    assert per_span < 100e-6, f"{per_span * 1e6:.1f} us per span"
