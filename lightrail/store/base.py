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
    "IllegalTransitionError",
    "NotFoundError",
    "StaleAttemptError",
    "Store",
    "StoreError",
    "StoreUnavailableError",
    "MAX_PAGE",
    "check_page",
    "metadata_path",
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

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Block until every listed rollout is terminal or the timeout passes; returns the terminal ones."""
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
