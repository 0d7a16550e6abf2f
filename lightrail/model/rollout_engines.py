"""What samples `GRPO`'s rollouts: the `RolloutEngine` seam, and its two implementations.

* ``"embedded"`` (`EmbeddedRollouts`): the in-process transformers `lightrail.engine.Engine`; weights are copied in
  place after each update (the default; nothing else to run).
* ``"vllm"`` (`lightrail.model.vllm_rollouts.VLLMRollouts`): a ``vllm serve`` process, LoRA adapters or full weights synced
  after each update; with several policies, one server and one LoRA adapter per policy
  (`lightrail.model.vllm_rollouts.PolicyAdapter`, each a `RolloutEngine` of its own).

The loop only sees the protocol: start it, hand its `backend` to the gateway, read `policy_version`, `sync` the
updater after each update, `close` it. Another engine (verl's rollout workers, SGLang) is one more class with these
five members and one more name in `make_rollout_engine`; the loop does not change.

Concurrency model: every method runs on the trainer's event loop; implementations put blocking work (loading a
model, writing weights) in worker threads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["ROLLOUT_ENGINES", "EmbeddedRollouts", "RolloutEngine", "check_vllm_options", "make_rollout_engine"]

ROLLOUT_ENGINES = ("embedded", "vllm")


@runtime_checkable
class RolloutEngine(Protocol):
    """The model server GRPO samples from, whose weights follow the trainer's."""

    @property
    def backend(self) -> Any:
        """The `lightrail.gateway.Backend` the gateway forwards agents' calls to (after `start`)."""
        ...

    @property
    def policy_version(self) -> int:
        """The version that answers requests sent now; every generation carries the version that produced it."""
        ...

    async def start(self) -> None:
        """Load or reach the model; return once it serves."""
        ...

    async def sync(self, updater: Any, version: int) -> None:
        """Serve the `PolicyUpdater`'s current weights as ``version`` (greater than the current one). Requests sent
        after it returns are answered by them; requests in flight are never failed by it."""
        ...

    async def close(self) -> None:
        """Release the model (stop a server started by `start`)."""
        ...

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """The processes this started that must keep running while it is used: ``(name, exitcode)`` pairs, for the
        trainer to watch (`TrainerContext.watch_child`)."""
        ...


class EmbeddedRollouts:
    """The in-process `lightrail.engine.Engine` as a `RolloutEngine`: ``engine_options`` go to
    `Engine.from_pretrained`; `sync` merges the weights (`PolicyUpdater.state_dict_for_serving`) and copies them in
    place (`Engine.update_weights` drains in-flight generations first)."""

    def __init__(self, model: str | os.PathLike, **engine_options: Any) -> None:
        self.model = str(model)
        self.engine_options = engine_options
        self.engine: Any = None

    @property
    def backend(self) -> Any:
        return self.engine

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def sampling_dtype(self) -> str:
        """The dtype the engine samples in (``"float32"``, ``"bfloat16"``, ...; after `start`): below float32 its
        logprobs differ from the trainer's by more than rounding, which `GRPO` corrects (`sampler_correction`)."""
        return str(self.engine.model.dtype).removeprefix("torch.")

    async def start(self) -> None:
        from lightrail.engine import Engine

        self.engine = await asyncio.to_thread(Engine.from_pretrained, self.model, **self.engine_options)

    async def sync(self, updater: Any, version: int) -> None:
        state = await asyncio.to_thread(updater.state_dict_for_serving)
        await self.engine.update_weights(state, version=version)

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """None: the engine runs in this process."""
        return []

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
            self.engine = None


def make_rollout_engine(
    kind: str,
    model: str | os.PathLike,
    *,
    served_name: str,
    out_dir: str | os.PathLike,
    lora_rank: int | None,
    engine_options: dict[str, Any] | None = None,
    vllm: dict[str, Any] | None = None,
    adapters: int = 1,
) -> RolloutEngine:
    """The rollout engine named ``kind`` (see `ROLLOUT_ENGINES`). ``vllm``: `VLLMRollouts` options (``python``,
    ``url``, ``args``, ``env``, ``api_key``, ``startup_timeout_s``; files go to ``<out_dir>/vllm``); ``adapters``:
    the policies whose LoRA adapters one vLLM server serves side by side (`VLLMRollouts.policy`)."""
    if kind == "embedded":
        return EmbeddedRollouts(model, **(engine_options or {}))
    if kind == "vllm":
        from lightrail.model.vllm_rollouts import VLLMRollouts

        options = check_vllm_options(vllm)
        options.setdefault("workdir", Path(out_dir) / "vllm")
        for name in ("tool_format", "reasoning"):  # one setting for both engines: the model's formats
            if (engine_options or {}).get(name) is not None:
                options.setdefault(name, engine_options[name])  # type: ignore[index]
        return VLLMRollouts(model, served_name=served_name, lora_rank=lora_rank, adapters=adapters, **options)
    raise ValueError(f"rollout_engine must be one of {ROLLOUT_ENGINES}, not {kind!r}")


_VLLM_OPTIONS = frozenset(
    {
        "python",
        "url",
        "args",
        "env",
        "api_key",
        "startup_timeout_s",
        "request_timeout_s",
        "workdir",
        "tool_format",
        "reasoning",
    }
)


def check_vllm_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` as `VLLMRollouts` keyword arguments; an unknown name is a ValueError naming the accepted ones (a
    config's typo fails when the config is read, not after the model is built)."""
    options = dict(options or {})
    unknown = sorted(set(options) - _VLLM_OPTIONS)
    if unknown:
        raise ValueError(f"unknown vllm option(s) {unknown}; expected some of {sorted(_VLLM_OPTIONS)}")
    return options
