"""The GRPO policy update: `TrainingRow`s in, one optimizer step out, merged weights back to the engine.

Data flow: an adapter turns a batch of finished rollouts into `TrainingRow`s (token ids, loss mask, the sampler's
logprobs, per-token advantages); `PolicyUpdater.step` runs one optimizer step of the PPO-clipped loss of
`lightrail.model._loss` over all of them; `PolicyUpdater.state_dict_for_serving` hands the new weights to
``Engine.update_weights``; `PolicyUpdater.save` / `PolicyUpdater.load` make training resumable.

How a step is computed (and why):

* Rows are sorted by length and packed into micro-batches of at most ``micro_batch_tokens`` padded tokens, right-
  padded. Right padding with causal attention needs no attention mask: a real token only attends to earlier
  positions, which are all real, and position ids 0..T-1 are already right. Leaving the mask out keeps SDPA on
  its fused causal path.
* Only the hidden states that predict a response token go through the LM head (``[N, H] -> [N, V]`` with N the
  masked tokens), so the full ``[B, T, V]`` logits are never built; logprobs are ``z[a] - logsumexp(z)``, which
  saves the ``[N, V]`` log-softmax output that autograd would otherwise keep.
* The loss normalisation weights are computed once for the whole step (`loss_weights`), so the micro-batch losses
  add up to the step loss exactly and gradient accumulation equals one big batch (tested to 1e-6).
* Rows whose response advantages are all zero contribute exactly zero gradient when ``kl_coef == 0``; they still
  count in the normalisation but are not run through the model (``skip_zero_advantage_rows``; GRPO groups where
  every sample got the same reward are common).
* Rows that start with the same tokens (the samples of one task share their prompt) run that shared prefix once
  (``share_prefixes``, `prefix_groups`): the decoder runs over the prefix alone (batch 1, with gradient), its keys and
  values are expanded to the group's rows, and the rows' remainders run on top of them. The prefix's keys and values
  receive the gradient of every row of the group, which is the sum the rows would give one by one, so the step is
  the same (tested to 1e-5 in float32); a prefix ends before a row's first response token is predicted. With long
  shared prompts and short responses (agents) most of a step's tokens are prompt: ``bench/update.py`` measures it.

Concurrency model: not thread-safe; one caller drives an updater. `state_dict_for_serving` returns tensors that may
alias the live weights: copy them (the engine does) before the next `step`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import torch
from safetensors.torch import load_file, save_file

from lightrail.engine import configure_threads
from lightrail.engine.prefix_cache import common_length
from lightrail.engine.prefix_cache import supported as full_attention_cache
from lightrail.model._loss import loss_weights, mismatch_kl, policy_loss, token_entropy
from lightrail.model.checkpoint import atomic_directory, capture_rng_state, restore_rng_state
from lightrail.model.mismatch import RowMismatch
from lightrail.model.reduction import GradientReduction, whole
from lightrail.model.update_config import (  # noqa: F401 - re-exported: the updater's settings
    LLAMA_LINEAR_PROJECTIONS,
    LoraSettings,
    LossNorm,
    UpdateConfig,
    lr_factor,
    resolve_loss_norm,
)
from lightrail.types import TrainingRow, Transition

__all__ = [
    "UpdateConfig",
    "LoraSettings",
    "PolicyUpdater",
    "drop_stale_rows",
    "pack_micro_batches",
    "prefix_groups",
    "row_loss_weights",
]

CHECKPOINT_FORMAT = 1

#: Shortest token prefix worth running once for a group of rows (`prefix_groups`): below it the extra forward pass
#: costs more than the tokens it saves.
MIN_SHARED_PREFIX = 32

#: Token means of the truncated importance weights (``config.is_cap``): 0 without it.
IS_STATS = ("is_weight_mean", "is_clipped_frac")


def __getattr__(name: str) -> Any:  # GRPOConfig: UpdateConfig's name until it configured SFT and learning too
    if name != "GRPOConfig":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn("GRPOConfig is deprecated: use UpdateConfig", DeprecationWarning, stacklevel=2)
    return UpdateConfig


_Versioned = TypeVar("_Versioned", TrainingRow, Transition)


def drop_stale_rows(
    rows: Sequence[_Versioned], current_version: int, max_staleness: int
) -> tuple[list[_Versioned], int]:
    """Keep rows (or calls: `Transition`) with ``policy_version >= current_version - max_staleness``; returns
    ``(kept, n_dropped)``.

    A row whose ``policy_version`` is None (the backend did not report one) is kept: its age is unknown, not old.
    ``max_staleness = 0`` is strictly on-policy.
    """
    oldest = current_version - max_staleness
    kept = [r for r in rows if r.policy_version is None or r.policy_version >= oldest]
    return kept, len(rows) - len(kept)


def split_groups(rows: Sequence[TrainingRow], n: int) -> list[list[TrainingRow]]:
    """``rows`` in at most ``n`` mini-batches of whole GRPO groups (``group_id``; rows without one are groups of
    their own), in order, each holding as near an equal share of the groups as whole groups allow; empty ones are
    left out."""
    groups: dict[str, list[TrainingRow]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.group_id or f"\0row-{i}", []).append(row)
    ordered = list(groups.values())
    n = min(n, len(ordered))
    bounds = [round(k * len(ordered) / n) for k in range(n + 1)] if n else [0]
    return [[r for g in ordered[a:b] for r in g] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _combine(steps: Sequence[dict[str, float]]) -> dict[str, float]:
    """One metrics dict for several optimizer steps taken in one `PolicyUpdater.step`: token means weighted by the
    response tokens each ran, counts summed, ``ratio_max`` the largest, ``grad_norm`` the mean, ``lr`` the first
    step's, ``step`` the last; ``skipped`` 1 only when every one was skipped; ``mismatch_kl`` the first step's, the
    only one measured before any weight moved (the sampler's logprobs against the trainer's)."""
    if len(steps) == 1:
        return dict(steps[0])
    n = [s["response_tokens"] for s in steps]
    total = sum(n) or 1.0
    combined = {k: sum(s[k] * w for s, w in zip(steps, n, strict=True)) / total
                for k in ("pg_loss", "kl_ref", "clip_frac", "approx_kl", "ratio_mean", "entropy", *IS_STATS)}  # fmt: skip
    combined.update(
        {k: sum(s[k] for s in steps) for k in ("loss", "tokens", "response_tokens", "micro_batches", "rows_run")}
    )
    combined.update(
        ratio_max=max(s["ratio_max"] for s in steps),
        grad_norm=sum(s["grad_norm"] for s in steps) / len(steps),
        lr=steps[0]["lr"],
        step=steps[-1]["step"],
        skipped=float(all(s["skipped"] for s in steps)),
        optimizer_steps=float(sum(not s["skipped"] for s in steps)),
        mismatch_kl=steps[0]["mismatch_kl"],
    )
    return combined


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group row indices into micro-batches whose padded size (rows x longest row) stays within ``token_budget``.

    Rows are taken longest first (stable, so equal lengths keep their order), which keeps padding small; a row
    longer than the budget forms a micro-batch of its own.

        >>> pack_micro_batches([5, 9, 3, 9], 20)
        [[1, 3], [0, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        # Longest first: the first row of a batch is its longest, so the padded size is rows x that length.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def prefix_groups(
    sequences: Sequence[Sequence[int]], limits: Sequence[int], min_tokens: int = MIN_SHARED_PREFIX
) -> list[tuple[int, list[int]]]:
    """Group the indices of ``sequences`` that start with the same tokens, as ``(prefix_length, indices)``.

    A group's prefix is its members' longest common prefix, at most ``limits[i]`` for each member ``i`` (the updater
    passes the position before row ``i``'s first response token, whose hidden state must come from the row's own
    remainder) and at least ``min_tokens``; a sequence sharing no such prefix is a group of its own with prefix 0.
    Sequences are sorted, so those with a common prefix are adjacent; a sequence joins the group before it when the
    tokens the group saves (``(members - 1) x prefix``) do not shrink by it.

        >>> prefix_groups([[1, 2, 3, 9], [5, 5], [1, 2, 3, 8]], [3, 1, 3], min_tokens=2)
        [(3, [2, 0]), (0, [1])]
    """
    groups: list[tuple[int, list[int]]] = []
    cap = 0  # the longest prefix the last group may have (its members' common prefix and limits)
    for i in sorted(range(len(sequences)), key=lambda i: list(sequences[i])):
        if groups:
            length, members = groups[-1]
            n = common_length(sequences[members[0]], sequences[i], min(cap, limits[i]))
            if n >= min_tokens and len(members) * n >= (len(members) - 1) * length:
                groups[-1] = (n, [*members, i])
                cap = n
                continue
        groups.append((0, [i]))
        cap = limits[i]
    return [(length if len(members) > 1 else 0, members) for length, members in groups]


def row_loss_weights(
    rows: Sequence[TrainingRow], loss_norm: LossNorm = "token", loss_norm_tokens: int | None = None
) -> list[torch.Tensor]:
    """The loss weights `loss_weights` gives a step of ``rows`` under ``loss_norm``, one slice per row (its response
    tokens in ``loss_mask`` order). ``sequence_sum_norm`` divides by ``loss_norm_tokens`` (required)."""
    loss_norm = resolve_loss_norm(loss_norm)
    positions = [[t for t, m in enumerate(r.loss_mask) if m] for r in rows]
    if loss_norm == "token":
        weights = loss_weights(None, sum(len(p) for p in positions))
    else:
        if loss_norm == "sequence_sum_norm" and loss_norm_tokens is None:
            raise ValueError("loss_norm='sequence_sum_norm' needs loss_norm_tokens (the constant length L)")
        # A row without a rollout id is its own rollout.
        keys = [r.rollout_id or i for i, r in enumerate(rows)] if loss_norm == "rollout" else range(len(rows))
        segment: dict[Any, int] = {}
        ids = [segment.setdefault(keys[i], len(segment)) for i, p in enumerate(positions) for _ in p]
        sum_norm = loss_norm_tokens if loss_norm == "sequence_sum_norm" else None
        weights = loss_weights(torch.tensor(ids, dtype=torch.long), sum_norm=sum_norm)
    offsets = [0]
    for p in positions:
        offsets.append(offsets[-1] + len(p))
    return [weights[offsets[i] : offsets[i + 1]] for i in range(len(rows))]


def _nll_loss(logp: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the selected tokens with the step's normalisation weights (the SFT objective),
    with the same stats keys as `policy_loss` (ratios are 1 by definition)."""
    loss = -(weights.to(device=logp.device, dtype=logp.dtype) * logp).sum()
    n = logp.numel()
    zero, one = logp.new_zeros(()), logp.new_ones(())
    stats = {
        "pg_loss": -logp.detach().sum() / max(n, 1),
        "kl_ref": zero,
        "clip_frac": zero,
        "approx_kl": zero,
        "ratio_mean": one,
        "ratio_max": one,
        "tokens": torch.tensor(n),
    }
    return loss, stats


