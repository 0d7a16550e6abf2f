"""Learning algorithms that turn recorded rollouts into a better policy.

SFT: `SFT` (`sft.py`) fine-tunes on the best recorded traces (rejection sampling from a store, `TraceFilter`; or
distillation from a teacher LLM), with lightrail's updater or, ``backend="llamafactory"``, LLaMA-Factory's trainer in
its own environment (`LlamaFactorySettings`, `llamafactory.py`); `Chain` runs algorithms one after another (SFT, then
GRPO).

GRPO: `GRPO` (`grpo.py`) is the training loop (an `Algorithm` for `Trainer.fit`) over `lightrail.types.TrainingRow`s
built by `lightrail.adapters`; the policy update itself (`PolicyUpdater`, `UpdateConfig`, the losses) is the model
plane's, exported by `lightrail.model`. APO (`apo.py`) optimizes prompts.

Names load on first use: importing the package (as every ``lightrail`` command does for ``lightrail export``'s
parser) must not import torch; touching `GRPO`, ... does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail._lazy import lazy_face

if TYPE_CHECKING:  # the export list (read by `lazy_face`; names load on first use)
    from lightrail.algorithms.apo import APO
    from lightrail.algorithms.chain import Chain
    from lightrail.algorithms.grpo import GRPO
    from lightrail.algorithms.rejection import TraceFilter
    from lightrail.algorithms.sft import SFT

_MOVED = ("GRPOConfig", "LlamaFactorySettings", "LoraSettings", "LossNorm", "PolicyUpdater", "UpdateConfig",
          "drop_stale_rows", "loss_weights", "pack_micro_batches", "policy_loss", "token_entropy")  # fmt: skip
"""The model plane's names this package exported before `lightrail.model` had a face: still served, with a
`DeprecationWarning` naming `lightrail.model` (``GRPOConfig``: UpdateConfig's old name, which warns itself too)."""

_EXPORTS, __all__, __getattr__, __dir__ = lazy_face(
    __name__, __file__, deprecated={**dict.fromkeys(_MOVED, "lightrail.model"), "GRPOConfig": "lightrail.model.updater"}
)
