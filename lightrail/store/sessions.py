"""Served sessions and the feedback that rewards them later.

A gateway recording production traffic (``lightrail gateway serve --record``) files every call under a session: a
rollout in mode ``served`` with one attempt, made by `Store.open_session` and named ``session-<session id>``. The
calls are ordinary LLM-call spans, so credit assignment, agent attribution and the failure digest read a session
like any rollout. Its outcome arrives later, as feedback: `give_feedback` writes the reward as reward spans (the
final one, plus intermediate ones linked to calls by response id) and finishes the session's attempt with it. A
session without feedback stays ``running`` and is never trained on; retention (`Store.delete_sessions`) removes it.

Feedback is idempotent by ``feedback_id``: the same feedback sent again changes nothing; a second, different
feedback for a session that already has one is a `ConflictError` (409), never a silent overwrite.

Example (from the application that served the answer, any process that can reach the store)::

    import lightrail
    lightrail.feedback("http://127.0.0.1:8765", session_id="user-42/ticket-7", reward=1.0, token=...)
"""

from __future__ import annotations

import math
import re
import time

import msgspec

from lightrail.store.base import ConflictError, NotFoundError, Store, check_id
from lightrail.types import JSON, AttemptStatus, Attr, RolloutStatus, Span, SpanStatus, StatusCode, new_id, next_seq

__all__ = [
    "SESSION_ID_PATTERN",
    "Feedback",
    "FeedbackResult",
    "give_feedback",
    "session_rollout_id",
]

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:@+=-]{1,200}")
"""What a session id may be: it names a rollout (``session-<id>``), so it appears in store URLs."""

_SESSION_PREFIX = "session-"


def session_rollout_id(session_id: str) -> str:
    """The rollout id of a session; raises ValueError for an id outside `SESSION_ID_PATTERN`."""
    if not SESSION_ID_PATTERN.fullmatch(session_id):
        raise ValueError(f"session id {session_id[:80]!r} is not 1-200 characters of letters, digits and . _ : @ + = -")
    return _SESSION_PREFIX + session_id


class Feedback(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The outcome of a served session, known after it was served (body of ``POST /v1/feedback``).

    Name the session by ``session_id``, or by ``response_id`` for a call that had no session of its own (the
    gateway then files it as a session named by its response id). ``intermediate`` rewards single calls of the
    session by their response ids (credit assignment adds them to those calls).
    """

    reward: float
    session_id: str | None = None
    response_id: str | None = None
    feedback_id: str = msgspec.field(default_factory=lambda: new_id("fb"))
    """Sending the same feedback id again changes nothing (a retried request)."""
    intermediate: dict[str, float] = msgspec.field(default_factory=dict)
    note: str | None = None

    def __post_init__(self) -> None:
        if (self.session_id is None) == (self.response_id is None):
            raise ValueError("name the session by exactly one of session_id or response_id")
        session_rollout_id(self.session_id if self.session_id is not None else self.response_id or "")
        if not math.isfinite(self.reward):
            raise ValueError("reward must be a finite number")
        for response_id, value in self.intermediate.items():
            if not math.isfinite(value):
                raise ValueError(f"intermediate reward of {response_id!r} must be a finite number")
        check_id("feedback_id", self.feedback_id)  # the store's one rule for ids (it names reward spans too)
        if len(self.feedback_id) > 200:  # leaves room for the suffix of each reward span's id
            raise ValueError("feedback_id must be 1-200 characters")
        if self.note is not None and len(self.note) > 10_000:
            raise ValueError("note is longer than 10,000 characters")

    @property
    def rollout_id(self) -> str:
        return session_rollout_id(self.session_id if self.session_id is not None else self.response_id or "")


class FeedbackResult(msgspec.Struct, kw_only=True):
    """What `give_feedback` did: the session's rollout, its reward, and whether this feedback id was already
    applied (``duplicate``)."""

    rollout_id: str
    reward: float
    duplicate: bool = False


async def give_feedback(store: Store, feedback: Feedback) -> FeedbackResult:
    """Reward a served session: reward spans first (idempotent by span id), then the attempt finished with the
    reward (idempotent for the same outcome), so a retry after a crash between the two completes it.

    Raises `NotFoundError` for an unknown session, `ConflictError` for a rollout that is not a served session or
    a session that already has other feedback.
    """
    rollout_id = feedback.rollout_id
    try:
        rollout = await store.get_rollout(rollout_id)
    except NotFoundError:
        named = f"session {feedback.session_id!r}" if feedback.session_id else f"response {feedback.response_id!r}"
        hint = "" if feedback.session_id else " (a call inside a session is rewarded through its session_id)"
        raise NotFoundError(f"no served session for {named}{hint}") from None
    if rollout.mode != "served":
        raise ConflictError(f"rollout {rollout_id!r} is not a served session")
    (attempt,) = (await store.query_attempts(rollout_id))[:1]
    spans = await store.query_spans(rollout_id, attempt.attempt_id)
    given = {s.attributes.get(Attr.FEEDBACK_ID) for s in spans if s.name == Attr.SPAN_REWARD}
    given.discard(None)
    if feedback.feedback_id in given:
        return FeedbackResult(rollout_id=rollout_id, reward=rollout.reward or feedback.reward, duplicate=True)
    if given or rollout.status is not RolloutStatus.RUNNING:
        raise ConflictError(f"session {rollout_id!r} already has feedback ({', '.join(sorted(map(str, given)))})")
    await store.add_spans(_reward_spans(feedback, rollout_id, attempt.attempt_id))
    await store.finish(attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=feedback.reward)
    return FeedbackResult(rollout_id=rollout_id, reward=feedback.reward)


def _reward_spans(feedback: Feedback, rollout_id: str, attempt_id: str) -> list[Span]:
    now = time.time()

    def span(suffix: str, value: float, final: bool, extra: dict[str, JSON]) -> Span:
        attributes: dict[str, JSON] = {
            Attr.REWARD: float(value),
            Attr.REWARD_NAME: "feedback",
            Attr.REWARD_FINAL: final,
            Attr.FEEDBACK_ID: feedback.feedback_id,
            **extra,
        }
        return Span(
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            span_id=f"{feedback.feedback_id}{suffix}",
            seq=next_seq(),
            name=Attr.SPAN_REWARD,
            start_time=now,
            end_time=now,
            attributes=attributes,
            status=SpanStatus(code=StatusCode.OK),
        )

    final_extra: dict[str, JSON] = {} if feedback.note is None else {Attr.FEEDBACK_NOTE: feedback.note}
    spans = [span("", feedback.reward, True, final_extra)]
    for i, (response_id, value) in enumerate(sorted(feedback.intermediate.items())):
        spans.append(span(f".{i}", value, False, {Attr.LINKED_RESPONSE_ID: response_id}))
    return spans
