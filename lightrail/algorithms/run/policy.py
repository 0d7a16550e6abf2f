"""Serving the policy a run trains or measures (`ServedPolicy`: a backend behind a recording gateway with a random
token, and the `LLM` resource that reaches it), measuring it (`validate`, with `success_rate`: the one meaning of
success) and reading what its rollouts did (`last_attempt_spans`).

Concurrency model: coroutines on the trainer's event loop (engines compute in their own worker threads).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightrail.adapters.selection import POLICY_OUTCOMES
from lightrail.types import LLM, PromptTemplate, Rollout, Span, Task

if TYPE_CHECKING:
    from lightrail.algorithms.protocol import TrainerContext
    from lightrail.gateway.server import GatewayServer, GatewaySettings

__all__ = [
    "POLICY_RESOURCE_NAMES",
    "ServedPolicy",
    "Validation",
    "last_attempt_spans",
    "policy_resources",
    "succeeded",
    "success_rate",
    "validate",
]

POLICY_RESOURCE_NAMES = ("llm", "main_llm")
"""The names a run publishes its policy `LLM` under: lightrail's ``llm`` and Agent Lightning's ``main_llm`` (what its
walkthroughs and examples read), so an agent finds it by either."""


def policy_resources(llm: LLM, name: str = "llm") -> dict[str, LLM | PromptTemplate]:
    """The resources that publish ``llm`` as the policy: under ``name`` (a section's ``llm_name``) and
    `POLICY_RESOURCE_NAMES`; one resource under several names (agents that pick "the only LLM" still find one)."""
    return {n: llm for n in dict.fromkeys((name, *POLICY_RESOURCE_NAMES))}


@dataclass
class ServedPolicy:
    """``gateway`` (a started `GatewayServer`) in front of a backend (an engine's, a teacher's, a router of several
    policies) whose model answers to ``name``; ``engine``: the `EmbeddedRollouts` it owns (`embedded`), if any.

        >>> served = await ServedPolicy.embedded("runs/sft/model", ctx.store)   # doctest: +SKIP
        >>> await ctx.publish({"llm": served.llm({"temperature": 0.0})})        # doctest: +SKIP
    """

    gateway: GatewayServer
    name: str = "policy"
    engine: Any = None

    @classmethod
    async def start(
        cls, backend: Any, store: Any, where: GatewaySettings | None = None, *, name: str = "policy",
        free_port: bool = False,
    ) -> ServedPolicy:  # fmt: skip
        """Serve ``backend`` where ``where`` says (default: 127.0.0.1, a free port). ``free_port``: another gateway
        of the run holds the configured port, so this one binds a free one (and advertises the configured URL only
        when the configured port was 0 too)."""
        from lightrail.gateway.server import GatewayServer, GatewaySettings

        where = where or GatewaySettings()
        port = 0 if free_port else where.port
        gateway = await GatewayServer(
            backend, store, token=secrets.token_urlsafe(16), host=where.host, port=port,
            advertise_url=where.advertise_url if port == where.port else None,
        ).start()  # fmt: skip
        return cls(gateway, name)

    @classmethod
    async def embedded(
        cls, model: str | Path, store: Any, where: GatewaySettings | None = None, *, name: str = "policy",
        engine_options: dict[str, Any] | None = None, free_port: bool = False,
    ) -> ServedPolicy:  # fmt: skip
        """``model`` (a local model folder) on an embedded engine (``engine_options``), served as in `start`."""
        from lightrail.model.rollout_engines import EmbeddedRollouts

        engine = EmbeddedRollouts(model, **(engine_options or {}))
        await engine.start()
        try:
            served = await cls.start(engine.backend, store, where, name=name, free_port=free_port)
        except BaseException:
            await engine.close()
            raise
        served.engine = engine
        return served

    def llm(self, sampling: dict[str, Any], model: str | None = None) -> LLM:
        """The `LLM` resource that reaches the policy through the gateway (``model``: another name it serves)."""
        return LLM(endpoint=self.gateway.url, model=model or self.name, sampling=sampling, api_key=self.gateway.token)

    async def close(self) -> None:
        """Stop the gateway, then the engine it owns. Closed while its task is being cancelled (the trainer stops
        the run: a child process died, Ctrl-C), the gateway does not wait for agent calls in flight
        (`GatewayServer.stop` ``abort``): with the store gone they would wait forever."""
        task = asyncio.current_task()
        await self.gateway.stop(abort=task is not None and task.cancelling() > 0)
        if self.engine is not None:
            await self.engine.close()


def succeeded(rollout: Rollout, threshold: float) -> bool:
    """The one meaning of a success: a policy outcome (`POLICY_OUTCOMES`: succeeded, failed, timed out;
    infrastructure errors and cancellations are not the policy's) with a reward of at least ``threshold``."""
    return rollout.status in POLICY_OUTCOMES and rollout.reward is not None and rollout.reward >= threshold


def success_rate(rollouts: Sequence[Rollout], threshold: float) -> float:
    """Among ``rollouts`` with a policy outcome, the share that `succeeded` (0.0 if none)."""
    finished = [r for r in rollouts if r.status in POLICY_OUTCOMES]
    return sum(1 for r in finished if succeeded(r, threshold)) / len(finished) if finished else 0.0


@dataclass
class Validation:
    """One held-out validation: its ``success`` (`success_rate`) and its ``rollouts``."""

    success: float
    rollouts: list[Rollout]

    def line(self, stage: str, step: int) -> str:
        """What a log shows of it: ``GRPO validation at step 3: held-out success 0.40 (4 of 10 tasks)`` (the tasks
        with a policy outcome: `success_rate`'s denominator)."""
        counted = sum(1 for r in self.rollouts if r.status in POLICY_OUTCOMES)
        won = round(self.success * counted)
        return f"{stage} validation at step {step}: held-out success {self.success:.2f} ({won} of {counted} tasks)"

    def metrics(self, step: int, **extra: Any) -> dict[str, Any]:
        """Its ``metrics.jsonl`` record (``val_infra_excluded``: rollouts with no policy outcome)."""
        excluded = sum(1 for r in self.rollouts if r.status not in POLICY_OUTCOMES)
        return {"kind": "val", "step": step, **extra, "val_success": self.success,
                "val_rollouts": len(self.rollouts), "val_infra_excluded": excluded}  # fmt: skip


async def validate(
    ctx: TrainerContext,
    tasks: Sequence[Task],
    llm: LLM,
    threshold: float,
    *,
    metadata: dict[str, Any] | None = None,
    name: str = "llm",
) -> Validation:
    """Publish ``llm`` (`policy_resources`, under ``name`` too) and run each of ``tasks`` once with it (mode ``val``,
    carrying ``metadata``)."""
    version = await ctx.publish(policy_resources(llm, name))
    rollouts = await ctx.run_rollouts(tasks, mode="val", resources_version=version.version, metadata=metadata)
    return Validation(success_rate(rollouts, threshold), rollouts)


async def last_attempt_spans(store: Any, rollouts: Sequence[Rollout]) -> list[list[Span]]:
    """Spans of each rollout's last attempt (earlier attempts were lost or failed in the infrastructure)."""
    limit = asyncio.Semaphore(16)

    async def one(rollout: Rollout) -> list[Span]:
        async with limit:
            attempts = await store.query_attempts(rollout.rollout_id)
            if not attempts:
                return []
            return await store.query_spans(rollout.rollout_id, attempts[-1].attempt_id)

    return list(await asyncio.gather(*(one(r) for r in rollouts)))
