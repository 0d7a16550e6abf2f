"""The `Algorithm` protocol: what a training method (GRPO, APO, SFT, ...) plugs into the `Trainer`.

The trainer owns the plumbing (store, store server, runner processes, shutdown); an algorithm owns the learning
loop and talks to everything else through the `TrainerContext` it is given: it enqueues rollouts, reads their
spans, updates whatever it trains (weights, a prompt) and publishes the result as a new resources version,
which later rollouts use.

How the three planned algorithms map onto it:

* GRPO: ``setup`` starts the engine and gateway and publishes an `LLM` resource pointing at the gateway;
  ``run`` loops: `TrainerContext.run_rollouts` (mode train, n samples per task) → spans → transitions
  (adapters) → policy update → engine reloads weights → `TrainerContext.publish` (new policy version).
* APO: ``setup`` publishes the initial `PromptTemplate`; ``run`` evaluates it on val rollouts, asks an LLM
  for edits, evaluates candidates and publishes the best prompt.
* SFT: ``run`` collects rollouts, keeps the best-rewarded ones as chat transcripts, fine-tunes, publishes.

Concurrency model: all three methods are coroutines run on the trainer's event loop, one after the other
(``setup``, ``run``, then ``close`` even if ``run`` raised). Blocking work (a training step) belongs in a
thread (``asyncio.to_thread``) or another process, so waiting on rollouts stays responsive.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lightrail.store.base import Store
from lightrail.types import LLM, Mode, PromptTemplate, Resources, RetryPolicy, Rollout, RolloutSpec, RolloutStatus, Task

__all__ = ["Algorithm", "TrainerContext", "cancel_unfinished"]


@dataclass
class TrainerContext:
    """What an algorithm gets from the trainer: the store (shared with the runners), the data, and helpers for
    the common steps."""

    store: Store
    train_tasks: list[Task]
    val_tasks: list[Task] = field(default_factory=list)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """The retry policy the trainer's rollouts carry (lease length, attempts, time budget)."""
    on_progress: Callable[[int, int], None] | None = None
    """Called with (done, total) while `run_rollouts` waits; the trainer draws its progress bar with it."""
    health_check: Callable[[], None] | None = None
    """Called while waiting; raises when rollouts can no longer finish (the trainer: every runner died)."""
    log: Callable[..., None] = field(default=lambda step, **metrics: None)
    """``log(step, **metrics)``: report metrics (the trainer prints them)."""
    track: Callable[[dict[str, Any]], None] = field(default=lambda record: None)
    """``track(record)``: mirror a ``metrics.jsonl`` record (``kind``, ``step`` or ``round``, numbers) to the run's
    experiment trackers (`lightrail.tracking`)."""
    watch_child: Callable[[str, Callable[[], int | None]], Callable[[], None]] = field(
        default=lambda name, exitcode: lambda: None
    )
    """``forget = watch_child(name, exitcode)``: have the trainer watch a process the algorithm started (an update's
    worker ranks, a vLLM server; ``exitcode()`` is None while it runs). One that exits on its own stops the run
    within seconds with one line naming it (`lightrail.trainer.children.ChildWatch`). Call ``forget()`` before
    stopping the process on purpose; the trainer forgets every process handed over before it calls ``close``."""
    run: str | None = None
    """The run these rollouts belong to: `run_rollouts` tags each with ``metadata["run"]`` (what ``lightrail runs``
    groups by). The trainer names it after the algorithm's ``out_dir`` (so a resumed run keeps its name), else the
    command and the time it started."""

    async def publish(self, resources: Resources | dict[str, LLM | PromptTemplate]) -> Resources:
        """Store a new resources version; rollouts enqueued afterwards use it. Returns it with its version."""
        if not isinstance(resources, Resources):
            resources = Resources(items=dict(resources))
        return await self.store.put_resources(resources)

    async def run_rollouts(
        self,
        tasks: Iterable[Task],
        *,
        mode: Mode = "train",
        n_samples: int = 1,
        resources_version: int | None = None,
        timeout_s: float | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> list[Rollout]:
        """Enqueue ``n_samples`` rollouts per task and wait until all are terminal (or ``timeout_s`` passes);
        returns them in enqueue order (samples of a task adjacent: a GRPO group). Waiting is event-driven
        (`Store.wait`); rollouts whose runner died are retried by the store, never waited on forever. Each rollout
        carries ``metadata`` (e.g. the training step, which the dashboard shows) and the run tag."""
        ids = await self.enqueue_rollouts(
            tasks, mode=mode, n_samples=n_samples, resources_version=resources_version, metadata=metadata
        )
        return await self.wait_for(ids, timeout_s=timeout_s)

    async def enqueue_rollouts(
        self,
        tasks: Iterable[Task],
        *,
        mode: Mode = "train",
        n_samples: int = 1,
        resources_version: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> list[str]:
        """`run_rollouts` without the wait: enqueue, return the rollout ids (for `wait_for` later, as asynchronous
        GRPO does to keep runners sampling while it updates)."""
        metadata = {**(metadata or {}), **({"run": self.run} if self.run is not None else {})}
        specs = [
            RolloutSpec(
                task=task,
                mode=mode,
                sample_index=i,
                resources_version=resources_version,
                policy=self.retry,
                metadata=dict(metadata),
            )
            for task in tasks
            for i in range(n_samples)
        ]
        return [r.rollout_id for r in await self.store.enqueue(specs)]

    async def wait_for(self, rollout_ids: Sequence[str], *, timeout_s: float | None = None) -> list[Rollout]:
        """Wait until the rollouts are terminal (or ``timeout_s`` passes), reporting progress; returns them all
        (unfinished ones in their current state) in the given order."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = set(rollout_ids)
        total = len(rollout_ids)
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            # a long poll, capped so progress is reported about twice a second
            done = await self.store.wait(list(pending), timeout_s=0.5 if left is None else min(0.5, left))
            pending.difference_update(r.rollout_id for r in done)
            if self.on_progress is not None:
                self.on_progress(total - len(pending), total)
            if self.health_check is not None:
                self.health_check()
        by_id = {r.rollout_id: r for r in await self.store.query_rollouts(rollout_ids=list(rollout_ids))}
        return [by_id[i] for i in rollout_ids]


@runtime_checkable
class Algorithm(Protocol):
    """A training method. The trainer calls ``setup``, then ``run``, then ``close`` (always).

    Example (an "algorithm" that only evaluates)::

        class Evaluate:
            async def setup(self, ctx):
                await ctx.publish({"llm": LLM(endpoint="http://127.0.0.1:8000/v1", model="tiny")})

            async def run(self, ctx):
                rollouts = await ctx.run_rollouts(ctx.val_tasks, mode="val")
                rewards = [r.reward for r in rollouts if r.reward is not None]
                ctx.log(0, val_reward=sum(rewards) / max(len(rewards), 1))

            async def close(self):
                pass
    """

    async def setup(self, ctx: TrainerContext) -> None:
        """Prepare: start engines or servers the algorithm owns, publish the initial resources."""
        ...

    async def run(self, ctx: TrainerContext) -> None:
        """The training loop: enqueue rollouts, learn from their spans, publish new resources versions."""
        ...

    async def close(self) -> None:
        """Release what ``setup`` started (called even when ``run`` failed)."""
        ...


async def cancel_unfinished(store: Store, run: str | None) -> int:
    """Cancel the rollouts of ``run`` an earlier session left queued or running (a trainer killed mid-step, then
    resumed or started again in the same output folder): they name resources of a gateway that is gone, and the
    new session enqueues its own. The trainer calls this before its runners start. Returns how many."""
    if run is None:
        return 0
    active = await store.query_rollouts(status=[RolloutStatus.QUEUED, RolloutStatus.RUNNING])
    stale = [r.rollout_id for r in active if r.metadata.get("run") == run]
    if stale:
        await store.cancel(stale)
    return len(stale)
