"""`SpanRecorder`: writes spans into a store in batches, off the request path.

Request handlers hand a finished span to `SpanRecorder.record` and return; a background task collects what
arrived within ``linger_s`` (or ``max_batch`` spans) and writes it with one `Store.add_spans` call. Writes are
idempotent by span id, so a failed batch is retried as is, with backoff, until it is stored: nothing
acknowledged by `record` is dropped because the store was briefly unreachable. The only spans given up are
ones the store refuses for good (a `StoreError` with a 4xx ``http_status``, e.g. an unknown attempt): the batch is then retried one span
at a time so a single bad span cannot block the others, and the refused ones are counted in
`SpanRecorder.rejected` and logged.

Backpressure: at most ``max_pending`` spans wait in memory; `record` awaits when the queue is full, which
slows the callers (agents) down to the speed of the store instead of growing without bound.

Concurrency model: one event loop, no locks. The writer task starts on the first `record` (or `start`) in
the running loop; `close` flushes and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence

from lightrail.store.base import Store, StoreError
from lightrail.types import Span

__all__ = ["SpanRecorder"]

log = logging.getLogger(__name__)


class SpanRecorder:
    """Batch spans into ``store.add_spans`` from a background task.

    Example::

        recorder = SpanRecorder(store)
        await recorder.record(span)   # returns at once unless max_pending spans are already waiting
        await recorder.flush()        # everything recorded so far is in the store
        await recorder.close()        # flush, then stop the writer
    """

    def __init__(
        self,
        store: Store,
        *,
        max_batch: int = 512,
        linger_s: float = 0.002,
        max_pending: int = 20_000,
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
        """Spans the store accepted (including ones it already had)."""
        self.rejected = 0
        """Spans the store refused for good (logged); never retried."""
        self.failures = 0
        """Failed `add_spans` calls that were retried."""
        self._queue: deque[Span] = deque()
        self._inflight = 0
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def pending(self) -> int:
        """Spans recorded but not yet written (queued or in the batch being written)."""
        return len(self._queue) + self._inflight

    def start(self) -> None:
        """Start the writer task in the running event loop (`record` does this on first use)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lightrail-span-recorder")

    async def record(self, span: Span) -> None:
        """Queue ``span`` for writing. Returns immediately unless ``max_pending`` spans are waiting."""
        if self._closing:
            raise RuntimeError("SpanRecorder is closed")
        while len(self._queue) >= self.max_pending:
            self._space.clear()
            await self._space.wait()
        self._queue.append(span)
        self._idle.clear()
        if self._task is None or self._task.done():
            self.start()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every span recorded so far has been written (or rejected)."""
        if self._task is None and self._queue:
            self.start()
        await self._idle.wait()

    async def close(self, timeout_s: float | None = 30.0) -> None:
        """Flush, then stop the writer. Raises `TimeoutError` if the store did not take the remaining spans
        within ``timeout_s`` (they are then lost with the process, and their number is logged)."""
        self._closing = True
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.error("span recorder closing with %d spans not written to the store", self.pending)
            raise
        finally:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
                self._task = None

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
            if self.linger_s > 0 and len(self._queue) < self.max_batch:
                await asyncio.sleep(self.linger_s)  # let concurrent requests join this batch
            n = min(len(self._queue), self.max_batch)
            batch = [self._queue.popleft() for _ in range(n)]
            self._inflight = n
            self._space.set()
            try:
                await self._write(batch)
            finally:
                self._inflight = 0

    async def _write(self, batch: Sequence[Span]) -> None:
        delay = self.retry_initial_s
        while True:
            try:
                await self.store.add_spans(batch)
                self.written += len(batch)
                return
            except StoreError as exc:
                if exc.http_status >= 500:  # the store says "unavailable": transient, like a network error
                    self._note_failure(len(batch), exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_max_s)
                    continue
                if len(batch) > 1:
                    for span in batch:  # isolate the span(s) the store refuses
                        await self._write([span])
                    return
                self.rejected += 1
                log.error("store refused span %s of attempt %s: %s", batch[0].span_id, batch[0].attempt_id, exc)
                return
            except Exception as exc:  # transient (network, store restarting): retry the same batch
                self._note_failure(len(batch), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)

    def _note_failure(self, n: int, exc: Exception, delay: float) -> None:
        self.failures += 1
        log.warning("writing %d spans failed (%r); retrying in %.2fs", n, exc, delay)
