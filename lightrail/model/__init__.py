"""The model plane: what holds and changes the weights, below the algorithms that decide what to train.

* `updater`: `PolicyUpdater`, the policy update (GRPO/PPO/SFT losses over token rows, LoRA or full, micro-batches,
  shared prefixes, checkpoints); its settings, torch-free, are `update_config`'s (`UpdateConfig`); `ppo` adds a value
  head; `_loss` holds the losses, `policy_losses` and `kl` the registries of policy losses and KL estimators.
* `distributed`: the update on N data-parallel ranks (`DistributedPolicyUpdater`).
* `mismatch`: the trainer's logprobs against the sampler's, per row.
* `rollout_engines`, `vllm_rollouts`: what samples the rollouts (the embedded engine, or vLLM) and how new weights
  reach it after each update.
* `checkpoint`, `export`: atomic checkpoint directories, and a checkpoint turned into a model folder.
* `llamafactory`: LLaMA-Factory's trainer as an SFT backend.

Nothing here imports `lightrail.algorithms`; the algorithms (`GRPO`, `SFT`, `APO`) compose these pieces. This face
exports the public names, loaded on first use (importing the package must not import torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail._lazy import lazy_face

if TYPE_CHECKING:  # the export list (read by `lazy_face`; names load on first use)
    from lightrail.model._loss import loss_weights, policy_loss, token_entropy
    from lightrail.model.llamafactory import LlamaFactorySettings
    from lightrail.model.update_config import LoraSettings, LossNorm, UpdateConfig
    from lightrail.model.updater import PolicyUpdater, drop_stale_rows, pack_micro_batches

_EXPORTS, __all__, __getattr__, __dir__ = lazy_face(__name__, __file__)
