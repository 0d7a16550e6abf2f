"""`SpanBatcher`: the `SpanSink` a runner gives its attempts; ships their spans to a store in batches.

Emitting must be cheap (an append), storing must be efficient (one ``add_spans`` call per batch, shared by
all concurrent attempts of the process) and complete (the runner awaits `SpanBatcher.flush` before it
finishes an attempt, so a finished attempt's spans are all in the store).

Failures: a batch that fails for a transient reason (network, a restarting store) is written again as is, after
jittered pauses (`lightrail._retry`; the store client already retried each write within its budget), until stored; writes are idempotent by span id, so a retry never duplicates. Spans the store refuses
for good (an error carrying a 4xx ``http_status``, such as an unknown attempt) are isolated by retrying span by
span, then counted in `rejected` and logged.

Backpressure: at most ``max_pending`` spans wait in memory, counting every span not yet settled (queued, in the
batch being written, or handed over by a thread and not yet queued): one count, so a thread blocked in `submit` and
the runner's `wait_capacity` see the same "full" and are both released by the write that settles spans, never by the
writer merely taking a batch off the queue. Emitters in worker threads block in `submit`; emitters on the event loop
cannot block it, so the runner instead stops leasing new rollouts (`wait_capacity`) while memory is full, and spans
beyond ``2 * max_pending`` are dropped and counted (`dropped`), the one case where memory wins over completeness.

Concurrency model: the queue belongs to one event loop and is only touched from it. `submit` from the loop's
thread appends directly; from any other thread it hands the span over with ``loop.call_soon_threadsafe``
(ordered: a thread's spans arrive before anything it schedules afterwards, such as its completion).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from lightrail._retry import Retry
from lightrail.types import Span

__all__ = ["SpanBatcher"]

log = logging.getLogger(__name__)


def _permanent(exc: BaseException) -> bool:
    """A refusal retrying cannot fix: the store's own 4xx errors (`StoreError.http_status`), or an HTTP 4xx."""
    status = getattr(exc, "http_status", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


class SpanBatcher:
    """Batch spans from many concurrent attempts into ``store.add_spans`` calls.

    Example::

        batcher = SpanBatcher(store)
        batcher.start()                 # in the runner's event loop
        batcher.submit(span)            # from the loop or any thread; returns at once
        await batcher.flush()           # every span submitted so far is stored
        await batcher.close()
    """

    def __init__(
        self,
        store: Any,
        *,
        max_batch: int = 512,
        linger_s: float = 0.005,
        max_pending: int = 50_000,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 2.0,
    ) -> None:
        if max_batch < 1 or max_pending < max_batch:
            raise ValueError("need 1 <= max_batch <= max_pending")
        self.store = store
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.max_pending = max_pending
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.written = 0
        """Spans the store accepted."""
        self.rejected = 0
        """Spans the store refused for good (logged)."""
        self.dropped = 0
        """Spans dropped because ``2 * max_pending`` were already waiting (logged)."""
        self.failures = 0
        """Failed ``add_spans`` calls that were retried."""
        self.abandoned = 0
        """Spans given up unwritten by `abandon` (or submitted after it)."""
        self._queue: deque[Span] = deque()
        self._accepted = 0  # spans ever queued; with _settled, tells a flush when "everything so far" is done
        self._settled = 0  # spans written, rejected or given up
        self._flushers: list[tuple[int, asyncio.Future[bool]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._space_async: asyncio.Event | None = None
        self._room = threading.Condition()  # worker threads wait on it while max_pending spans are pending
        self._inbound = 0  # spans handed over by threads, not yet queued by the loop (guarded by _room)
        self._abandoned = False

    @property
    def pending(self) -> int:
        """Spans submitted but not yet settled (queued or being written)."""
        return self._accepted - self._settled

    def start(self) -> None:
        """Bind to the running event loop and start the writer task (idempotent)."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            raise RuntimeError("SpanBatcher is bound to another event loop")
        if self._loop is None:
            self._loop, self._thread_id = loop, threading.get_ident()
            self._wake, self._space_async = asyncio.Event(), asyncio.Event()
            self._space_async.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="lightrail-span-batcher")

    def submit(self, span: Span) -> None:
        """Queue ``span`` for the store. Safe from any thread; never raises into the caller."""
        if self._abandoned:
            self.abandoned += 1
            return
        if threading.get_ident() == self._thread_id:
            self._accept(span)
            return
        loop = self._loop
        if loop is None:
            raise RuntimeError("SpanBatcher.start() must be called in the event loop first")
        with self._room:
            # backpressure on a worker thread: wait until a write settles spans (spans in transit count too);
            # `_settle` notifies, and only a settle lowers `pending`
            if self.pending + self._inbound >= self.max_pending:
                self._room.wait_for(lambda: self.pending + self._inbound < self.max_pending, timeout=60.0)
            self._inbound += 1
        try:
            loop.call_soon_threadsafe(self._accept_from_thread, span)
        except RuntimeError:  # the loop is closed: a sync agent kept running after its runner exited
            with self._room:
                self._inbound -= 1
            self.dropped += 1

    def _accept_from_thread(self, span: Span) -> None:
        with self._room:
            self._inbound -= 1
        self._accept(span)

    def _accept(self, span: Span) -> None:
        if self._abandoned:
            self.abandoned += 1
            return
        if self.pending >= 2 * self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 10_000 == 0:
                log.error("span queue full (store too slow or down): %d spans dropped so far", self.dropped)
            return
        self._queue.append(span)
        self._accepted += 1
        if self.pending >= self.max_pending:
            assert self._space_async is not None
            self._space_async.clear()
        assert self._wake is not None
        self._wake.set()

    async def wait_capacity(self) -> None:
        """Return once fewer than ``max_pending`` spans are pending (the runner calls this before leasing)."""
        if self._space_async is not None:
            await self._space_async.wait()

    async def flush(self) -> bool:
        """Wait until every span submitted so far (from this loop, or handed over by threads before this call)
        is stored or refused for good. False when they were `abandon`ed instead: some may not be stored."""
        if self._loop is None or self._abandoned:
            return not self._abandoned
        target = self._accepted
        if self._settled >= target:
            return True
        future: asyncio.Future[bool] = self._loop.create_future()
        self._flushers.append((target, future))
        assert self._wake is not None
        self._wake.set()
        return await future  # True once written or refused; False when `abandon` gave them up first

    def abandon(self) -> int:
        """Give up every span not yet written, for a process being stopped whose store may be gone (a write is
        retried for as long as the store is down): the writer stops, every `flush` returns False, spans submitted
        later are counted in `abandoned` and dropped. Returns how many pending spans were given up."""
        self._abandoned = True
        given_up = self.pending
        self.abandoned += given_up
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()
        for _, future in self._flushers:  # (a flush whose spans were all written was answered True already)
            if not future.done():
                future.set_result(False)
        self._flushers = []
        if self._loop is not None:  # (nothing was ever queued before `start`)
            self._settle(given_up)
        if given_up:  # the run is being stopped and said so in its own line: details for --debug
            log.info("span batcher stopped with %d spans of unfinished attempts not written to the store", given_up)
        return given_up

    async def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush (up to ``timeout_s``), then stop the writer. Spans still unwritten are logged as lost."""
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.error("span batcher closing with %d spans not written to the store", self.pending)
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.linger_s > 0 and len(self._queue) < self.max_batch and not self._flushers:
                await asyncio.sleep(self.linger_s)  # let concurrent attempts' spans join this batch
            n = min(len(self._queue), self.max_batch)
            batch = [self._queue.popleft() for _ in range(n)]
            try:
                await self._write(batch)
            finally:
                self._settle(n)

    def _settle(self, n: int) -> None:
        self._settled = min(self._settled + n, self._accepted)  # (a batch `abandon` settled may settle again)
        if self.pending < self.max_pending:
            assert self._space_async is not None
            self._space_async.set()
        with self._room:
            self._room.notify_all()
        if self._flushers:
            still = []
            for target, future in self._flushers:
                if self._settled >= target:
                    if not future.done():
                        future.set_result(True)
                else:
                    still.append((target, future))
            self._flushers = still

    async def _write(self, batch: Sequence[Span]) -> None:
        pauses = None  # between writes of this batch while the store stays down (the client retried each one)
        while True:
            try:
                await self.store.add_spans(batch)
                self.written += len(batch)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if _permanent(exc):
                    if len(batch) > 1:
                        for one in batch:  # isolate the span(s) the store refuses; keep the others
                            await self._write([one])
                        return
                    self.rejected += 1
                    log.error("store refused span %s of attempt %s: %s", batch[0].span_id, batch[0].attempt_id, exc)
                    return
                self.failures += 1
                pauses = pauses or Retry(tries=None, base_s=self.retry_initial_s, cap_s=self.retry_max_s).delays()
                pause = next(pauses)
                log.warning("writing %d spans failed (%r); writing again in %.2fs", len(batch), exc, pause)
                await asyncio.sleep(pause)
