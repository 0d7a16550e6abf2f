"""The `Store` protocol: the only way components share state.

Training (the trainer and its algorithm) and execution (runners) never talk to each other; both talk to a store.
Every implementation (memory, SQLite, the HTTP client) passes the same contract suite in
``tests/store/test_contract.py``.

Semantics every implementation keeps:

* Records are created with ids chosen by the caller (`RolloutSpec.rollout_id`, the ``attempt_id`` of a lease,
  `Span.span_id`, `Resources.resources_id`), so retrying any write never duplicates data.
* `lease` and `wait` block without polling: they are woken by the write that satisfies them.
* An attempt whose lease is not renewed within ``policy.lease_s`` becomes `lost`; its rollout is requeued
  while attempts remain, else it ends as `infra_error`. Infrastructure failures never end as a reward.
* Terminal statuses are sticky; late reports about a finished attempt raise `StaleAttemptError`.
* Every id that enters a store (written or looked up) keeps `check_id`'s rule, or the call raises `InvalidIdError`
  naming the field (HTTP 400) before anything is read or written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from lightrail.store.tokens import TokenRecord
from lightrail.types import (
    Attempt,
    AttemptStatus,
    ErrorInfo,
    IllegalTransitionError,
    Lease,
    Resources,
    Rollout,
    RolloutPage,
    RolloutSpec,
    RolloutStatus,
    Span,
)

__all__ = [
    "ConflictError",
    "ID_RULE",
    "IllegalTransitionError",
    "InvalidIdError",
    "MAX_ID_CHARS",
    "NotFoundError",
    "StaleAttemptError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "MAX_PAGE",
    "WaitResult",
    "check_id",
    "check_ids",
    "check_page",
    "check_span_ids",
    "check_spec_ids",
    "check_token_ids",
    "metadata_path",
    "unknown_rollouts",
]

MAX_PAGE = 1000
"""The most rollouts one `Store.query_rollouts_page` call returns."""


def check_page(limit: int, offset: int, before: int | None, metadata: Mapping[str, str] | None) -> None:
    """Refuse a page request no store can answer (`ValueError` naming the field)."""
    for key in metadata or {}:
        metadata_path(key)
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if before is not None and before < 1:
        raise ValueError(f"before must be a position >= 1 (a page's next_before), got {before}")


def metadata_path(key: str) -> str:
    """The JSON path of a top-level metadata key, for stores that filter in SQL; a key that is not a plain name
    (ASCII letters, digits, ``_`` and ``-``) is a `ValueError`."""
    if not key or not all(c.isalnum() or c in "_-" for c in key) or not key.isascii():
        raise ValueError(f"metadata keys to filter on are plain names (letters, digits, _ and -), got {key!r}")
    return f'$."{key}"'


class StoreError(Exception):
    """Base class of errors a store raises on purpose (each maps to one HTTP status)."""

    http_status = 400


class NotFoundError(StoreError, KeyError):
    """An id the store does not know."""

    http_status = 404

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class ConflictError(StoreError):
    """The write contradicts what is stored (same id, different content)."""

    http_status = 409


class UnauthorizedError(StoreError):
    """The store server refused the bearer token: missing, wrong, expired or revoked. Never transient: retrying
    with the same token cannot succeed."""

    http_status = 401


class ForbiddenError(StoreError):
    """A valid token asking for what its role does not allow (the message names the role needed)."""

    http_status = 403


class StoreUnavailableError(StoreError):
    """The store could not be reached (or kept answering 502/503/504) through every retry. Transient by nature:
    callers that must not lose data (span recorders, batchers) retry it."""

    http_status = 503


class StaleAttemptError(ConflictError):
    """A report about an attempt that has already ended (lost, cancelled, timed out or finished)."""


MAX_ID_CHARS = 256
"""The longest id a store takes (`check_id`)."""

ID_RULE = f"a non-blank string of at most {MAX_ID_CHARS} printable characters (no control characters)"
"""`check_id`'s rule in words, as its refusals and the store server's OpenAPI document state it."""


class InvalidIdError(StoreError, ValueError):
    """An id that breaks `check_id`'s rule (HTTP 400). The message starts with the field as the caller wrote it
    (``specs[2].task.task_id: must be ...``); ``field`` holds it where known (the store server reports it as the
    JSON path ``$.<field>``; a client re-raising a server's 400 has only the message)."""

    http_status = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_id(field: str, value: object) -> str:
    """``value`` if it is an id a store takes, else `InvalidIdError` naming ``field``: the one rule for every id
    (rollout, task, attempt, worker, span, trace, resources, token, feedback). A non-blank `str` of at most
    `MAX_ID_CHARS` characters, all printable (`str.isprintable`: no control characters, tabs or line breaks).

    Why: an empty id was stored and then never matched anything (a ``wait`` on it long-polled to its cap), and a
    control character breaks logs, URLs and the dashboard. Ids are otherwise opaque: ``/`` is allowed, though ids in
    URL paths (rollout, attempt, token) that contain one cannot be addressed over HTTP.
    """
    if type(value) is str and 0 < len(value) <= MAX_ID_CHARS and value.isprintable() and not value.isspace():
        return value
    shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40]) + "..."
    raise InvalidIdError(f"{field}: must be {ID_RULE}, got {shown}", field)


