"""Machinery every store implementation shares: lifecycle decisions, wake-ups and the lease reaper.

Stores are asyncio objects used from one event loop (see each store's docstring). Waiting is event-driven:
`Pulse` wakes every waiter when something changes (an enqueue wakes leasers, a terminal rollout wakes `wait`
callers), and `LeaseReaper` sleeps exactly until the earliest lease or timeout deadline instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

from lightrail.types import (
    ATTEMPT_TO_ROLLOUT,
    Attempt,
    AttemptStatus,
    Lease,
    RetryPolicy,
    Rollout,
    RolloutSpec,
    RolloutStatus,
)

log = logging.getLogger(__name__)
_REAPER_RETRY_S = 0.5


def rollout_status_after(attempt_status: AttemptStatus, attempts_started: int, policy: RetryPolicy) -> RolloutStatus:
    """Where a rollout goes when its attempt ends: back to the queue when the policy retries this kind of failure
    and attempts remain, otherwise the terminal status matching the attempt."""
    if attempt_status in policy.retry_on and attempts_started < policy.max_attempts:
        return RolloutStatus.QUEUED
    return ATTEMPT_TO_ROLLOUT[attempt_status]


def attempt_deadline(started_at: float, lease_expires_at: float, policy: RetryPolicy) -> float:
    """The moment the store must end a running attempt on its own (lease expiry or wall-clock timeout)."""
    if policy.timeout_s is None:
        return lease_expires_at
    return min(lease_expires_at, started_at + policy.timeout_s)


def expired_status(started_at: float, policy: RetryPolicy, now: float) -> AttemptStatus:
    """Why an attempt past its deadline ends: its time budget ran out, or its runner went silent."""
    if policy.timeout_s is not None and now >= started_at + policy.timeout_s:
        return AttemptStatus.TIMEOUT
    return AttemptStatus.LOST


SESSION_DEADLINE = 32503680000.0
"""The deadline of a served session's attempt (year 3000): the schemas keep "running ⇔ has a deadline", and no
lease expiry ever ends a session (feedback finishes it, retention deletes it)."""


def new_session(spec: RolloutSpec, attempt_id: str, worker_id: str, now: float, latest: int | None) -> Lease:
    """The rollout and running attempt `Store.open_session` stores for ``spec`` (mode ``served``, one attempt)."""
    if spec.mode != "served":
        raise ValueError(f"open_session records served sessions: spec.mode must be 'served', got {spec.mode!r}")
    rollout = Rollout(
        rollout_id=spec.rollout_id,
        task=spec.task,
        mode="served",
        sample_index=spec.sample_index,
        resources_version=spec.resources_version if spec.resources_version is not None else latest,
        policy=spec.policy,
        status=RolloutStatus.RUNNING,
        created_at=now,
        attempts=1,
        metadata=spec.metadata,
    )
    attempt = Attempt(
        attempt_id=attempt_id,
        rollout_id=spec.rollout_id,
        index=1,
        worker_id=worker_id,
        status=AttemptStatus.RUNNING,
        started_at=now,
        lease_expires_at=SESSION_DEADLINE,
    )
    return Lease(rollout=rollout, attempt=attempt)


class Pulse:
    """A broadcast wake-up: `wait` returns on the next `fire` (or at the timeout). No state is kept between
    pulses, so a waiter re-checks its condition after every wake-up.

    One event per event loop, because an `asyncio.Event` binds to the first loop that waits on it and a store
    may outlive one `asyncio.run` (tests, notebooks); `fire` must be called on the loops' own threads.
    """

    def __init__(self) -> None:
        self._events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}

    def fire(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    def arm(self) -> asyncio.Event:
        """The event the next `fire` sets. A waiter whose condition check awaits (a database round trip) takes it
        before the check and passes it to `wait`: a fire landing while the check is in flight then ends the wait
        at once instead of being missed."""
        loop = asyncio.get_running_loop()
        event = self._events.get(loop)
        if event is None:
            event = self._events[loop] = asyncio.Event()
        return event

    async def wait(self, timeout_s: float | None, armed: asyncio.Event | None = None) -> None:
        event = self.arm() if armed is None else armed
        if timeout_s is None:
            await event.wait()
            return
        if timeout_s <= 0:
            return
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that lands in the same loop
        # iteration as the fire, and the cancelled waiter (a closing store's reaper) would sleep on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()


class LeaseReaper:
    """Ends attempts whose lease or time budget ran out, at the moment it runs out.

    ``next_deadline`` returns the earliest deadline among running attempts (or None), directly or as an awaitable
    (a database query); ``expire`` ends every attempt past its deadline. The reaper sleeps until that deadline or
    until `reschedule` is called (a new attempt with an earlier deadline, possibly set by another process), so an
    idle store costs nothing and a dead runner is noticed on time even when nobody calls the store.
    """

    def __init__(
        self,
        next_deadline: Callable[[], float | None | Awaitable[float | None]],
        expire: Callable[[float], Awaitable[None]],
    ):
        self._next_deadline = next_deadline
        self._expire = expire
        self._changed = Pulse()
        self._task: asyncio.Task[None] | None = None
        self._sleeping_until: float | None = None  # the deadline the reaper waits for (None: none, or computing)
        self._closed = False

    def ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._closed = False  # a store may be used again after close (a new event loop in tests, notebooks)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lightrail-lease-reaper")

    def reschedule(self, deadline: float | None = None) -> None:
        """Re-read the earliest deadline now; given the ``deadline`` that changed, only if it is earlier than the
        one the reaper already sleeps until (a new lease's deadline rarely is: it saves a query per lease)."""
        if deadline is not None and self._sleeping_until is not None and deadline >= self._sleeping_until:
            return
        self._changed.fire()

    async def _run(self) -> None:
        while not self._closed:
            armed = self._changed.arm()  # before reading the deadline: a reschedule during the read is not lost
            self._sleeping_until = None
            try:
                deadline = self._next_deadline()
                if inspect.isawaitable(deadline):
                    deadline = await deadline
                if deadline is not None and deadline <= time.time():
                    await self._expire(time.time())
                    continue
            except Exception:  # e.g. the database is locked by another process: retry soon, never die silently
                log.exception("lease reaper failed; retrying in %.1f s", _REAPER_RETRY_S)
                await asyncio.sleep(_REAPER_RETRY_S)
                continue
            self._sleeping_until = deadline
            await self._changed.wait(None if deadline is None else deadline - time.time(), armed)

    async def close(self) -> None:
        self._closed = True  # ends the loop even if a cancellation is swallowed by a library below us
        self._changed.fire()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
            self._task = None
