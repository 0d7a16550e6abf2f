"""Served sessions and feedback, against every store (memory, SQLite, PostgreSQL, and both over HTTP)."""

from __future__ import annotations

import asyncio
import time

import pytest

from lightrail.adapters import build_episode
from lightrail.store.base import ConflictError, NotFoundError
from lightrail.store.sessions import Feedback, FeedbackResult, give_feedback, session_rollout_id
from lightrail.types import (
    Attr,
    RetryPolicy,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanStatus,
    StatusCode,
    Task,
)


def _spec(session_id: str, **kw) -> RolloutSpec:
    return RolloutSpec(
        rollout_id=session_rollout_id(session_id), task=Task(input={"session": session_id}), mode="served", **kw
    )


async def _feedback(store, feedback: Feedback) -> FeedbackResult:
    """Over HTTP the store server applies it (``POST /v1/feedback``); in process, `give_feedback` does."""
    if hasattr(store, "feedback"):
        return await store.feedback(feedback)
    return await give_feedback(store, feedback)


def _call(rollout_id: str, attempt_id: str, response_id: str, seq: int) -> Span:
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        seq=seq,
        name=Attr.SPAN_LLM_CALL,
        start_time=now,
        end_time=now,
        attributes={
            Attr.RESPONSE_ID: response_id,
            Attr.PROMPT_IDS: [1, 2, 3],
            Attr.CHOICES: [{"token_ids": [4, 5], "logprobs": [-0.1, -0.2], "finish_reason": "stop"}],
            Attr.TOKEN_IDS_AVAILABLE: True,
        },
        status=SpanStatus(code=StatusCode.OK),
    )


async def test_a_session_is_a_running_served_rollout_that_runners_never_lease_and_no_lease_expiry_ends(store):
    spec = _spec("user-7", policy=RetryPolicy(lease_s=0.2))
    lease = await store.open_session(spec, attempt_id="at-s1")
    assert lease.rollout.mode == "served" and lease.rollout.status is RolloutStatus.RUNNING
    assert lease.attempt.attempt_id == "at-s1" and lease.attempt.index == 1
    again = await store.open_session(spec, attempt_id="at-other")  # the session's next call, or a retried request
    assert again.attempt.attempt_id == "at-s1" and again.rollout.created_at == lease.rollout.created_at

    assert await store.lease("runner", wait_s=0.3) is None
    await asyncio.sleep(0.5)  # well past the policy's lease
    rollout = await store.get_rollout(spec.rollout_id)
    assert rollout.status is RolloutStatus.RUNNING and rollout.attempts == 1
    assert (await store.counts())[RolloutStatus.RUNNING] == 1


async def test_a_training_rollout_is_never_turned_into_a_session(store):
    (queued,) = await store.enqueue([RolloutSpec(rollout_id=session_rollout_id("x"), task=Task(input=1))])
    with pytest.raises(ConflictError):
        await store.open_session(_spec("x"), attempt_id="at-x")
    assert (await store.get_rollout(queued.rollout_id)).status is RolloutStatus.QUEUED


async def test_feedback_rewards_a_session_once_and_names_what_is_wrong(store):
    lease = await store.open_session(_spec("s1"), attempt_id="at-s1")
    await store.add_spans([_call(lease.rollout.rollout_id, "at-s1", f"chatcmpl-{i}", i) for i in range(2)])

    with pytest.raises(NotFoundError, match="no served session"):
        await _feedback(store, Feedback(session_id="nobody", reward=1.0))

    first = Feedback(session_id="s1", reward=0.75, feedback_id="fb-1", intermediate={"chatcmpl-0": 0.25}, note="ok")
    done = await _feedback(store, first)
    assert (done.rollout_id, done.reward, done.duplicate) == ("session-s1", 0.75, False)
    repeated = await _feedback(store, first)  # a retried request: nothing changes
    assert repeated.duplicate and repeated.reward == 0.75
    with pytest.raises(ConflictError, match="already has feedback"):
        await _feedback(store, Feedback(session_id="s1", reward=0.0, feedback_id="fb-2"))

    rollout = await store.get_rollout("session-s1")
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 0.75
    spans = await store.query_spans("session-s1")
    assert sum(s.name == Attr.SPAN_REWARD for s in spans) == 2  # one final, one intermediate; no duplicates
    episode = build_episode(spans)
    assert episode.final_reward == 0.75
    assert [c.response_id for c in episode.calls] == ["chatcmpl-0", "chatcmpl-1"]
    assert [(r.value, r.response_id) for r in episode.intermediate] == [(0.25, "chatcmpl-0")]


async def test_feedback_by_response_id_finds_a_call_that_was_its_own_session(store):
    await store.open_session(_spec("chatcmpl-abc"), attempt_id="at-abc")
    done = await _feedback(store, Feedback(response_id="chatcmpl-abc", reward=1.0))
    assert done.rollout_id == "session-chatcmpl-abc"
    with pytest.raises(NotFoundError, match="through its session_id"):
        await _feedback(store, Feedback(response_id="chatcmpl-inside-a-session", reward=1.0))


def test_feedback_is_validated_before_it_reaches_a_store():
    with pytest.raises(ValueError, match="exactly one"):
        Feedback(reward=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        Feedback(reward=1.0, session_id="a", response_id="b")
    with pytest.raises(ValueError, match="finite"):
        Feedback(reward=float("nan"), session_id="a")
    with pytest.raises(ValueError, match="session id"):
        Feedback(reward=1.0, session_id="a/b")


async def test_retention_deletes_old_sessions_with_their_spans_and_nothing_else(store):
    old = await store.open_session(_spec("old"), attempt_id="at-old")
    await store.add_spans([_call(old.rollout.rollout_id, "at-old", "chatcmpl-old", 1)])
    (training,) = await store.enqueue([RolloutSpec(task=Task(input=1))])
    cutoff = time.time() + 0.001
    await asyncio.sleep(0.01)
    await store.open_session(_spec("new"), attempt_id="at-new")

    assert await store.delete_sessions(created_before=cutoff) == 1
    with pytest.raises(NotFoundError):
        await store.get_rollout("session-old")
    with pytest.raises(NotFoundError):
        await store.query_spans("session-old")
    assert (await store.get_rollout("session-new")).status is RolloutStatus.RUNNING
    assert (await store.get_rollout(training.rollout_id)).status is RolloutStatus.QUEUED
    assert await store.delete_sessions(created_before=cutoff) == 0