def check_ids(field: str, values: Iterable[str]) -> list[str]:
    """The ids of a list argument (``rollout_ids``) as a list, each checked by `check_id` (``field[i]`` named)."""
    ids = list(values)
    for i, value in enumerate(ids):
        check_id(f"{field}[{i}]", value)
    return ids


def check_spec_ids(spec: RolloutSpec, field: str = "spec") -> None:
    """`check_id` on a rollout spec's ids: ``rollout_id`` and ``task.task_id``."""
    check_id(f"{field}.rollout_id", spec.rollout_id)
    check_id(f"{field}.task.task_id", spec.task.task_id)


def check_span_ids(spans: Sequence[Span]) -> None:
    """`check_id` on every id of a batch of spans (``spans[i].span_id``, its rollout, attempt, trace and parent)."""
    for i, span in enumerate(spans):
        check_id(f"spans[{i}].rollout_id", span.rollout_id)
        check_id(f"spans[{i}].attempt_id", span.attempt_id)
        check_id(f"spans[{i}].span_id", span.span_id)
        check_id(f"spans[{i}].trace_id", span.trace_id)
        if span.parent_id is not None:
            check_id(f"spans[{i}].parent_id", span.parent_id)


def check_token_ids(record: TokenRecord) -> None:
    """`check_id` on a scoped token's record: ``token_id`` and the ``attempts`` it may write into."""
    check_id("token_id", record.token_id)
    check_ids("attempts", record.attempts)