def _row_mismatch(rows: Sequence[TrainingRow], order: Sequence[int], kl: torch.Tensor) -> list[RowMismatch]:
    """Per-row means of a micro-batch's per-token `mismatch_kl` (its tokens come row by row, in ``order``)."""
    values = kl.tolist()
    out, k = [], 0
    for i in order:
        n = sum(1 for m in rows[i].loss_mask if m)
        mine = values[k : k + n]
        out.append(RowMismatch(rows[i], kl=sum(mine) / n, kl_max=max(mine), tokens=n))
        k += n
    return out


@dataclass
class _MicroBatch:
    """Right-padded token ids plus the flat list of response tokens to score (one entry per masked token).

    With a ``prefix`` (the token ids all rows start with, shape [1, P]) ``input_ids`` hold each row's remainder after
    it and ``source`` indexes the remainders' hidden states (t - 1 - P instead of t - 1)."""

    input_ids: torch.Tensor  # [B, T] long
    source: torch.Tensor  # [N] long: flat index b * T + (t - 1) of the hidden state that predicts token (b, t)
    targets: torch.Tensor  # [N] long
    old_logp: torch.Tensor  # [N] float64 (as recorded; cast to the compute dtype in the loss)
    advantages: torch.Tensor  # [N] float64
    weights: torch.Tensor  # [N] float64, slice of the step's loss weights
    segments: torch.Tensor  # [N] long: the micro-batch row of each token (a sequence, for GSPO's ratio)
    tokens: int  # real (unpadded) tokens of the micro-batch's rows, a shared prefix counted once per row
    rows: list[int] = field(default_factory=list)
    prefix: torch.Tensor | None = None  # [1, P] long


