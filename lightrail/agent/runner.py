"""`Runner`: leases rollouts from a store, runs the agent on them, and reports spans and outcomes back.

Life of an attempt in a runner::

    lease (long-poll) ─► resources (cached by version) ─► agent task ─► spans flushed ─► finish(status, reward)
                                heartbeat every lease_s/3 ──┘  └─ store says "not running" ─► agent cancelled

Outcomes: a returned float (or, when the agent returns None, its last emitted final reward) ends the attempt
`SUCCEEDED`; an exception ends it `FAILED` with an `ErrorInfo`, except connection errors, timeouts and 5xx
talking to the gateway or store, which end it `INFRA_ERROR` (the store retries it; never trained on as reward
0). An attempt the store ended meanwhile (cancelled, lost, timed out) is not reported again.

Concurrency model: one event loop per runner; up to ``concurrency`` attempts at once, each an asyncio task.
Async agents run as tasks of this loop; sync agents run in a pool of ``concurrency`` worker threads, with the
attempt's tracing context copied into the thread (`contextvars.copy_context`). Spans of all attempts go
through one `SpanBatcher`. Nothing is shared between attempts except the batcher and the resources cache, both
used only from the loop.

Shutdown: `Runner.stop` (SIGTERM/SIGINT when the runner owns the main thread) stops leasing, gives in-flight
attempts ``grace_s`` to finish, then cancels the rest and reports them `INFRA_ERROR` so the store retries them
at once instead of waiting for their leases to expire. A second signal skips the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import numbers
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lightrail._errors import counted
from lightrail._retry import Retry
from lightrail.agent.agent import LitAgent, load_agent, route_resources
from lightrail.agent.errors import error_info, is_infra_error
from lightrail.store.base import ConflictError, Store, StoreUnavailableError
from lightrail.store.checks import is_auth_error
from lightrail.store.tokens import parse_token
from lightrail.tracing import AttemptContext, SpanBatcher, emit_exception, emit_reward, use_attempt
from lightrail.types import (
    LLM,
    Attempt,
    AttemptStatus,
    Attr,
    ErrorInfo,
    Lease,
    Rollout,
    Span,
    SpanStatus,
    StatusCode,
    next_seq,
)

__all__ = ["Runner", "RunnerStats", "default_worker_id", "require_otel"]

log = logging.getLogger(__name__)

_API_KEY_ENV = "OPENAI_API_KEY"

T = TypeVar("T")

_STOPPED: Any = object()
_SHUTDOWN = "shutdown"


def default_worker_id() -> str:
    """``host:pid:suffix``: unique per runner, and names the process holding a lease (for operators and tests)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class RunnerStats:
    """What a runner did: attempts leased and how they ended (by `AttemptStatus` value, plus ``"stale"`` for
    reports the store refused because the attempt had already ended)."""

    leased: int = 0
    ended: Counter[str] = field(default_factory=Counter)
    otel_flush_failures: int = 0
    """Attempts finished although their OpenTelemetry spans could not all be exported (``exporter="otlp"``)."""