def unknown_rollouts(missing: Iterable[str]) -> NotFoundError:
    """The `NotFoundError` of a call listing rollouts the store does not have, naming them (at most 10)."""
    ids = list(dict.fromkeys(missing))
    named = ", ".join(repr(r) for r in ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    return NotFoundError(f"unknown rollout{'s' if len(ids) > 1 else ''} {named}")


class WaitResult(list[Rollout]):
    """What `Store.wait` returns: a list of the listed rollouts that are terminal, in the order listed (all a
    caller needs when the wait ended because they all are), plus:

    * ``pending``: the current state (``queued`` or ``running``) of every listed rollout that is not terminal yet,
      in the order listed;
    * ``timed_out``: whether the wait ended at its timeout (or the server's cap, `MAX_WAIT_S` of
      ``lightrail.store._wire``) with rollouts still pending.

    So a wait never answers with less than every listed rollout's state. Build it from every listed rollout's
    current state: ``WaitResult(states)`` sorts them into the two lists.
    """

    __slots__ = ("pending", "timed_out")

    def __init__(self, states: Iterable[Rollout] = (), *, timed_out: bool | None = None):
        states = list(states)
        super().__init__(r for r in states if r.status.terminal)
        self.pending: list[Rollout] = [r for r in states if not r.status.terminal]
        self.timed_out: bool = bool(self.pending) if timed_out is None else timed_out

    def __repr__(self) -> str:
        return f"WaitResult({list.__repr__(self)}, pending={self.pending!r}, timed_out={self.timed_out})"


@runtime_checkable
class Store(Protocol):
    """Durable home of rollouts, attempts, spans and resources. All methods are coroutines."""

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Queue rollouts; a spec whose ``rollout_id`` is already stored is returned as stored, not re-queued."""
        ...

    async def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        """Start an attempt on the oldest queued rollout, waiting up to ``wait_s`` for one to be enqueued.

        Passing the same ``attempt_id`` again returns the same lease (a retried request after a lost response);
        check ``lease.attempt.status``: the attempt may have ended since (lost, cancelled).
        """
        ...

    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Renew the attempt's lease. The returned status tells the runner to stop when it is no longer
        `running` (cancelled, lost or timed out)."""
        ...

    async def finish(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Attempt:
        """End a running attempt and move its rollout (retrying it when the policy says so)."""
        ...

    async def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        """Cancel queued or running rollouts (running attempts learn it at their next heartbeat). Terminal
        rollouts are returned unchanged; an unknown id raises `NotFoundError` and cancels nothing."""
        ...

    async def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        """Record a served session (``spec.mode == "served"``): a running rollout with one running attempt,
        created together. Runners never lease it and no lease expiry ends it: feedback finishes it
        (`lightrail.feedback`), retention deletes it (`delete_sessions`). Idempotent by ``spec.rollout_id``: a
        stored session is returned as stored; a stored rollout that is not a session raises `ConflictError`."""
        ...

    async def delete_sessions(self, *, created_before: float) -> int:
        """Delete the served sessions created before ``created_before`` (epoch seconds) with their attempts and
        spans; returns how many. Rollouts of other modes are never deleted."""
        ...

    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Store spans, ignoring ones already stored (same attempt and span id). Returns how many were new."""
        ...

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (all attempts, or one), ordered by attempt then ``seq``."""
        ...

    async def put_resources(self, resources: Resources) -> Resources:
        """Store a new version of the resources; returns it with ``version`` assigned."""
        ...

    async def get_resources(self, version: int | None = None) -> Resources | None:
        """A version of the resources, or the latest when ``version`` is None (None if there are none yet)."""
        ...

    async def get_rollout(self, rollout_id: str) -> Rollout: ...

    async def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]: ...

    async def query_rollouts_page(
        self,
        *,
        status: Iterable[RolloutStatus] | None = None,
        mode: str | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        offset: int = 0,
        before: int | None = None,
    ) -> RolloutPage:
        """Rollouts matching every given filter (``status`` any of; ``mode``; ``metadata``: each key holds that
        string), newest first: ``offset`` skipped, at most ``limit``, only those enqueued before the position
        ``before`` (a previous page's ``next_before``: deep pages cost what the first does). ``total`` counts every
        match. Read without loading the other rollouts (what a dashboard or ``lightrail rollouts`` pages with)."""
        ...

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""
        ...

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        """Block until every listed rollout is terminal or the timeout passes; returns the terminal ones (a list, in
        the order listed) with the others' current states in ``.pending`` and ``.timed_out`` (`WaitResult`). An
        unknown id raises `NotFoundError` naming every unknown one, before waiting."""
        ...

    async def counts(self) -> dict[RolloutStatus, int]:
        """How many rollouts are in each status."""
        ...

    async def put_token(self, record: TokenRecord) -> None:
        """Store a scoped token's record, replacing the one with its ``token_id`` (how a token is revoked)."""
        ...

    async def get_token(self, token_id: str) -> TokenRecord | None:
        """A scoped token's record, or None."""
        ...

    async def list_tokens(self) -> list[TokenRecord]:
        """Every scoped token's record, oldest first."""
        ...

    async def close(self) -> None: ...