def _validate(rows: Sequence[TrainingRow]) -> None:
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        if not (len(r.loss_mask) == len(r.old_logprobs) == len(r.advantages) == n):
            raise ValueError(
                f"row {i} (rollout {r.rollout_id!r}): input_ids, loss_mask, old_logprobs and advantages must have "
                f"the same length, got {n}, {len(r.loss_mask)}, {len(r.old_logprobs)}, {len(r.advantages)}"
            )
        if n and r.loss_mask[0]:
            raise ValueError(f"row {i} (rollout {r.rollout_id!r}): token 0 has no context and cannot be trained")


class Critic(Protocol):
    """A head trained with the policy from the same forward pass (`lightrail.model.ppo.ValueCritic`): on each
    micro-batch of a policy-gradient step its loss, from the decoder's hidden states at the response tokens, is added
    to the policy's before the backward pass, so its gradient reaches the shared decoder (or LoRA adapters)."""

    def loss(self, hidden: torch.Tensor, mb: _MicroBatch, rows: Sequence[TrainingRow]) -> torch.Tensor:
        """The micro-batch's critic loss (a scalar, already weighted against the policy's), from ``hidden`` ([N, H],
        one row per response token of ``mb``) and the step's ``rows`` (``mb.rows`` index them)."""
        ...


