"""PPO with a critic: `PPOUpdater`, a `PolicyUpdater` with a value head and GAE advantages (`GRPO`'s
``advantage="gae"``).

Data flow of one `PPOUpdater.step`::

    rows (each response token's advantage slot holds its call's return R: `returns_as_rows`)
      ──no-grad forward──► V_t = value_head(h_{t-1})  on every response token (the state before the token)
      ──`gae` per row (r = R on the row's last response token)──► A_t, G_t = A_t + V_t; A whitened over the step
      ──the GRPO step (`PolicyUpdater.step`: clipped policy loss on A, mini-batches)
        + value_coef x clipped value loss (`value_loss`: V from the same forward pass as the logprobs, V_old, G)

The critic is a component of the updater (`ValueCritic`, a `lightrail.model.updater.Critic`): the policy step hands
it the decoder's hidden states at the response tokens from the forward pass that scored them, and adds its loss to
the policy's. Its value head is one linear layer (hidden size -> 1, float32, zero-initialised so V starts at 0 and
the first advantages are the whitened returns) on the decoder's last hidden state; its gradient reaches the decoder
(or the LoRA adapters) that the policy shares. It is a trainable tensor of the updater like the adapter: saved in the
checkpoint's ``trainable.safetensors`` as ``value_head.weight`` / ``value_head.bias``, restored by `load`, left out
of the served weights (`state_dict_for_serving` reads the model only) and of an export.

Why a separate no-grad pass for V_old: with ``mini_batches > 1`` the later mini-batches run on weights that moved,
and PPO's targets and value clip are anchored at the values before the step's first optimizer step (verl computes
them the same way, in a pass of their own); the pass costs a forward without backward (about a third of a step).

A row is one call here (``merge_calls`` off): its return sits on its last response token. Concurrency model: that of
`PolicyUpdater` (one caller, not thread-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec
import torch

from lightrail.model._loss import gae, value_loss, whiten
from lightrail.model.update_config import CriticSettings
from lightrail.model.updater import PolicyUpdater, UpdateConfig, _MicroBatch, lr_factor, per_row
from lightrail.types import TrainingRow, Transition

__all__ = ["VALUE_HEAD", "VALUE_METRICS", "PPOUpdater", "ValueCritic", "returns_as_rows"]

VALUE_HEAD = "value_head"
"""Prefix of the value head's tensors in a checkpoint's ``trainable.safetensors``."""

VALUE_METRICS = ("value_loss", "value_clip_frac", "value_mean", "return_mean", "gae_adv_std")
"""What `PPOUpdater.step` adds to `PolicyUpdater.step`'s metrics (token means over the step's response tokens;
``gae_adv_std`` before whitening)."""


def returns_as_rows(transitions: Sequence[Transition]) -> list[Transition]:
    """``transitions`` with each one's advantage set to its return (`Transition.reward`, the credit assignment's
    per-call return; None counts 0): what `lightrail.adapters.to_rows` turns into the rows `PPOUpdater` takes."""
    return [msgspec.structs.replace(t, advantage=t.reward if t.reward is not None else 0.0) for t in transitions]


class ValueCritic:
    """The critic of `PPOUpdater`: a value head (hidden size -> 1, float32, zero-initialised so V starts at 0 and the
    first advantages are the whitened returns) on the decoder's last hidden state, and its clipped value loss
    (`value_loss`) added to the policy's on every micro-batch (`lightrail.model.updater.Critic`). Its statistics of the
    step in progress are summed in ``sums`` (token-weighted; `PPOUpdater.step` resets and reads them)."""

    def __init__(self, width: int, device: torch.device, settings: CriticSettings) -> None:
        self.head = torch.nn.Linear(width, 1, device=device, dtype=torch.float32)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
        self.settings = settings
        self.sums: dict[str, float] = {}

    def values(self, hidden: torch.Tensor) -> torch.Tensor:
        """V ([N], float32) of the response tokens whose predicting hidden states are ``hidden`` ([N, H])."""
        return self.head(hidden.to(torch.float32)).squeeze(-1)

    def loss(self, hidden: torch.Tensor, mb: _MicroBatch, rows: Sequence[TrainingRow]) -> torch.Tensor:
        """``value_coef`` times the clipped value loss of ``mb``'s response tokens: V from ``hidden``, V_old and the
        returns G from the rows' metadata (`PPOUpdater.gae_rows`)."""
        meta = [rows[i].metadata for i in mb.rows]
        old = torch.tensor([x for m in meta for x in m["values"]], dtype=torch.float32, device=hidden.device)
        ret = torch.tensor([x for m in meta for x in m["returns"]], dtype=torch.float32, device=hidden.device)
        loss, stats = value_loss(self.values(hidden), old, ret, weights=mb.weights, clip=self.settings.value_clip)
        n = float(stats["tokens"])
        for key in ("value_loss", "value_clip_frac", "value_mean"):
            self.sums[key] = self.sums.get(key, 0.0) + float(stats[key]) * n
        self.sums["tokens"] = self.sums.get("tokens", 0.0) + n
        return self.settings.value_coef * loss


