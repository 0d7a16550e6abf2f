"""The policy update's settings, torch-free: `UpdateConfig` (GRPO's, PPO's, SFT's and continuous learning's
optimizer and loss settings), `LoraSettings`, the loss normalisations (`LossNorm`) and the learning-rate schedule
(`lr_factor`). Checking a config reads them without loading torch; `lightrail.model.updater` trains with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from lightrail.model.kl import KL_ESTIMATORS
from lightrail.model.policy_losses import POLICY_LOSSES

__all__ = [
    "LLAMA_LINEAR_PROJECTIONS",
    "CriticSettings",
    "LOSS_AGG",
    "LOSS_NORMS",
    "LoraSettings",
    "LossNorm",
    "UpdateConfig",
    "lr_factor",
    "resolve_loss_norm",
]

#: Every linear projection of a Llama-style decoder layer (attention and MLP); the LM head and embeddings stay frozen.
LLAMA_LINEAR_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

LossNorm = Literal["token", "sequence", "rollout", "sequence_sum_norm"]
"""How the step's loss is normalised: ``token`` = mean over all masked tokens of the step; ``sequence`` = mean over
tokens within each row, then mean over rows; ``rollout`` = the same with all rows of one rollout pooled, so every
rollout weighs the same however many rows (LLM calls) it produced; ``sequence_sum_norm`` = each row's token sum
divided by a constant L (``UpdateConfig.loss_norm_tokens``), then mean over rows (Dr. GRPO)."""

LOSS_NORMS: tuple[LossNorm, ...] = ("token", "sequence", "rollout", "sequence_sum_norm")

LOSS_AGG: dict[str, LossNorm] = {
    "token_mean": "token",
    "seq_mean_token_mean": "sequence",
    "seq_mean_token_sum_norm": "sequence_sum_norm",
}
"""verl's ``loss_agg_mode`` names (with ``_`` for ``-``) and the `LossNorm` each one is."""


def resolve_loss_norm(name: str) -> LossNorm:
    """The `LossNorm` of ``name``: one of `LOSS_NORMS` or a verl name of `LOSS_AGG`; ValueError otherwise.

    >>> resolve_loss_norm("seq_mean_token_sum_norm")
    'sequence_sum_norm'
    """
    if name in LOSS_AGG:
        return LOSS_AGG[name]
    for norm in LOSS_NORMS:
        if norm == name:
            return norm
    raise ValueError(f"loss_agg: expected one of {[*LOSS_AGG, *LOSS_NORMS]}, got {name!r}")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter shape (passed to ``peft.LoraConfig``). ``W' = W + (alpha / r) * B @ A``, B initialised to 0."""

    r: int = 16
    """Rank of the adapter matrices."""
    alpha: int = 32
    """Scale numerator: the update is ``(alpha / r) * B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapter input; > 0 makes the PPO ratio noisy (the sampler ran without it)."""
    target_modules: tuple[str, ...] = LLAMA_LINEAR_PROJECTIONS
    """Names of the linear layers that get adapters (Llama's attention and MLP projections by default)."""


@dataclass(frozen=True)
class CriticSettings:
    """PPO's critic (`GRPO` ``advantage="gae"``, `lightrail.model.ppo`): GAE over each call's tokens and the value
    head's loss beside the policy's (``grpo.config.critic``; formulas in `lightrail.model._loss`)."""

    gamma: float = 1.0
    """GAE's discount between the tokens of one call (1: the call's return counts fully on each of its tokens)."""
    lam: float = 0.95
    """GAE's lambda (0: one-step TD advantages from the value head; 1: return minus value)."""
    value_coef: float = 0.5
    """Weight of the value head's loss next to the policy loss (they share the decoder)."""
    value_clip: float | None = 0.2
    """PPO's value clip, how far a value may move from the step's start in the loss (null: the plain squared
    error)."""
    whiten_advantages: bool = True
    """Whiten the GAE advantages over the step's response tokens (mean 0, std 1)."""

    def __post_init__(self) -> None:
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"gamma and lam must be in [0, 1], not {self.gamma} and {self.lam}")
        if self.value_coef < 0 or (self.value_clip is not None and self.value_clip <= 0):
            raise ValueError(
                f"need value_coef >= 0 and value_clip > 0 (or null), not {self.value_coef}, {self.value_clip}"
            )


