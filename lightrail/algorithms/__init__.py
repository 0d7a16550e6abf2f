"""Learning algorithms that turn recorded rollouts into a better policy.

SFT: `SFT` (`sft.py`) fine-tunes on the best recorded traces (rejection sampling from a store, `TraceFilter`; or
distillation from a teacher LLM), with lightrail's updater or, ``backend="llamafactory"``, LLaMA-Factory's trainer in
its own environment (`LlamaFactorySettings`, `llamafactory.py`); `Chain` runs algorithms one after another (SFT, then
GRPO).

GRPO: `GRPO` (`grpo.py`) is the training loop (an `Algorithm` for `Trainer.fit`); `PolicyUpdater`
runs the PPO-clipped policy update (`updater.py`; or SFT) over `lightrail.types.TrainingRow`s built by `lightrail.adapters`, on
a full model or a LoRA adapter, and hands merged weights to the engine (`DistributedPolicyUpdater`: on N ranks).
`policy_loss` / `loss_weights` are the loss as pure torch functions.

Names load on first use: importing the package (as every ``lightrail`` command does for ``lightrail export``'s
parser) must not import torch; touching `PolicyUpdater`, `GRPO`, ... does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it (tests/test_public_api.py checks it against __all__)
_EXPORTS: dict[str, str] = {
    "APO": "lightrail.algorithms.apo",
    "Chain": "lightrail.algorithms.chain",
    "GRPO": "lightrail.algorithms.grpo",
    "LlamaFactorySettings": "lightrail.model.llamafactory",
    "LoraSettings": "lightrail.model.updater",
    "LossNorm": "lightrail.model._loss",
    "PolicyUpdater": "lightrail.model.updater",
    "SFT": "lightrail.algorithms.sft",
    "TraceFilter": "lightrail.algorithms.rejection",
    "UpdateConfig": "lightrail.model.updater",
    "drop_stale_rows": "lightrail.model.updater",
    "loss_weights": "lightrail.model._loss",
    "pack_micro_batches": "lightrail.model.updater",
    "policy_loss": "lightrail.model._loss",
    "token_entropy": "lightrail.model._loss",
}

__all__ = [
    "APO",
    "Chain",
    "GRPO",
    "LlamaFactorySettings",
    "LoraSettings",
    "LossNorm",
    "PolicyUpdater",
    "SFT",
    "TraceFilter",
    "UpdateConfig",
    "drop_stale_rows",
    "loss_weights",
    "pack_micro_batches",
    "policy_loss",
    "token_entropy",
]


def __getattr__(name: str) -> Any:
    if name == "GRPOConfig":  # UpdateConfig's deprecated name: the updater warns on each use
        return importlib.import_module("lightrail.model.updater").GRPOConfig
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightrail.algorithms' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from lightrail.algorithms.apo import APO
    from lightrail.algorithms.chain import Chain
    from lightrail.algorithms.grpo import GRPO
    from lightrail.algorithms.rejection import TraceFilter
    from lightrail.algorithms.sft import SFT
    from lightrail.model._loss import LossNorm, loss_weights, policy_loss, token_entropy
    from lightrail.model.llamafactory import LlamaFactorySettings
    from lightrail.model.updater import (
        LoraSettings,
        PolicyUpdater,
        UpdateConfig,
        drop_stale_rows,
        pack_micro_batches,
    )
