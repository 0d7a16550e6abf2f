"""`MemoryStore`: the whole store in Python dicts, for tests and single-process experiments.

Concurrency model: one event loop, no locks. Every method runs to completion without awaiting between reading
and writing state, so each call is atomic. Nothing survives the process; use `SQLiteStore` for anything that
must.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from lightrail.store._lifecycle import (
    SESSION_DEADLINE,
    LeaseReaper,
    Pulse,
    attempt_deadline,
    expired_status,
    new_session,
    rollout_status_after,
)
from lightrail.store.base import (
    ConflictError,
    NotFoundError,
    StaleAttemptError,
    WaitResult,
    check_id,
    check_ids,
    check_page,
    check_span_ids,
    check_spec_ids,
    check_token_ids,
    unknown_rollouts,
)
from lightrail.store.tokens import TokenRecord
from lightrail.types import (
    Attempt,
    AttemptStatus,
    ErrorInfo,
    Lease,
    Resources,
    Rollout,
    RolloutPage,
    RolloutSpec,
    RolloutStatus,
    Span,
    check_attempt_transition,
    check_rollout_transition,
    new_id,
)

_copy = msgspec.structs.replace  # shallow copy: callers never hold references into the store's state


class MemoryStore:
    """An in-memory `Store`. Returned rollouts and attempts are copies; returned spans are the stored objects
    and must be treated as read-only."""

    def __init__(self) -> None:
        self._rollouts: dict[str, Rollout] = {}
        self._queue: deque[str] = deque()
        self._attempts: dict[str, Attempt] = {}
        self._attempts_of: dict[str, list[str]] = {}
        self._running: dict[str, float] = {}  # attempt_id -> deadline
        self._spans: dict[str, dict[str, Span]] = {}  # attempt_id -> span_id -> span
        self._resources: list[Resources] = []
        self._resources_ids: dict[str, int] = {}
        self._tokens: dict[str, TokenRecord] = {}
        self._queued = Pulse()
        self._ended = Pulse()
        self._reaper = LeaseReaper(self._next_deadline, self._expire)

    # -- rollouts -------------------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        for i, spec in enumerate(specs):  # the whole batch first: a refused batch stores nothing
            check_spec_ids(spec, f"specs[{i}]")
        now = time.time()
        latest = self._resources[-1].version if self._resources else None
        out = []
        for spec in specs:
            existing = self._rollouts.get(spec.rollout_id)
            if existing is None:
                existing = Rollout(
                    rollout_id=spec.rollout_id,
                    task=spec.task,
                    mode=spec.mode,
                    sample_index=spec.sample_index,
                    resources_version=spec.resources_version if spec.resources_version is not None else latest,
                    policy=spec.policy,
                    status=RolloutStatus.QUEUED,
                    created_at=now,
                    metadata=spec.metadata,
                )
                self._rollouts[spec.rollout_id] = existing
                self._attempts_of[spec.rollout_id] = []
                self._queue.append(spec.rollout_id)
            out.append(_copy(existing))
        if specs:
            self._queued.fire()
        return out

    async def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        check_id("worker_id", worker_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
        self._reaper.ensure_running()
        if attempt_id is not None and attempt_id in self._attempts:
            attempt = self._attempts[attempt_id]
            return Lease(rollout=_copy(self._rollouts[attempt.rollout_id]), attempt=_copy(attempt))
        deadline = time.monotonic() + wait_s
        while True:
            if self._queue:
                return self._start_attempt(self._queue.popleft(), worker_id, attempt_id or new_id("at"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._queued.wait(remaining)

    def _start_attempt(self, rollout_id: str, worker_id: str, attempt_id: str) -> Lease:
        rollout = self._rollouts[rollout_id]
        check_rollout_transition(rollout.status, RolloutStatus.RUNNING)
        now = time.time()
        rollout.status = RolloutStatus.RUNNING
        rollout.attempts += 1
        attempt = Attempt(
            attempt_id=attempt_id,
            rollout_id=rollout_id,
            index=rollout.attempts,
            worker_id=worker_id,
            status=AttemptStatus.RUNNING,
            started_at=now,
            lease_expires_at=now + rollout.policy.lease_s,
        )
        self._attempts[attempt_id] = attempt
        self._attempts_of[rollout_id].append(attempt_id)
        self._running[attempt_id] = attempt_deadline(now, attempt.lease_expires_at, rollout.policy)
        self._reaper.reschedule()
        return Lease(rollout=_copy(rollout), attempt=_copy(attempt))

    async def heartbeat(self, attempt_id: str) -> Attempt:
        attempt = self._attempt(attempt_id)
        if attempt.status is AttemptStatus.RUNNING:
            policy = self._rollouts[attempt.rollout_id].policy
            attempt.lease_expires_at = time.time() + policy.lease_s
            self._running[attempt_id] = attempt_deadline(attempt.started_at, attempt.lease_expires_at, policy)
        return _copy(attempt)

    async def finish(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Attempt:
        attempt = self._attempt(attempt_id)
        if attempt.status.terminal:
            if attempt.status is status and attempt.reward == reward:
                return _copy(attempt)  # a retried report of the same outcome
            raise StaleAttemptError(
                f"attempt {attempt_id} already ended as {attempt.status.value!r}; cannot report {status.value!r}"
            )
        if status is AttemptStatus.LOST:
            raise ConflictError("only the store marks an attempt 'lost' (when its lease expires)")
        self._end_attempt(attempt, status, time.time(), reward=reward, error=error)
        return _copy(attempt)

    def _end_attempt(
        self,
        attempt: Attempt,
        status: AttemptStatus,
        now: float,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> None:
        check_attempt_transition(attempt.status, status)
        attempt.status, attempt.ended_at, attempt.reward, attempt.error = status, now, reward, error
        self._running.pop(attempt.attempt_id, None)
        rollout = self._rollouts[attempt.rollout_id]
        if rollout.status.terminal:  # e.g. cancelled while this attempt ran
            return
        after = rollout_status_after(status, rollout.attempts, rollout.policy)
        check_rollout_transition(rollout.status, after)
        rollout.status = after
        if after is RolloutStatus.QUEUED:
            self._queue.appendleft(rollout.rollout_id)  # a retry goes first: its group is waiting for it
            self._queued.fire()
        else:
            rollout.ended_at, rollout.reward = now, reward
            self._ended.fire()

    async def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        now = time.time()
        rollouts = [
            self._rollout(rollout_id) for rollout_id in check_ids("rollout_ids", rollout_ids)
        ]  # all-or-nothing on unknown ids
        out = []
        for rollout in rollouts:
            rollout_id = rollout.rollout_id
            if not rollout.status.terminal:
                if rollout.status is RolloutStatus.QUEUED:
                    self._queue.remove(rollout_id)
                check_rollout_transition(rollout.status, RolloutStatus.CANCELLED)
                rollout.status, rollout.ended_at = RolloutStatus.CANCELLED, now
                for attempt_id in self._attempts_of[rollout_id]:
                    attempt = self._attempts[attempt_id]
                    if attempt.status is AttemptStatus.RUNNING:
                        attempt.status, attempt.ended_at = AttemptStatus.CANCELLED, now
                        self._running.pop(attempt_id, None)
                self._ended.fire()
            out.append(_copy(rollout))
        return out

    # -- served sessions ------------------------------------------------------------------------------------

    async def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        check_spec_ids(spec)
        check_id("attempt_id", attempt_id)
        check_id("worker_id", worker_id)
        existing = self._rollouts.get(spec.rollout_id)
        if existing is not None:
            if existing.mode != "served":
                raise ConflictError(f"rollout {spec.rollout_id!r} exists and is not a served session")
            return Lease(rollout=_copy(existing), attempt=_copy(self._attempts[self._attempts_of[spec.rollout_id][0]]))
        if attempt_id in self._attempts:
            raise ConflictError(f"attempt {attempt_id!r} already exists")
        latest = self._resources[-1].version if self._resources else None
        lease = new_session(spec, attempt_id, worker_id, time.time(), latest)
        self._rollouts[spec.rollout_id] = lease.rollout
        self._attempts[attempt_id] = lease.attempt
        self._attempts_of[spec.rollout_id] = [attempt_id]
        self._running[attempt_id] = SESSION_DEADLINE
        return Lease(rollout=_copy(lease.rollout), attempt=_copy(lease.attempt))

    async def delete_sessions(self, *, created_before: float) -> int:
        old = [r for r in self._rollouts.values() if r.mode == "served" and r.created_at < created_before]
        for rollout in old:
            del self._rollouts[rollout.rollout_id]
            for attempt_id in self._attempts_of.pop(rollout.rollout_id):
                del self._attempts[attempt_id]
                self._running.pop(attempt_id, None)
                self._spans.pop(attempt_id, None)
        return len(old)

    def _next_deadline(self) -> float | None:
        return min(self._running.values(), default=None)

    async def _expire(self, now: float) -> None:
        for attempt_id, deadline in list(self._running.items()):
            if deadline <= now:
                attempt = self._attempts[attempt_id]
                policy = self._rollouts[attempt.rollout_id].policy
                self._end_attempt(attempt, expired_status(attempt.started_at, policy, now), now)

    # -- spans ----------------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[Span]) -> int:
        check_span_ids(spans)
        for span in spans:  # validate the whole batch first: a rejected batch stores nothing
            if span.attempt_id not in self._attempts:
                raise NotFoundError(f"span {span.span_id}: unknown attempt {span.attempt_id!r}")
            if self._attempts[span.attempt_id].rollout_id != span.rollout_id:
                raise ConflictError(f"span {span.span_id}: attempt {span.attempt_id} is not of {span.rollout_id}")
        added = 0
        for span in spans:
            of_attempt = self._spans.setdefault(span.attempt_id, {})
            if span.span_id not in of_attempt:
                of_attempt[span.span_id] = span
                added += 1
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        check_id("rollout_id", rollout_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
        attempt_ids = self._attempts_of.get(rollout_id)
        if attempt_ids is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")
        if attempt_id is not None:
            if attempt_id not in attempt_ids:
                raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
            attempt_ids = [attempt_id]
        out: list[Span] = []
        for aid in attempt_ids:
            out.extend(sorted(self._spans.get(aid, {}).values(), key=lambda s: s.seq))
        return out

    # -- resources ------------------------------------------------------------------------------------------

    async def put_resources(self, resources: Resources) -> Resources:
        check_id("resources_id", resources.resources_id)
        if resources.resources_id in self._resources_ids:
            stored = self._resources[self._resources_ids[resources.resources_id] - 1]
            if stored.items != resources.items:
                raise ConflictError(f"resources {resources.resources_id} already stored with different items")
            return stored
        stored = msgspec.structs.replace(resources, version=len(self._resources) + 1, created_at=time.time())
        self._resources.append(stored)
        self._resources_ids[stored.resources_id] = stored.version
        return stored

    async def get_resources(self, version: int | None = None) -> Resources | None:
        if version is None:
            return self._resources[-1] if self._resources else None
        if not 1 <= version <= len(self._resources):
            raise NotFoundError(f"unknown resources version {version}")
        return self._resources[version - 1]

    # -- scoped tokens ----------------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        check_token_ids(record)
        self._tokens[record.token_id] = record

    async def get_token(self, token_id: str) -> TokenRecord | None:
        check_id("token_id", token_id)
        return self._tokens.get(token_id)

    async def list_tokens(self) -> list[TokenRecord]:
        return sorted(self._tokens.values(), key=lambda r: r.created_at)

    # -- queries --------------------------------------------------------------------------------------------

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return _copy(self._rollout(rollout_id))

    async def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]:
        wanted = None if status is None else set(status)
        pool = (
            self._rollouts.values()
            if rollout_ids is None
            else [self._rollout(r) for r in check_ids("rollout_ids", rollout_ids)]
        )
        return [_copy(r) for r in pool if wanted is None or r.status in wanted]

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
        check_page(limit, offset, before, metadata)
        wanted = None if status is None else set(status)
        tags = dict(metadata or {})
        matching = [
            (position, r)
            for position, r in enumerate(self._rollouts.values(), 1)
            if (wanted is None or r.status in wanted)
            and (mode is None or r.mode == mode)
            and all(r.metadata.get(k) == v for k, v in tags.items())
        ]
        older = [(p, r) for p, r in reversed(matching) if before is None or p < before]
        page = older[offset : offset + limit]
        more = len(older) > offset + limit
        return RolloutPage(
            rollouts=[_copy(r) for _, r in page], total=len(matching), next_before=page[-1][0] if more else None
        )

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        self._rollout(rollout_id)
        return [_copy(self._attempts[a]) for a in self._attempts_of[rollout_id]]

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        ids = check_ids("rollout_ids", rollout_ids)
        missing = [r for r in ids if r not in self._rollouts]
        if missing:
            raise unknown_rollouts(missing)
        self._reaper.ensure_running()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            done = sum(1 for r in ids if self._rollouts[r].status.terminal)
            remaining = None if deadline is None else deadline - time.monotonic()
            if done == len(ids) or (remaining is not None and remaining <= 0):
                return WaitResult(_copy(self._rollouts[r]) for r in ids)
            await self._ended.wait(remaining)

    async def counts(self) -> dict[RolloutStatus, int]:
        out = dict.fromkeys(RolloutStatus, 0)
        for rollout in self._rollouts.values():
            out[rollout.status] += 1
        return out

    async def close(self) -> None:
        await self._reaper.close()

    # -- helpers --------------------------------------------------------------------------------------------

    def _rollout(self, rollout_id: str) -> Rollout:
        check_id("rollout_id", rollout_id)
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError(f"unknown rollout {rollout_id!r}") from None

    def _attempt(self, attempt_id: str) -> Attempt:
        check_id("attempt_id", attempt_id)
        try:
            return self._attempts[attempt_id]
        except KeyError:
            raise NotFoundError(f"unknown attempt {attempt_id!r}") from None
