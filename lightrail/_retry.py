"""One retry schedule for every client path: exponential backoff with full jitter, within one budget per operation.

The n-th wait (n = 0, 1, ...) is drawn uniformly from ``[0, min(cap_s, base_s * 2**n)]`` ("full jitter"): many
runners that lost the store at the same moment come back spread over the window instead of in lockstep. An
operation's budget is a number of tries, a span of time, or both; `Retry.delays` ends when the next try would
exceed it, and the caller then reports the failure.

What is safe to retry is the caller's decision, made once per path: the store client resends any request (every
write carries the ids that make a replay a no-op) on transport errors and 502/503/504; the lean HTTP client resends
a written request only if it is idempotent (`lightrail._http`); a POST to a model server is never sent twice.

Where the retries are, so they do not multiply: the store client retries each request within its budget
(`StoreClient(retry=...)`). Loops that must outlast any outage (a runner's leases, the span batcher) call the
client again after its budget is spent, pausing between operations on a schedule of their own (`Retry(tries=None)`):
a pause between whole operations, never a second retry loop around the same request.

    retry = Retry(tries=9, base_s=0.05, cap_s=1.0)
    for delay in retry.delays():   # nothing is allocated until the first failure
        ...
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Retry"]


@dataclass(frozen=True)
class Retry:
    """How one operation is retried. ``tries``: attempts in all, the first included (None: no limit);
    ``budget_s``: seconds from the first failure after which no new try starts (None: no limit); waits grow from
    ``base_s`` doubling up to ``cap_s``, each drawn with full jitter."""

    tries: int | None = 9
    budget_s: float | None = None
    base_s: float = 0.05
    cap_s: float = 1.0

    def __post_init__(self) -> None:
        if self.tries is not None and self.tries < 1:
            raise ValueError(f"tries must be >= 1 (the first try counts), got {self.tries}")
        if self.base_s < 0 or self.cap_s < self.base_s:
            raise ValueError(f"need 0 <= base_s <= cap_s, got base_s={self.base_s}, cap_s={self.cap_s}")

    def delays(
        self, *, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Iterator[float]:
        """The waits before the 2nd, 3rd, ... try; ends when the budget is spent. Start iterating after the first
        failure: the time budget counts from there."""
        draw = (rng or random).uniform
        start = clock()
        n = 0
        while self.tries is None or n < self.tries - 1:
            delay = draw(0.0, min(self.cap_s, self.base_s * 2**n))
            if self.budget_s is not None and clock() - start + delay > self.budget_s:
                return
            yield delay
            n += 1