class PolicyUpdater:
    """Owns the trainable policy (full model or LoRA adapter), its AdamW optimizer and the GRPO step.

        >>> upd = PolicyUpdater("path/to/model", UpdateConfig(lora=LoraSettings(r=8)))   # doctest: +SKIP
        >>> metrics = upd.step(rows)                     # one optimizer step over every row   # doctest: +SKIP
        >>> await engine.update_weights(upd.state_dict_for_serving(), version=upd.steps + 1)   # doctest: +SKIP
        >>> upd.save("runs/ckpt")                         # ... later: upd.load("runs/ckpt")   # doctest: +SKIP

    ``model`` is a local Hugging Face directory or a causal LM instance; an instance is taken over (moved to the
    configured device and dtype and, with LoRA, wrapped by peft in place). ``reduction`` is how a step's gradients
    combine across the processes computing it (`lightrail.model.reduction`): one process by default.
    """

    data_parallel = False
    """True for updaters whose step spans several ranks (`DistributedPolicyUpdater`)."""
    critic: Critic | None = None
    """A head trained beside the policy from the same forward pass (`lightrail.model.ppo.ValueCritic`); None: the
    policy alone."""

    def __init__(
        self, model: Any, config: UpdateConfig | None = None, *, reduction: GradientReduction | None = None
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config = config or UpdateConfig()
        self.reduction = reduction or GradientReduction()
        if (config.ranks > 1 or config.sharding != "replicate") and not self.data_parallel:
            raise ValueError(
                f"UpdateConfig(ranks={config.ranks}, sharding={config.sharding!r}) needs "
                "lightrail.model.distributed.DistributedPolicyUpdater"
            )
        configure_threads()
        self.device = self.reduction.device or self._resolve_device(config.device)
        self.dtype = self._resolve_dtype(config.dtype, self.device)
        if config.autocast and self.dtype != torch.float32:
            raise ValueError(f"autocast keeps float32 master weights: set dtype to float32 on {self.device.type}")
        if isinstance(model, str | os.PathLike):  # a name (tiny, smollm2...) or a folder, as a config's `model:`
            from lightrail.engine.models import check_model_dir, resolve_model

            model = AutoModelForCausalLM.from_pretrained(check_model_dir(resolve_model(model)), dtype=self.dtype)
        model = model.to(device=self.device, dtype=self.dtype)
        self.reference: Any = None
        if config.lora is not None:
            model = self._wrap_lora(model, config.lora, config.seed)
        else:
            model.requires_grad_(True)
            if config.kl_coef:
                # Full fine-tuning has no adapter to switch off, so the KL reference is a frozen copy of the start.
                self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = model = self.reduction.prepare(model)
        self.steps = 0
        self.last_mismatch: list[RowMismatch] = []
        """The train–inference mismatch of each row the last GRPO `step` ran through the model (in its forward pass,
        before the optimizer step; with data parallelism, rank 0's share of the rows)."""
        self._trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        decay = [p for p in self._trainable.values() if p.ndim >= 2]
        no_decay = [p for p in self._trainable.values() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": config.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=config.lr,
            betas=config.betas,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, config.warmup_steps, config.decay_steps, config.decay_start)
        )
        self._softcap = getattr(model.config, "final_logit_softcapping", None)
        self._full_attention: bool | None = None  # `_shares_prefixes`, checked on first use

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """The processes this started that must keep running while it trains, as ``(name, exitcode)`` pairs for the
        trainer to watch (`TrainerContext.watch_child`): none, it trains in this process."""
        return []

    def close(self) -> None:
        """Release the update's processes: none here (see `DistributedPolicyUpdater.close`); safe to call twice."""

    # -- set-up ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_device(name: str) -> torch.device:
        if name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if name == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was requested but torch sees no CUDA device")
        return torch.device(name)

    @staticmethod
    def _resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
        if name is None:
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return getattr(torch, name)

    @staticmethod
    def _wrap_lora(model: Any, lora: LoraSettings, seed: int) -> Any:
        from peft import LoraConfig, get_peft_model

        peft_config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
        # The adapter's A matrices are random: seed them locally so the same config gives the same adapter
        # without resetting the caller's global RNG.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft reads transformers' deprecated `is_gradient_checkpointing` (a FutureWarning in every LoRA run's
            # output, about code that is neither ours nor the user's)
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            torch.manual_seed(seed)
            return get_peft_model(model, peft_config)

    @property
    def is_lora(self) -> bool:
        return self.config.lora is not None

    # -- scoring --------------------------------------------------------------------------------------------------

    def _row_weights(self, rows: Sequence[TrainingRow]) -> list[torch.Tensor]:
        """The step's loss normalisation weights (computed over all ``rows``), one slice per row in ``loss_mask``
        order. A data-parallel step computes them over the whole step and hands each rank its rows' slices."""
        return row_loss_weights(rows, self.config.loss_norm, self.config.loss_norm_tokens)

    def _active_rows(self, rows: Sequence[TrainingRow], *, skip_zero_advantage: bool) -> list[int]:
        """Indices of the rows that need a forward pass: rows with response tokens, less (``skip_zero_advantage``,
        no KL term) rows whose response advantages are all zero, as they contribute exactly zero gradient."""
        skip = skip_zero_advantage and not self.config.kl_coef
        return [
            i
            for i, r in enumerate(rows)
            if any(r.loss_mask) and not (skip and all(r.advantages[t] == 0 for t, m in enumerate(r.loss_mask) if m))
        ]

    def _prepare(
        self,
        rows: Sequence[TrainingRow],
        *,
        skip_zero_advantage: bool,
        weights: Sequence[torch.Tensor] | None = None,
    ) -> list[_MicroBatch]:
        """Micro-batches of the rows that need a forward pass, carrying their slices of the step's loss weights
        (computed over all rows, skipped ones included; ``weights`` gives them when ``rows`` are a shard of a larger
        step)."""
        positions = [[t for t, m in enumerate(r.loss_mask) if m] for r in rows]
        row_weights = self._row_weights(rows) if weights is None else weights
        active = self._active_rows(rows, skip_zero_advantage=skip_zero_advantage)
        batches = []
        for prefix, idx in self._pack(rows, active, positions):
            width = max(len(rows[i].input_ids) for i in idx) - prefix
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            source, targets, old, adv, w, segments = [], [], [], [], [], []
            for b, i in enumerate(idx):
                r = rows[i]
                ids[b, : len(r.input_ids) - prefix] = torch.tensor(r.input_ids[prefix:], dtype=torch.long)
                source += [b * width + t - 1 - prefix for t in positions[i]]
                segments += [b] * len(positions[i])
                targets += [r.input_ids[t] for t in positions[i]]
                old += [r.old_logprobs[t] for t in positions[i]]
                adv += [r.advantages[t] for t in positions[i]]
                w.append(row_weights[i])
            shared = torch.tensor([rows[idx[0]].input_ids[:prefix]], dtype=torch.long, device=self.device)
            batches.append(
                _MicroBatch(
                    input_ids=ids.to(self.device),
                    source=torch.tensor(source, dtype=torch.long, device=self.device),
                    targets=torch.tensor(targets, dtype=torch.long, device=self.device),
                    old_logp=torch.tensor(old, dtype=torch.float64, device=self.device),
                    advantages=torch.tensor(adv, dtype=torch.float64, device=self.device),
                    weights=torch.cat(w).to(self.device),
                    segments=torch.tensor(segments, dtype=torch.long, device=self.device),
                    tokens=sum(len(rows[i].input_ids) for i in idx),
                    rows=idx,
                    prefix=shared if prefix else None,
                )
            )
        return batches

    def _shares_prefixes(self) -> bool:
        """Whether this step may run shared prefixes once: switched on, a plain full-attention cache (what the
        remainders attend to), and no gradient checkpointing (its layers drop the cache when training)."""
        if not self.config.share_prefixes or not self.reduction.shares_prefixes:
            return False
        if any(getattr(m, "gradient_checkpointing", False) is True for m in self.model.modules()):
            return False
        if self._full_attention is None:
            self._full_attention = full_attention_cache(self.model)
        return self._full_attention

    def _pack(
        self, rows: Sequence[TrainingRow], active: list[int], positions: list[list[int]]
    ) -> list[tuple[int, list[int]]]:
        """The micro-batches of the ``active`` rows as ``(shared prefix length, row indices)``: a group of rows with a
        shared prefix (`prefix_groups`) fills micro-batches of its own whose budget counts the prefix once; the other
        rows are packed as `pack_micro_batches` does (prefix 0)."""
        budget = self.config.micro_batch_tokens
        alone = active
        packed: list[tuple[int, list[int]]] = []
        if self._shares_prefixes():
            # The hidden state predicting a row's first response token (at its position - 1) must be the row's own.
            groups = prefix_groups([rows[i].input_ids for i in active], [positions[i][0] - 1 for i in active])
            alone = []
            for prefix, members in groups:
                idx = sorted((active[g] for g in members), key=lambda i: -len(rows[i].input_ids))
                chunks: list[list[int]] = []
                for i in idx:  # longest first: a chunk's first row sets its width
                    width = len(rows[chunks[-1][0]].input_ids) - prefix if chunks else 0
                    if chunks and prefix + (len(chunks[-1]) + 1) * width <= budget:
                        chunks[-1].append(i)
                    else:
                        chunks.append([i])
                for chunk in chunks:
                    if prefix and len(chunk) > 1:
                        packed.append((prefix, chunk))
                    else:
                        alone += chunk
            alone.sort()
        lengths = [len(rows[i].input_ids) for i in alone]
        packed += [(0, [alone[g] for g in group]) for group in pack_micro_batches(lengths, budget)]
        return packed

    def _token_logp(
        self, model: Any, mb: _MicroBatch, *, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Logprobs (float32, [N]) of the micro-batch's response tokens under ``model``, optionally their entropy
        ([N]), and the decoder's hidden states they were scored from ([N, H]: what a `Critic` reads)."""
        logits, hidden = self.reduction.forward(model, mb, self._response_logits)
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        if self.config.temperature != 1.0:
            logits = logits / self.config.temperature
        lse = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, mb.targets[:, None]).squeeze(-1) - lse
        ent = token_entropy(logits.detach(), lse.detach()) if entropy else None
        return logp, ent, hidden

    def _response_logits(self, model: Any, mb: _MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The LM head's logits (at least float32, [N, V]) at the hidden states that predict the micro-batch's
        response tokens, and those hidden states ([N, H]): every use of the weights in a forward pass (called through
        `GradientReduction.forward`: a sharded policy runs it inside its root module)."""
        hidden = self._response_hidden(model, mb)
        head = model.get_output_embeddings()
        # The LM head runs outside `autocast`, in the weights' dtype (float32 under mixed precision): bfloat16 logits
        # carry ~2-3 significant digits, too few for a sharp softmax's loss and for GRPO's ratios. Only the response
        # tokens' rows reach it; with a small vocabulary its float32 matmul is cheap next to the decoder, with a large
        # one (SmolLM2: 49k x 576, ~1/4 of the decoder's FLOPs per token) it takes a visible share of the step.
        logits = head(hidden.to(head.weight.dtype))
        # Softmax statistics in at least fp32 (bf16 logsumexp over a 50k vocabulary loses the ratio's precision).
        return logits.to(torch.promote_types(logits.dtype, torch.float32)), hidden

    def _response_hidden(self, model: Any, mb: _MicroBatch) -> torch.Tensor:
        """The decoder's last hidden states ([N, H], under `autocast` when configured) that predict the micro-batch's
        response tokens: what the LM head and a `Critic` read."""
        with self._autocast():
            hidden = self._hidden_states(model, mb)
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, mb.source)

    @staticmethod
    def _hidden_states(model: Any, mb: _MicroBatch) -> torch.Tensor:
        """The decoder's last hidden states of the micro-batch's rows (of their remainders after a shared prefix)."""
        decoder = model.get_decoder()
        if mb.prefix is None:
            return decoder(input_ids=mb.input_ids, use_cache=False).last_hidden_state
        from transformers import DynamicCache

        # The prefix runs once, with gradient; each row's remainder attends to its keys and values expanded (not
        # copied) to the batch, so backward sums every row's gradient into the one prefix pass. A fresh cache per
        # micro-batch: the remainders' pass appends to it in place. Right padding needs no mask (as without a prefix);
        # positions continue from the cache's length.
        shared = decoder(input_ids=mb.prefix, use_cache=True).past_key_values
        n = mb.input_ids.shape[0]
        cache = DynamicCache(config=model.config)
        for index, layer in enumerate(shared.layers):
            cache.update(layer.keys.expand(n, -1, -1, -1), layer.values.expand(n, -1, -1, -1), index)
        return decoder(input_ids=mb.input_ids, past_key_values=cache, use_cache=True).last_hidden_state

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.config.autocast))

    def _reference_logp(self, mb: _MicroBatch) -> torch.Tensor:
        with torch.no_grad():
            if self.is_lora:
                # The base model *is* the adapter-free model: no second copy of the weights.
                with self.model.disable_adapter():
                    return self._token_logp(self.model, mb)[0]
            return self._token_logp(self.reference, mb)[0]

    def token_logprobs(self, rows: Sequence[TrainingRow]) -> list[list[float]]:
        """The current policy's logprob of every response token of each row (``loss_mask`` order), no gradient.

        Useful to check that the engine's logprobs match the trainer's (they should, up to numerics, right after a
        weight sync) and for on-policy tests.
        """
        _validate(rows)
        batches = self._prepare(rows, skip_zero_advantage=False)
        with torch.no_grad():
            return per_row(rows, batches, lambda mb: self._token_logp(self.model, mb)[0].tolist())

    # -- the update -----------------------------------------------------------------------------------------------

    def step(
        self,
        rows: Sequence[TrainingRow],
        *,
        current_version: int | None = None,
        max_staleness: int | None = None,
        objective: Literal["grpo", "sft"] = "grpo",
    ) -> dict[str, float]:
        """One optimizer step over all ``rows`` (gradient accumulation over micro-batches); returns metrics.

        ``objective="sft"`` trains the same rows by maximum likelihood instead (``loss = -sum_t w_t * logp_t``,
        same packing and normalisation; advantages and old logprobs are ignored): supervised warm starts and
        fine-tuning on the best traces share the optimizer, checkpoints and serving path with RL.

        With ``current_version`` and ``max_staleness`` both given, rows sampled by a policy more than ``max_staleness``
        versions older are dropped first (`drop_stale_rows`; `GRPO` drops stale calls itself, before building rows).
        Metrics: ``loss``, ``pg_loss``, ``kl_ref``, ``clip_frac``, ``approx_kl``, ``entropy``, ``ratio_mean``,
        ``is_weight_mean``, ``is_clipped_frac`` (with ``config.is_cap``; else 0),
        ``ratio_max`` (token means over the response tokens that were run), ``grad_norm`` (before clipping), ``lr``,
        ``tokens`` (input tokens run through the model, padding excluded), ``response_tokens``, ``tokens_per_s``,
        ``rows``, ``rows_stale_dropped``, ``rows_zero_adv_skipped``, ``micro_batches``, ``seconds``, ``step``
        (optimizer steps taken so far), ``skipped`` (1 when no update was made: no row left anything to learn from, or
        the gradient was not finite), ``mismatch_kl`` (token mean of `mismatch_kl` between the sampler's recorded
        logprobs and this forward pass's, before the optimizer step: the train–inference mismatch of on-policy rows;
        per row in `last_mismatch`; 0 for ``sft``; with ``mini_batches``, the first mini-batch's rows).
        """
        t0 = time.perf_counter()
        n_stale = 0
        if current_version is not None and max_staleness is not None:
            rows, n_stale = drop_stale_rows(rows, current_version, max_staleness)
        _validate(rows)
        if objective == "grpo" and self.config.mini_batches > 1:
            steps, first_rows = [], None
            for mb in split_groups(rows, self.config.mini_batches):
                steps.append(self._step_on(mb, objective=objective))
                first_rows = self.last_mismatch if first_rows is None else first_rows
            # only the first mini-batch ran on the weights that sampled it: the later ones' gap is the update's own
            self.last_mismatch = first_rows or []
            metrics = _combine(steps)
        else:
            metrics = self._step_on(rows, objective=objective)
        seconds = time.perf_counter() - t0
        metrics.update(
            tokens_per_s=metrics["tokens"] / seconds if seconds > 0 else 0.0,
            rows=float(len(rows)),
            rows_stale_dropped=float(n_stale),
            rows_zero_adv_skipped=float(len(rows) - metrics.pop("rows_run")),
            seconds=seconds,
        )
        return metrics

    def _step_on(
        self,
        rows: Sequence[TrainingRow],
        *,
        objective: Literal["grpo", "sft"],
        weights: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Accumulate the gradient of ``rows`` and take the optimizer step; the metrics of `step` without the
        per-step timing and row counts (``rows_run``: rows run through the model).

        Under data parallelism ``rows`` are this rank's shard and ``weights`` their slices of the step's loss
        weights; ``self.reduction`` sums gradients and statistics over the ranks before the gradient is clipped.
        """
        cfg = self.config
        supervised = objective == "sft"
        skip_zero = cfg.skip_zero_advantage_rows and not supervised
        batches = self._prepare(rows, skip_zero_advantage=skip_zero, weights=weights)
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step trains with

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl_ref": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "ratio_mean": 0.0}
        sums["mismatch_kl"] = 0.0
        sums.update(dict.fromkeys(IS_STATS, 0.0))
        ent_sum, n_tok, ratio_max, tokens = 0.0, 0, 0.0, 0
        measured: list[RowMismatch] = []
        padding = self.reduction.padding_passes(len(batches))  # before any pass: it may be a collective
        for mb in batches:
            ref = self._reference_logp(mb) if cfg.kl_coef and not supervised else None
            logp, ent, hidden = self._token_logp(self.model, mb, entropy=cfg.compute_entropy)
            if supervised:
                loss, stats = _nll_loss(logp, mb.weights)
            else:
                loss, stats = policy_loss(
                    logp,
                    mb.old_logp,
                    mb.advantages,
                    weights=mb.weights,
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    ref_logp=ref,
                    kl_coef=cfg.kl_coef,
                    is_cap=cfg.is_cap,
                    clip_ratio_c=cfg.clip_ratio_c,
                    kl_estimator=cfg.kl_estimator,
                    loss=cfg.policy_loss,
                    segment_ids=mb.segments,
                )
                if self.critic is not None:
                    loss = loss + self.critic.loss(hidden, mb, rows)
                # The weights have not moved yet this step, so for on-policy rows this is the train–inference gap.
                kl = mismatch_kl(logp, mb.old_logp)
                sums["mismatch_kl"] += float(kl.sum())
                measured += _row_mismatch(rows, mb.rows, kl)
            loss.backward()
            n = int(stats["tokens"])
            sums["loss"] += float(loss.detach())
            for k in ("pg_loss", "kl_ref", "clip_frac", "approx_kl", "ratio_mean", *IS_STATS):
                sums[k] += float(stats.get(k, 0.0)) * n
            ratio_max = max(ratio_max, float(stats["ratio_max"]))
            if ent is not None:
                ent_sum += float(ent.sum())
            n_tok += n
            tokens += mb.tokens
        for _ in range(padding):
            self._padding_pass(with_reference=bool(cfg.kl_coef) and not supervised)

        self.last_mismatch = measured
        params = list(self._trainable.values())
        local = [*sums.values(), ent_sum, n_tok, tokens, len(batches), sum(len(mb.rows) for mb in batches)]
        totals, ratio_max = self.reduction.reduce(params, torch.tensor(local, dtype=torch.float64), ratio_max)
        (*summed, ent_sum, n_tok, tokens, n_batches, rows_run) = totals.tolist()
        sums = dict(zip(sums, summed, strict=True))
        if n_batches:
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a sharded norm
        else:
            grad_norm = 0.0
        skipped = not n_batches or not math.isfinite(grad_norm)
        if skipped:
            # Nothing to learn from, or one bad batch (overflow, a corrupt row): it must not poison the weights or
            # Adam's moments, and it is not counted as a step.
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
            self.steps += 1
        denom = max(n_tok, 1)
        metrics = {k: v / denom for k, v in sums.items() if k != "loss"}
        metrics.update(
            loss=sums["loss"],
            entropy=ent_sum / denom if cfg.compute_entropy else math.nan,
            ratio_max=ratio_max,
            grad_norm=grad_norm,
            lr=lr,
            tokens=float(tokens),
            response_tokens=float(n_tok),
            micro_batches=float(n_batches),
            step=float(self.steps),
            skipped=float(skipped),
            rows_run=float(rows_run),
        )
        return metrics

    def _padding_pass(self, *, with_reference: bool) -> None:
        """One forward and backward pass of a one-token row whose loss is multiplied by 0: the collectives of a
        micro-batch with nothing to learn (the reference's forward too when real micro-batches run it)."""
        dummy = _MicroBatch(
            input_ids=torch.zeros(1, 2, dtype=torch.long, device=self.device),
            source=torch.zeros(1, dtype=torch.long, device=self.device),
            targets=torch.zeros(1, dtype=torch.long, device=self.device),
            old_logp=torch.zeros(1, dtype=torch.float64, device=self.device),
            advantages=torch.zeros(1, dtype=torch.float64, device=self.device),
            weights=torch.zeros(1, dtype=torch.float64, device=self.device),
            segments=torch.zeros(1, dtype=torch.long, device=self.device),
            tokens=0,
        )
        if with_reference:
            self._reference_logp(dummy)
        logp, _, _ = self._token_logp(self.model, dummy)
        (logp.sum() * 0.0).backward()

    # -- serving --------------------------------------------------------------------------------------------------

    def state_dict_for_serving(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy's weights under the base model's own names, ready for ``Engine.update_weights``.

        With LoRA: ``W + (alpha / r) * B @ A`` for every adapted layer, computed as new tensors (the training model
        keeps its separate base and adapter weights); other tensors alias the live weights. ``dtype`` casts floats.
        """
        with torch.no_grad():
            if not self.is_lora:
                state = {k: v.detach() for k, v in self.model.state_dict().items()}
            else:
                state = self._merged_lora_state()
            if dtype is not None:
                state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return state

    def _merged_lora_state(self) -> dict[str, torch.Tensor]:
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        state: dict[str, torch.Tensor] = {}
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            state[key.replace(".base_layer.", ".")] = value.detach()
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            weight = module.get_base_layer().weight
            merged = weight.detach().clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    merged += module.get_delta_weight(adapter).to(merged.dtype)
            state[f"{name}.weight"] = merged
        return state

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike) -> Path:
        """Write a resumable checkpoint to ``directory`` atomically; returns its path.

        Contents: ``updater.json`` (config, step, the base model: see `base_model_metadata`),
        ``trainable.safetensors`` (the adapter, or the full model),
        ``reference.safetensors`` (full fine-tuning with a KL term: the frozen start point), ``trainer_state.pt``
        (optimizer, scheduler, RNG states). A LoRA checkpoint needs the same base model to load.
        """
        with atomic_directory(directory) as tmp:
            meta = {
                "format": CHECKPOINT_FORMAT,
                "steps": self.steps,
                "config": self.config.to_json(),
                "base_model": self.base_model_metadata(),
            }
            (tmp / "updater.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            save_file(self._full_trainable(), tmp / "trainable.safetensors")
            if self.reference is not None:
                ref = {n: p.detach().contiguous().cpu() for n, p in self.reference.named_parameters()}
                save_file(ref, tmp / "reference.safetensors")
            torch.save(
                {
                    "optimizer": self._full_optimizer_state(),
                    "scheduler": self.scheduler.state_dict(),
                    "rng": capture_rng_state(),
                },
                tmp / "trainer_state.pt",
            )
        return Path(directory)

    def trainable_weights(self) -> dict[str, torch.Tensor]:
        """The trainable weights (the adapter, or the full model) by name, whole, on the CPU: what a checkpoint's
        ``trainable.safetensors`` holds."""
        return self._full_trainable()

    def _full_trainable(self) -> dict[str, torch.Tensor]:
        """The trainable weights, whole, on the CPU (sharded ones are gathered: every rank calls this)."""
        return {n: whole(p.detach()).contiguous().cpu() for n, p in self._trainable.items()}

    def _full_optimizer_state(self) -> dict[str, Any]:
        """``optimizer.state_dict()`` with whole tensors on the CPU (sharded ones are gathered, in parameter order:
        every rank calls this)."""
        state = self.optimizer.state_dict()
        tensors = {
            i: {k: whole(v).cpu() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for i, s in sorted(state["state"].items())
        }
        return {**state, "state": tensors}

    def base_model_metadata(self) -> dict[str, Any]:
        """What `lightrail.model.export` needs to rebuild the policy from a checkpoint: the base model's
        directory (absolute; None when the model was not loaded from a local directory), its config and the dtype
        the weights were trained in. `load` ignores it, so older checkpoints without it still resume."""
        base = self.model.get_base_model() if self.is_lora else self.model
        name = str(getattr(base.config, "_name_or_path", "") or "")
        path = Path(name).resolve() if name and Path(name).is_dir() else None
        return {
            "path": str(path) if path is not None else None,
            "name_or_path": name or None,
            "dtype": str(self.dtype).removeprefix("torch."),
            "config": json.loads(base.config.to_json_string()),
        }

    def load(self, directory: str | os.PathLike) -> None:
        """Restore a checkpoint written by `save` into this updater (built with the same model and config shape).

        After loading, the next `step` on the same rows gives the same loss and weights as it would have without the
        interruption (tested bitwise on CPU).
        """
        path = Path(directory)
        meta = json.loads((path / "updater.json").read_text())
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
        saved = UpdateConfig.from_json(meta["config"])
        if saved.lora != self.config.lora:
            raise ValueError(
                f"{path}: checkpoint was trained with lora={saved.lora}, this updater has {self.config.lora}"
            )
        self._copy_into(self._trainable, load_file(path / "trainable.safetensors"), path)
        if self.reference is not None:
            self._copy_into(dict(self.reference.named_parameters()), load_file(path / "reference.safetensors"), path)
        # CPU first: torch.set_rng_state wants a CPU tensor; the optimizer moves its state to the params' device.
        state = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
        self.optimizer.load_state_dict(self._own_optimizer_state(state["optimizer"]))
        self.scheduler.load_state_dict(state["scheduler"])
        # Only the step count is the checkpoint's: the rate follows this updater's config, so a run resumed with
        # another lr or schedule trains with it (the scheduler's state would keep the saved run's lr)
        groups = self.optimizer.param_groups
        self.scheduler.base_lrs = [self.config.lr] * len(groups)
        rate = self.config.lr * lr_factor(
            self.scheduler.last_epoch, self.config.warmup_steps, self.config.decay_steps, self.config.decay_start
        )
        for group in groups:
            group["initial_lr"], group["lr"] = self.config.lr, rate
        restore_rng_state(state["rng"])
        self.steps = int(meta["steps"])

    def _own_optimizer_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's whole optimizer state as this process holds it (of a sharded parameter, its shard)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        own = {  # (an index past this optimizer's parameters is left for load_state_dict to refuse)
            i: {
                k: self._own_part(v, params[i]) if k != "step" and v.shape == params[i].shape else v
                for k, v in s.items()
            }
            if i < len(params)
            else s
            for i, s in state["state"].items()
        }
        return {**state, "state": own}

    def _copy_into(self, params: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], path: Path) -> None:
        if set(tensors) != set(params):
            diff = sorted(set(tensors) ^ set(params))[:5]
            raise ValueError(f"{path}: checkpoint tensors do not match this model's (e.g. {diff})")
        with torch.no_grad():
            for name, value in tensors.items():
                params[name].copy_(self._own_part(value, params[name]))

    @staticmethod
    def _own_part(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The part of the whole tensor ``whole`` this process holds of a tensor laid out like ``like``: all of it
        here; a sharded tensor's (a DTensor) slice, cut locally without communication."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(like, DTensor):
            return distribute_tensor(whole.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)
        return whole


def per_row(
    rows: Sequence[TrainingRow], batches: Sequence[_MicroBatch], flat_of: Callable[[_MicroBatch], list[float]]
) -> list[list[float]]:
    """Each row's per-token figures in ``loss_mask`` order, from ``flat_of(mb)``: one flat list per micro-batch
    holding its rows' response tokens one row after the other (as `_MicroBatch.source` selects them)."""
    out: list[list[float]] = [[] for _ in rows]
    for mb in batches:
        flat, k = flat_of(mb), 0
        for i in mb.rows:
            n = sum(1 for m in rows[i].loss_mask if m)
            out[i] = flat[k : k + n]
            k += n
    return out