@dataclass(frozen=True)
class UpdateConfig:
    """Hyper-parameters of the policy update (GRPO's, SFT's and continuous learning's; ``GRPOConfig`` is its former,
    deprecated name). Defaults suit the tiny CPU models (lr from models-data.md: 5e-4
    trained a 6 M-parameter Llama, 2e-3 collapsed it); use ~1e-6 for full fine-tuning of billion-parameter models.
    """

    lr: float = 5e-4
    """Learning rate (AdamW)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's beta1, beta2."""
    weight_decay: float = 0.0
    """Decoupled (AdamW) decay, applied to matrices only -- never to norms' gains or biases."""
    max_grad_norm: float | None = 1.0
    """Clip the gradient's global norm to this (null: no clipping)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many optimizer steps, constant afterwards (unless ``decay_steps``)."""
    decay_steps: int = 0
    """With a value above 0, after the warm-up (or ``decay_start``) the rate falls linearly from ``lr`` to 0 at this
    optimizer step (for SFT: its ``steps``, so the last steps settle instead of bouncing at full rate; steps past it
    train at 0, and a stage whose ``steps`` differ says so when built); 0 keeps it constant. A resumed run follows
    the ``lr`` and schedule of the config it resumes with, from the checkpoint's step."""
    decay_start: int = 0
    """With ``decay_steps``: the rate holds at ``lr`` until this optimizer step and only then falls to 0 at
    ``decay_steps`` (warm-up, stable, decay); 0, or any step inside the warm-up, starts the fall at the warm-up's end."""
    clip_low: float = 0.2
    """PPO ratio clip below 1: the ratio is kept above ``1 - clip_low``."""
    clip_high: float = 0.2
    """``clip_high > clip_low`` is DAPO's "clip-higher"."""
    clip_ratio_c: float | None = None
    """Dual-clip PPO's c (> 1; verl's ``clip_ratio_c``): a token with a negative advantage loses at most ``-A * c``
    however far its ratio ran above 1 (`lightrail.model._loss`). None (the default): off, lightrail's loss as before
    dual-clip existed, since a synchronous on-policy step keeps ratios near 1; `lightrail.VERL` sets verl's 3.0."""
    policy_loss: str = "vanilla"
    """The per-token policy-gradient term, a name of `lightrail.model.policy_losses.POLICY_LOSSES`: ``vanilla``
    (PPO-clip), ``gspo`` (one clipped ratio per sequence; mind its much smaller clip ranges) or ``cispo`` (a clipped,
    stop-gradient importance weight). verl's ``actor.policy_loss.loss_mode`` names."""
    kl_coef: float = 0.0
    """beta of the KL penalty to the frozen reference (the base model); 0 switches it off and costs nothing."""
    kl_estimator: str = "low_var_kl"
    """The penalty's estimator, a name of `lightrail.model.kl.KL_ESTIMATORS` (verl's ``kl_loss_type`` names: ``kl``/
    ``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``, and ``<name>+`` straight-through); default k3 with
    verl's clamps."""
    loss_norm: LossNorm = "token"
    """token | sequence | rollout | sequence_sum_norm (`lightrail.model._loss.LossNorm`). verl's names
    (``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum_norm``) given in Python are stored as the
    `LossNorm` they denote; a config names them in ``grpo.loss_agg`` (`GRPO`'s ``loss_agg``)."""
    loss_norm_tokens: int | None = None
    """The constant L of ``sequence_sum_norm`` (Dr. GRPO's MAX_TOKENS). `GRPO` sets it to the sampling
    ``max_tokens`` when it is None; a `PolicyUpdater` stepped with ``sequence_sum_norm`` needs it."""
    temperature: float = 1.0
    """The sampling temperature; logits are divided by it so new logprobs match the engine's (which reports
    logprobs of the temperature-scaled distribution). `GRPO` sets it from ``sampling.temperature`` (another value
    here is refused); ``lightrail learn`` from its ``temperature``."""
    micro_batch_tokens: int = 4096
    """Budget of one micro-batch in padded tokens (rows x longest row); a longer row runs alone."""
    mini_batches: int = 1
    """Optimizer steps per `PolicyUpdater.step` of the policy loss: its rows are split by GRPO group (``group_id``)
    into this many mini-batches, each normalised on its own and taken as one optimizer step (PPO's mini-batches:
    verl's ``train_batch_size / ppo_mini_batch_size``). The first is on-policy; the later ones see rows sampled by
    weights one or more optimizer steps old, which the clipped ratio corrects. More learning per rollout, at the
    same rollout cost. Learning-rate schedules count optimizer steps. SFT steps are not split."""
    is_cap: float | None = None
    """Truncated importance sampling of stale tokens (`lightrail.model._loss`, TIS): the PPO ratio is taken
    against the trainer's own pre-step logprobs and each token weighted by ``min(pi_trainer / pi_sampler, is_cap)``.
    GRPO's ``async`` and a sampler below float32 need it and use 2.0 when it is unset; None (in a sync float32
    run) keeps the ratio against the sampler's logprobs. Needs ``mini_batches: 1``."""
    skip_zero_advantage_rows: bool = True
    """Leave rows whose advantages are all zero out of the update (they carry no gradient but the KL term)."""
    share_prefixes: bool = True
    """Run a token prefix shared by several rows (the samples of one task share their prompt) once per micro-batch
    instead of once per row; the gradients are the same. Off, or unused, for models whose cache is not plain full
    attention on every layer and under gradient checkpointing (which runs without a cache)."""
    compute_entropy: bool = True
    """Entropy of the new policy on response tokens: one extra softmax over the ``[N, V]`` logits, no backward."""
    lora: LoraSettings | None = None
    """None = full fine-tuning."""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Where the update runs: ``cpu``, ``cuda`` or ``auto`` (CUDA when available)."""
    dtype: Literal["float32", "bfloat16", "float16", "float64"] | None = None
    """Weights' dtype; None = float32 on CPU, bfloat16 on CUDA. LoRA adapters stay float32 (peft's default); full
    fine-tuning in bfloat16 keeps no float32 master copy, so prefer LoRA or float32 for small learning rates."""
    autocast: Literal["bfloat16"] | None = None
    """Mixed precision: the forward and backward run under ``torch.autocast`` in bfloat16 while weights, gradients
    and optimizer state stay float32 (``dtype`` must be float32; on CUDA set it, its default is bfloat16). On a CPU
    with bfloat16 matrix units (AMX: Xeon Sapphire Rapids and later) a step of the ~6 M model is ~1.3-1.6x faster
    (`bench/update.py`); without them it is slower. The LM head and the softmax stay in float32 (bfloat16 logits
    cost the distilled calculator student 0.555 -> 0.45 held out; float32 ones gave 0.68, `bench/RESULTS.md`); the
    decoder's activations are bfloat16, so logprobs differ from the engine's by more than float32 noise: measure it
    before using it for GRPO's ratios. None = off."""
    seed: int = 0
    """Seeds the adapter initialisation (without touching the global RNG)."""
    ranks: int = 1
    """Data-parallel ranks of the update (`lightrail.model.distributed.DistributedPolicyUpdater`): the trainer
    process is rank 0 and starts ``ranks - 1`` worker processes; each runs the step on its share of the rows."""
    sharding: Literal["replicate", "fsdp"] = "replicate"
    """How the ranks hold the policy: ``replicate`` (each rank a full copy of the weights, gradients and AdamW's
    state) or ``fsdp`` (each rank holds 1/N of them: ``torch.distributed.fsdp.fully_shard`` on every decoder layer
    and the rest of the model; for models whose training state does not fit one device). Both compute the 1-rank
    update; ``fsdp`` runs shared prompt prefixes with their rows (``share_prefixes`` is off) and gathers the weights
    for serving and checkpoints, which keep the 1-rank format (docs/gpus.md). Needs ``ranks >= 2`` (or torchrun);
    not with ``advantage: gae`` yet."""
    critic: CriticSettings | None = None
    """PPO with a critic (`GRPO` ``advantage="gae"``, `lightrail.model.ppo`) only: GAE's and the value loss's
    settings (`CriticSettings`); null: their defaults. Given with another estimator it is refused."""

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError(f"ranks must be >= 1, not {self.ranks}")
        if self.sharding not in ("replicate", "fsdp"):
            raise ValueError(f"sharding must be replicate or fsdp, not {self.sharding!r}")
        if self.mini_batches < 1:
            raise ValueError(f"mini_batches must be >= 1, not {self.mini_batches}")
        if self.is_cap is not None and not self.is_cap > 0:
            raise ValueError(f"is_cap must be positive (or None: off), not {self.is_cap}")
        if self.is_cap is not None and self.mini_batches != 1:
            raise ValueError("is_cap weighs against the weights before the optimizer step: needs mini_batches 1")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError("need 0 <= clip_low < 1 and clip_high >= 0")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be > 1 (or None: off), not {self.clip_ratio_c}")
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(f"policy_loss: expected one of {list(POLICY_LOSSES)}, got {self.policy_loss!r}")
        if self.clip_ratio_c is not None and not POLICY_LOSSES[self.policy_loss].dual_clip:
            raise ValueError(f"clip_ratio_c is dual-clip's bound: the {self.policy_loss} policy loss has none")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator: expected one of {list(KL_ESTIMATORS)}, got {self.kl_estimator!r}")
        try:
            object.__setattr__(self, "loss_norm", resolve_loss_norm(self.loss_norm))
        except ValueError as exc:
            raise ValueError(str(exc).replace("loss_agg:", "loss_norm:", 1)) from None
        if self.loss_norm_tokens is not None and self.loss_norm_tokens < 1:
            raise ValueError(f"loss_norm_tokens must be >= 1, not {self.loss_norm_tokens}")
        if self.micro_batch_tokens < 1 or self.temperature <= 0:
            raise ValueError("micro_batch_tokens and temperature must be positive")
        if self.autocast not in (None, "bfloat16"):
            raise ValueError(f"autocast must be bfloat16 or None, not {self.autocast!r}")
        if self.autocast and self.dtype not in (None, "float32"):
            raise ValueError(f"autocast keeps float32 master weights: set dtype to float32, not {self.dtype}")
        if self.warmup_steps < 0 or self.decay_steps < 0 or self.decay_start < 0:
            raise ValueError("warmup_steps, decay_steps and decay_start must be >= 0")
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"decay_steps ({self.decay_steps}) must come after warmup_steps ({self.warmup_steps})")
        if self.decay_start and self.decay_steps <= self.decay_start:
            raise ValueError(f"decay_start ({self.decay_start}) needs a later decay_steps, not {self.decay_steps}")

    def schedule_mismatch(self, steps: int) -> str | None:
        """Why a run of ``steps`` optimizer steps would not end where the ``decay_steps`` schedule does (None when it
        does, or without one): steps past ``decay_steps`` train at rate 0; a run stopping short ends above it."""
        if not self.decay_steps or not steps or steps == self.decay_steps:
            return None
        if steps > self.decay_steps:
            idle = steps - self.decay_steps
            return f"steps ({steps}) run past config.decay_steps ({self.decay_steps}): the last {idle} train at rate 0"
        end = lr_factor(steps - 1, self.warmup_steps, self.decay_steps, self.decay_start)
        return (
            f"steps ({steps}) stop short of config.decay_steps ({self.decay_steps}): the rate ends at {end:.0%} of lr"
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpdateConfig:
        """The config `to_json` wrote, in a checkpoint's ``updater.json``: fields removed since (`REMOVED_FIELDS`)
        are dropped, so a checkpoint of an earlier version still loads."""
        data = {key: value for key, value in data.items() if key not in REMOVED_FIELDS}
        data["betas"] = tuple(data["betas"])
        if data.get("critic") is not None:
            data["critic"] = CriticSettings(**data["critic"])
        if data.get("lora") is not None:
            lora = dict(data["lora"])
            lora["target_modules"] = tuple(lora["target_modules"])
            data["lora"] = LoraSettings(**lora)
        return cls(**data)


REMOVED_FIELDS = {
    "max_staleness": "GRPO's grpo.async.max_staleness and lightrail learn's max_staleness drop stale calls",
    **{name: f"PPO's critic settings are grpo.config.critic (critic: {{{name}: ...}})"
       for name in ("gamma", "lam", "value_coef", "value_clip", "whiten_advantages")},
}  # fmt: skip
"""`UpdateConfig` fields older checkpoints hold, and what replaced each."""


def lr_factor(step: int, warmup_steps: int, decay_steps: int, decay_start: int = 0) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a fraction of ``lr``: a linear warm-up to 1 over
    ``warmup_steps``, then constant, or with ``decay_steps`` a linear fall from 1 (at the warm-up's end, or at
    ``decay_start`` if later) to 0 at step ``decay_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    start = max(warmup_steps, decay_start)
    if decay_steps > 0 and step >= start:
        return max(0.0, (decay_steps - step) / (decay_steps - start))
    return 1.0