@dataclass(eq=False)
class _Running:
    lease: Lease
    ctx: AttemptContext
    agent_task: asyncio.Task[Any] | None = None
    stop_reason: AttemptStatus | str | None = None
    """Why the runner stopped the agent: the status the store reported, or ``_SHUTDOWN``."""

    def stop(self, reason: AttemptStatus | str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.ctx.cancelled.set()
        if self.agent_task is not None:
            self.agent_task.cancel()


class Runner:
    """Run ``agent`` on rollouts leased from ``store``, up to ``concurrency`` at once.

    ``agent`` is a `LitAgent`, a `rollout`-decorated function, or an import reference ``"module:object"``.
    ``worker_id`` names this runner in the attempts it leases (default ``host:pid:suffix``).
    ``otel=True`` turns OpenTelemetry on in this process (`lightrail.tracing.otel.setup`, or the setup already
    active): framework spans become spans of the attempt that made them, under its rollout span, and LLM calls carry
    a ``traceparent`` so the gateway's call spans hang under the framework span that made them. Needs the
    ``lightrail[otel]`` extra. The runner's own lightweight tracer stays the default. Without OpenTelemetry, calls
    name their agent through `lightrail.as_agent` or `LLM.endpoint_for`, and an agent that uses LangChain gets its
    calls named by its runnables (`lightrail.tracing.langchain`).
    A store that stops answering is retried with a status line every 30 s; after ``store_patience_s`` seconds
    (None: never) `run` raises `StoreUnavailableError`. A refused token or role (`UnauthorizedError`,
    `ForbiddenError`) is raised at once.

    Example::

        store = StoreClient("http://127.0.0.1:4747", token=...)
        stats = await Runner(store, "my_agents:solve", concurrency=8).run(idle_exit_s=30)
    """

    def __init__(
        self,
        store: Store,
        agent: LitAgent | str | Any,
        *,
        concurrency: int = 1,
        worker_id: str | None = None,
        lease_wait_s: float = 10.0,
        grace_s: float = 10.0,
        handle_signals: bool = True,
        batcher: SpanBatcher | None = None,
        otel: bool = False,
        store_patience_s: float | None = 600.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if otel:
            require_otel()
        self.store = store
        # A runner with a scoped store token calls the gateway with that token too (the store hides the gateway's
        # own key from scoped tokens; the gateway accepts a runner token for the attempts it leased).
        token = getattr(store, "token", None)
        self._gateway_key = token if isinstance(token, str) and parse_token(token) is not None else None
        self._exported_key: str | None = None
        """The ``OPENAI_API_KEY`` this runner set (`_export_api_key`), so it may replace it when the key changes."""
        self.agent = load_agent(agent)
        self.concurrency = concurrency
        self.worker_id = worker_id or default_worker_id()
        self.lease_wait_s = lease_wait_s
        self.grace_s = grace_s
        self.handle_signals = handle_signals
        self.batcher = batcher or SpanBatcher(store)
        self.stats = RunnerStats()
        self.otel = otel
        self.store_patience_s = store_patience_s
        self._otel: Any = None  # the `lightrail.tracing.otel.OTel` handle while running with otel=True
        self._threads_busy = 0
        self._threads_lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._resources: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stopping: asyncio.Event | None = None
        self._no_grace: asyncio.Event | None = None
        self._last_active = time.monotonic()

    # -- control ------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop leasing and wind down (graceful; a second call skips the grace period). Safe from any thread and
        from signal handlers."""
        loop = self._loop
        if loop is None:
            return
        if threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # loop already closed: nothing left to stop
                loop.call_soon_threadsafe(self.stop)
            return
        assert self._stopping is not None and self._no_grace is not None
        if self._stopping.is_set():
            self._no_grace.set()
        self._stopping.set()

    async def run(self, max_rollouts: int | None = None, idle_exit_s: float | None = None) -> RunnerStats:
        """Lease and run rollouts until stopped, until ``max_rollouts`` attempts were leased (then wait for them),
        or until nothing was running and nothing could be leased for ``idle_exit_s`` seconds."""
        loop = asyncio.get_running_loop()
        self._loop, self._loop_thread = loop, threading.get_ident()
        self._stopping, self._no_grace = asyncio.Event(), asyncio.Event()
        self.batcher.start()
        _name_langchain_calls()
        if self.otel:
            from lightrail.tracing import otel

            self._otel = otel.current() or otel.setup()  # one setup per process, shared by its runners
        if not self.agent.is_async:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="lightrail-agent")
        signals = self._install_signal_handlers(loop)
        slots = asyncio.Semaphore(self.concurrency)
        self._last_active = time.monotonic()
        pauses: Iterator[float] | None = None  # between lease operations while the store stays down
        outage: _Outage | None = None  # since when (the client retried each operation already)
        try:
            while not self._stopping.is_set() and (max_rollouts is None or self.stats.leased < max_rollouts):
                if await self._unless_stopped(slots.acquire()) is _STOPPED:
                    break
                leased = False
                try:
                    await self._unless_stopped(self.batcher.wait_capacity())
                    wait_s = self._lease_wait(idle_exit_s)
                    if wait_s is None:
                        break  # idle for idle_exit_s
                    try:
                        lease = await self._unless_stopped(self.store.lease(self.worker_id, wait_s=wait_s))
                    except Exception as exc:  # store unreachable or restarting: pause, until store_patience_s
                        if is_auth_error(exc):
                            raise  # a refused token or role stays refused: retrying cannot help
                        if pauses is None or outage is None:
                            pauses, outage = _LEASE_PAUSES.delays(), _Outage(self.store_patience_s)
                        outage.failed(exc)
                        await self._unless_stopped(asyncio.sleep(next(pauses)))
                        continue
                    if outage is not None:
                        outage.over()
                    pauses = outage = None
                    if lease is None or lease is _STOPPED:
                        continue
                    self.stats.leased += 1
                    self._last_active = time.monotonic()
                    if self._stopping.is_set():  # leased while stopping: hand it straight back for a retry
                        await self._finish(lease.attempt, AttemptStatus.INFRA_ERROR, None, _shutdown_error())
                        continue
                    task = loop.create_task(self._run_attempt(lease), name=f"attempt-{lease.attempt.attempt_id}")
                    self._tasks.add(task)
                    task.add_done_callback(lambda t: self._attempt_done(t, slots))
                    leased = True
                finally:
                    if not leased:
                        slots.release()
            await self._drain()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.batcher.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
        return self.stats

    def run_sync(self, max_rollouts: int | None = None, idle_exit_s: float | None = None) -> RunnerStats:
        """`run` in a fresh event loop (for scripts and the ``lightrail runner`` command)."""
        return asyncio.run(self.run(max_rollouts=max_rollouts, idle_exit_s=idle_exit_s))

    def _lease_wait(self, idle_exit_s: float | None) -> float | None:
        if idle_exit_s is None:
            return self.lease_wait_s
        if self._tasks:  # busy: not idle; look again at least every idle_exit_s
            return min(self.lease_wait_s, idle_exit_s)
        remaining = idle_exit_s - (time.monotonic() - self._last_active)
        return None if remaining <= 0 else min(self.lease_wait_s, remaining)

    def _attempt_done(self, task: asyncio.Task[None], slots: asyncio.Semaphore) -> None:
        self._tasks.discard(task)
        slots.release()
        self._last_active = time.monotonic()
        if not task.cancelled() and task.exception() is not None:
            log.error("attempt task crashed", exc_info=task.exception())

    async def _unless_stopped(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` unless the runner is asked to stop first (then cancel it and return ``_STOPPED``)."""
        assert self._stopping is not None
        if self._stopping.is_set():
            if inspect.iscoroutine(aw):
                aw.close()
            return _STOPPED
        work = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work.done():
            return work.result()  # finished (even if a stop came at the same time): never drop a lease
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        return _STOPPED

    async def _drain(self) -> None:
        assert self._stopping is not None and self._no_grace is not None
        while self._tasks and not self._stopping.is_set():
            await self._wait_tasks_or(self._stopping, None)
        if not self._tasks:
            return
        log.info("stopping: %s in flight, %.1fs grace", counted(len(self._tasks), "attempt"), self.grace_s)
        deadline = time.monotonic() + self.grace_s
        while self._tasks and not self._no_grace.is_set() and (left := deadline - time.monotonic()) > 0:
            await self._wait_tasks_or(self._no_grace, left)
        for running in list(self._running.values()):
            running.stop(_SHUTDOWN)
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    async def _wait_tasks_or(self, event: asyncio.Event, timeout: float | None) -> None:
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait(self._tasks | {waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # e.g. Windows event loops
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
        return installed

    # -- one attempt --------------------------------------------------------------------------------------------

    async def _run_attempt(self, lease: Lease) -> None:
        rollout, attempt = lease.rollout, lease.attempt
        running = _Running(lease, AttemptContext(rollout.rollout_id, attempt.attempt_id, self.batcher))
        self._running[attempt.attempt_id] = running
        root_id, root_seq, started = uuid.uuid4().hex[:16], next_seq(), time.time()
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(running))
        status: AttemptStatus | None
        reward: float | None = None
        error: ErrorInfo | None = None
        try:
            try:
                resources = await self._resources_for(rollout)
            except Exception as exc:  # the store could not give us the resources: not the agent's fault
                log.warning(
                    "attempt %s: cannot get resources v%s: %r", attempt.attempt_id, rollout.resources_version, exc
                )
                status, error = AttemptStatus.INFRA_ERROR, error_info(exc)
            else:
                routed = route_resources(resources, rollout.rollout_id, attempt.attempt_id, api_key=self._gateway_key)
                self._export_api_key(routed)
                running.agent_task = asyncio.get_running_loop().create_task(self._call_agent(running, root_id, routed))
                if running.stop_reason is not None:  # stopped while fetching resources
                    running.agent_task.cancel()
                await asyncio.wait({running.agent_task})
                status, reward, error = self._outcome(running)
        finally:
            heartbeat.cancel()
            self._running.pop(attempt.attempt_id, None)
        self.batcher.submit(self._root_span(running, root_id, root_seq, started, status, reward, error))
        # framework spans reach the store before the finish; a failed export is said, never silent
        otel = self._otel
        if otel is not None and otel.exporter == "otlp" and not await asyncio.to_thread(otel.force_flush):
            self.stats.otel_flush_failures += 1
            log.warning(
                "attempt %s: OpenTelemetry spans could not all be exported before the finish", attempt.attempt_id
            )
        await self.batcher.flush()  # a finished attempt's spans are complete in the store
        if status is None:  # the store ended it (cancelled, lost, timed out): nothing to report
            self.stats.ended[str(getattr(running.stop_reason, "value", running.stop_reason))] += 1
            return
        await self._finish(attempt, status, reward, error)

    def _export_api_key(self, resources: Mapping[str, Any]) -> None:
        """Set ``OPENAI_API_KEY`` in this process to the key of the attempt's gateway `LLM`, for agents that build
        their client from the environment (Agent Lightning's walkthroughs do): the key is the runner's (the same for
        every attempt it serves), the URL each attempt's. An environment that sets its own key keeps it (it may be
        meant for another service); the gateway then names a refused key (`Attr.SPAN_KEY_REFUSED`)."""
        key = next((r.api_key for r in resources.values() if isinstance(r, LLM) and r.routed and r.api_key), None)
        current = os.environ.get(_API_KEY_ENV)
        if key is not None and current != key and (current is None or current == self._exported_key):
            os.environ[_API_KEY_ENV] = self._exported_key = key

    async def _call_agent(self, running: _Running, root_id: str, resources: dict[str, Any]) -> float | None:
        rollout, attempt = running.lease.rollout, running.lease.attempt
        _name_langchain_calls()  # again: an agent may import LangChain only when it first runs
        otel_parent = self._otel.attempt_parent(running.ctx, root_id) if self._otel else contextlib.nullcontext()
        with use_attempt(running.ctx, parent_span_id=root_id), otel_parent:  # this task's own context copy
            try:
                if self.agent.is_async:
                    result = await self.agent.invoke(rollout.task.input, resources, rollout, attempt)
                else:
                    assert self._executor is not None
                    call = contextvars.copy_context().run  # the attempt's context, inside the worker thread
                    result = await asyncio.get_running_loop().run_in_executor(
                        self._executor, call, self._in_thread, rollout.task.input, resources, rollout, attempt
                    )
                if inspect.isawaitable(result):
                    result = await result
                if result is None:
                    return running.ctx.final_reward
                if isinstance(result, numbers.Real):
                    emit_reward(float(result))  # the returned reward, as a final reward span: it wins
                    return float(result)
                raise TypeError(f"the agent returned {type(result).__name__}; expected a float reward or None")
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                emit_exception(exc)
                raise

    def _in_thread(self, *args: Any) -> Any:
        with self._threads_lock:
            self._threads_busy += 1
        try:
            return self.agent.invoke(*args)
        finally:
            with self._threads_lock:
                self._threads_busy -= 1

    @property
    def abandoned_threads(self) -> int:
        """Sync agents still running in worker threads (after their attempts were cancelled: threads cannot be
        interrupted). A process that wants to exit promptly should not wait for them."""
        with self._threads_lock:
            return self._threads_busy

    def _outcome(self, running: _Running) -> tuple[AttemptStatus | None, float | None, ErrorInfo | None]:
        task = running.agent_task
        assert task is not None
        if running.stop_reason == _SHUTDOWN:
            return AttemptStatus.INFRA_ERROR, None, _shutdown_error()
        if running.stop_reason is not None:
            return None, None, None
        if task.cancelled():  # the agent cancelled itself (or something it awaited was cancelled)
            return AttemptStatus.FAILED, None, ErrorInfo(type="CancelledError", message="the agent was cancelled")
        exc = task.exception()
        if exc is None:
            return AttemptStatus.SUCCEEDED, task.result(), None
        if is_infra_error(exc):
            return AttemptStatus.INFRA_ERROR, None, error_info(exc)
        return AttemptStatus.FAILED, None, error_info(exc)

    def _root_span(
        self,
        running: _Running,
        span_id: str,
        seq: int,
        started: float,
        status: AttemptStatus | None,
        reward: float | None,
        error: ErrorInfo | None,
    ) -> Span:
        rollout, attempt = running.lease.rollout, running.lease.attempt
        outcome = (
            status.value if status is not None else str(getattr(running.stop_reason, "value", running.stop_reason))
        )
        return Span(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt.attempt_id,
            seq=seq,
            name=Attr.SPAN_ROLLOUT,
            span_id=span_id,
            trace_id=running.ctx.trace_id,
            start_time=started,
            end_time=time.time(),
            attributes={
                "lightrail.rollout.mode": rollout.mode,
                "lightrail.rollout.sample_index": rollout.sample_index,
                "lightrail.task_id": rollout.task.task_id,
                "lightrail.resources_version": rollout.resources_version,
                "lightrail.attempt.index": attempt.index,
                "lightrail.attempt.status": outcome,
                "lightrail.attempt.reward": reward,
                "lightrail.worker_id": self.worker_id,
            },
            status=SpanStatus(code=StatusCode.OK)
            if status is AttemptStatus.SUCCEEDED
            else SpanStatus(code=StatusCode.ERROR, message=error.message if error else outcome),
        )

    async def _heartbeat(self, running: _Running) -> None:
        attempt, policy = running.lease.attempt, running.lease.rollout.policy
        interval = policy.lease_s / 3
        deadline = attempt.started_at + policy.timeout_s if policy.timeout_s is not None else None
        while True:
            delay = interval
            if deadline is not None:  # learn about a timeout as soon as the store has declared it
                delay = min(delay, max(0.0, deadline - time.time()) + 0.05)
            await asyncio.sleep(delay)
            try:
                current = await asyncio.wait_for(self.store.heartbeat(attempt.attempt_id), timeout=max(interval, 1.0))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep running: the next beat may get through before the lease expires
                log.warning("heartbeat of %s failed: %r", attempt.attempt_id, exc)
                continue
            if current.status is not AttemptStatus.RUNNING:
                log.info("attempt %s is %s in the store: stopping its agent", attempt.attempt_id, current.status.value)
                running.stop(current.status)
                return

    async def _resources_for(self, rollout: Rollout) -> dict[str, Any]:
        version = rollout.resources_version
        if version is None:
            return {}
        cached = self._resources.get(version)
        if cached is None or (cached.done() and cached.exception() is not None):
            # one fetch per version, shared by concurrent attempts; versions are immutable, so cache forever
            cached = asyncio.ensure_future(self._fetch_resources(version))
            self._resources[version] = cached
        return await asyncio.shield(cached)

    async def _fetch_resources(self, version: int) -> dict[str, Any]:
        resources = await self.store.get_resources(version)
        if resources is None:
            raise LookupError(f"resources version {version} not found")
        return dict(resources.items)

    async def _finish(
        self, attempt: Attempt, status: AttemptStatus, reward: float | None, error: ErrorInfo | None
    ) -> None:
        # One operation: the store client retries it within its budget (finish is idempotent for the same outcome).
        try:
            await self.store.finish(attempt.attempt_id, status, reward=reward, error=error)
            self.stats.ended[status.value] += 1
        except ConflictError as exc:  # StaleAttemptError: the lease was lost meanwhile; the retry's result wins
            log.info("attempt %s ended elsewhere; %s not recorded: %s", attempt.attempt_id, status.value, exc)
            self.stats.ended["stale"] += 1
        except Exception as exc:
            if getattr(exc, "http_status", None) == 409:
                self.stats.ended["stale"] += 1
                return
            log.error("could not report attempt %s as %s: %r", attempt.attempt_id, status.value, exc)
            # its lease expires and the store retries the rollout


_LEASE_PAUSES = Retry(tries=None, base_s=0.2, cap_s=5.0)
"""Pauses between lease operations while the store stays unreachable (jittered: runners do not return in
lockstep)."""

_STATUS_EVERY_S = 30.0
"""How often a runner whose store is down says so (the first failure at once)."""


class _Outage:
    """The store unreachable since the first failed lease: a status line at most every `_STATUS_EVERY_S`, and
    `StoreUnavailableError` once it has lasted ``patience_s`` (None: retry forever)."""

    def __init__(self, patience_s: float | None) -> None:
        self.patience_s = patience_s
        self.since = time.monotonic()
        self._said = -_STATUS_EVERY_S

    def failed(self, exc: BaseException) -> None:
        down = time.monotonic() - self.since
        if self.patience_s is not None and down >= self.patience_s:
            raise StoreUnavailableError(f"the store has been unreachable for {down:.0f} s, giving up: {exc}")
        if down - self._said >= _STATUS_EVERY_S:
            self._said = down
            limit = "" if self.patience_s is None else f", giving up after {self.patience_s:.0f} s"
            log.warning("store unreachable for %.0f s (%s); retrying%s", down, _short(exc), limit)

    def over(self) -> None:
        log.warning("store reachable again after %.0f s", time.monotonic() - self.since)


_langchain_naming: bool | None = None
"""Whether `lightrail.tracing.langchain` was installed in this process (False: it failed), None before it was
tried (LangChain not imported yet)."""


def _name_langchain_calls() -> None:
    """Name LangChain calls by their runnables (`lightrail.tracing.langchain.install`) once the agent has imported
    ``langchain_core``: tried when a runner starts and before each attempt (importing LangChain for agents that
    never do would slow every runner down). An install that fails (an incompatible LangChain) is logged once and
    never tried again; the attempts go on, their LangChain calls unnamed unless named otherwise."""
    global _langchain_naming
    if _langchain_naming is not None or "langchain_core" not in sys.modules:
        return
    try:
        from lightrail.tracing import langchain

        langchain.install()
    except Exception as exc:
        _langchain_naming = False
        log.warning(
            "cannot name LangChain calls by their runnables (%s); they go unnamed unless the agent names them "
            "(lightrail.as_agent, LLM.endpoint_for)",
            _short(exc),
        )
        return
    _langchain_naming = True


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def require_otel() -> None:
    """Fail at construction, not in the first attempt, when OpenTelemetry is not installed."""
    import importlib.util

    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            raise ImportError(f"otel=True needs OpenTelemetry ({module} is missing): pip install 'lightrail[otel]'")


def _shutdown_error() -> ErrorInfo:
    return ErrorInfo(type="RunnerShutdown", message="the runner stopped before the rollout finished")