class PPOUpdater(PolicyUpdater):
    """A `PolicyUpdater` with a `ValueCritic` trained beside the policy and GAE advantages in place of the rows'.

    ``step(rows)`` takes rows whose response tokens carry their call's return in ``advantages`` (every response
    token of a row the same value; `returns_as_rows`), one call per row. ``config.critic`` (`CriticSettings`, its
    defaults when None) sets GAE and the value loss. One process only (``config.ranks == 1``).

        >>> upd = PPOUpdater("path/to/model", UpdateConfig(lora=LoraSettings(r=8)))   # doctest: +SKIP
        >>> upd.step(rows)["value_loss"]                                           # doctest: +SKIP
    """

    critic: ValueCritic

    def __init__(self, model: Any, config: UpdateConfig | None = None) -> None:
        if config is not None and config.ranks > 1:
            raise ValueError(
                f"advantage 'gae' trains its value head in one process: config.ranks must be 1, not {config.ranks}"
            )
        super().__init__(model, config)
        width = self.model.get_output_embeddings().weight.shape[1]
        self.critic = ValueCritic(width, self.device, self.config.critic or CriticSettings())
        self.value_head = self.critic.head
        self._trainable[f"{VALUE_HEAD}.weight"] = self.value_head.weight
        self._trainable[f"{VALUE_HEAD}.bias"] = self.value_head.bias
        self.optimizer.add_param_group({"params": [self.value_head.weight], "weight_decay": self.config.weight_decay})
        self.optimizer.add_param_group({"params": [self.value_head.bias], "weight_decay": 0.0})
        # The scheduler keeps one rate function per parameter group: rebuilt now that the head's groups exist (no
        # step has been taken, so nothing is lost).
        cfg = self.config
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, cfg.warmup_steps, cfg.decay_steps, cfg.decay_start)
        )

    def values(self, rows: Sequence[TrainingRow]) -> list[list[float]]:
        """The value head's V of every response token of each row (``loss_mask`` order), no gradient."""
        batches = self._prepare(rows, skip_zero_advantage=False)

        def flat_of(mb: _MicroBatch) -> list[float]:
            return self.critic.values(self._response_hidden(self.model, mb)).tolist()

        with torch.no_grad():
            return per_row(rows, batches, flat_of)

    def step(
        self,
        rows: Sequence[TrainingRow],
        *,
        current_version: int | None = None,
        max_staleness: int | None = None,
        objective: Literal["grpo", "sft"] = "grpo",
    ) -> dict[str, float]:
        """GAE advantages from the value head, then `PolicyUpdater.step` with the critic's loss added; metrics as
        there plus `VALUE_METRICS`. ``objective="sft"`` is `PolicyUpdater.step`'s (the value head does not train)."""
        if objective == "sft":
            return super().step(rows, current_version=current_version, max_staleness=max_staleness, objective=objective)
        rows = self.gae_rows(rows)
        self.critic.sums = {"value_loss": 0.0, "value_clip_frac": 0.0, "value_mean": 0.0, "tokens": 0.0}
        metrics = super().step(rows, current_version=current_version, max_staleness=max_staleness, objective=objective)
        sums = dict(self.critic.sums)
        n = max(sums.pop("tokens"), 1.0)
        metrics.update({k: v / n for k, v in sums.items()})
        returns = [g for r in rows for g in r.metadata["returns"]]
        metrics["return_mean"] = sum(returns) / len(returns) if returns else 0.0
        metrics["gae_adv_std"] = float(rows[0].metadata["gae_adv_std"]) if rows else 0.0
        return metrics

    def gae_rows(self, rows: Sequence[TrainingRow]) -> list[TrainingRow]:
        """``rows`` with GAE advantages (whitened over all their response tokens with ``whiten_advantages``) and,
        in ``metadata``, their response tokens' ``values`` (V_old) and ``returns`` (G), in ``loss_mask`` order."""
        cfg = self.critic.settings
        computed = []
        for row, v in zip(rows, self.values(rows), strict=True):
            positions = [t for t, m in enumerate(row.loss_mask) if m]
            rewards = torch.zeros(len(positions), dtype=torch.float64)
            if positions:
                rewards[-1] = row.advantages[positions[-1]]
            adv, ret = gae(rewards, torch.tensor(v, dtype=torch.float64), gamma=cfg.gamma, lam=cfg.lam)
            computed.append((positions, adv, ret, v))
        flat = torch.cat([c[1] for c in computed]) if computed else torch.zeros(0, dtype=torch.float64)
        spread = float(flat.std()) if flat.numel() > 1 else 0.0
        if cfg.whiten_advantages:
            flat = whiten(flat)
        out, k = [], 0
        for row, (positions, _, ret, v) in zip(rows, computed, strict=True):
            advantages = [0.0] * len(row.input_ids)
            for t, a in zip(positions, flat[k : k + len(positions)].tolist(), strict=True):
                advantages[t] = a
            k += len(positions)
            metadata = {**row.metadata, "values": v, "returns": ret.tolist(), "gae_adv_std": spread}
            out.append(msgspec.structs.replace(row, advantages=advantages, metadata=metadata))
        return out
