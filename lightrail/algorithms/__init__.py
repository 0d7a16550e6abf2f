"""Learning algorithms that turn recorded rollouts into a better policy.

GRPO (this package, today): `GRPO` is the training loop (an `Algorithm` for `Trainer.fit`); `PolicyUpdater`
runs the PPO-clipped policy update (or SFT) over `lightrail.types.TrainingRow`s built by `lightrail.adapters`, on
a full model or a LoRA adapter, and hands merged weights to the engine.
`policy_loss` / `loss_weights` are the loss as pure torch functions.

Importing this package imports torch (and the engine package, for the one place that decides torch threads).
"""

from __future__ import annotations

from lightrail.algorithms._loss import LossNorm, loss_weights, policy_loss, token_entropy
from lightrail.algorithms.grpo import GRPOConfig, LoraSettings, PolicyUpdater, drop_stale_rows, pack_micro_batches
from lightrail.algorithms.loop import GRPO

__all__ = [
    "GRPO",
    "GRPOConfig",
    "LoraSettings",
    "LossNorm",
    "PolicyUpdater",
    "drop_stale_rows",
    "loss_weights",
    "pack_micro_batches",
    "policy_loss",
    "token_entropy",
]
