"""Policy losses by name: the one registry (`POLICY_LOSSES`) every name list is read from (`UpdateConfig.policy_loss`'s
check, verl's ``actor.policy_loss.loss_mode`` in `lightrail.trainer.verl_compat`, docs/algorithms.md).

A policy loss turns each response token's logprobs into its policy-gradient term; `lightrail.model._loss.policy_loss`
does the rest the same way for every loss (the token selection, truncated importance sampling of stale tokens, the
KL penalty, the normalisation weights, the statistics). Per token t of a sequence i (a row: one LLM call's response,
or a rollout's merged calls), with ``logp_t`` carrying the gradient, ``old_t`` the sampler's logprob (or, under TIS,
the trainer's own pre-step logprob), ``A_t`` the advantage and ``eps_low``/``eps_high`` the clip ranges:

* ``vanilla``: PPO-clip (Schulman et al. 2017, arXiv:1707.06347), verl's ``compute_policy_loss_vanilla``::

      r_t  = exp(clamp(logp_t - old_t, -20, 20))
      pg_t = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
      pg_t = min(pg_t, -A_t * c)     for A_t < 0, with dual-clip's c (Ye et al. 2020, arXiv:1912.09729) when set

* ``gspo``: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), verl's
  ``compute_policy_loss_gspo``: one importance ratio per sequence, the geometric mean of its tokens' ratios, clipped
  as a whole; each token carries the sequence's ratio in value and its own logprob's gradient::

      s_i  = exp(mean_{t in i}(logp_t - old_t))
      s_it = exp(min(log s_i (no gradient) + logp_t - logp_t (no gradient), 10))
      pg_t = max(-A_t * s_it, -A_t * clip(s_it, 1 - eps_low, 1 + eps_high))

  GSPO's clip ranges are ratios of whole sequences: the paper used 3e-4 / 4e-4, not PPO's 0.2.

* ``cispo``: Clipped IS-weight Policy Optimization (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585), verl's
  ``compute_policy_loss_cispo``: the importance weight is clipped and its gradient stopped, so no token's gradient
  is dropped by the clip (PPO's clip zeroes it); the gradient flows through ``logp_t`` alone::

      r_t  = exp(clamp(logp_t - old_t, -20, 20))
      pg_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_t * logp_t

Each loss is proven equal to verl's function of the same name, values and gradients, on fixed tensors
(tests/trainer/test_verl_parity.py). Adding one: a function of this shape, ``@register_policy_loss("name")``, its
formula above and a case in ``bench/verl_parity.py`` when verl has it.

No torch import: the functions only call tensor methods, so reading the names (config checks, the verl table)
keeps ``import lightrail`` light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "POLICY_LOSSES",
    "PolicyLoss",
    "PolicyTerms",
    "TokenBatch",
    "policy_loss_named",
    "register_policy_loss",
]

LOG_RATIO_CLAMP = 20.0
"""verl's bound on ``logp - old_logp`` before ``exp`` (``compute_policy_loss_vanilla``, ``_cispo``): a ratio beyond
e^20 is numerical breakage, not a policy change, and would overflow float32 gradients."""

SEQUENCE_LOG_RATIO_MAX = 10.0
"""verl's upper bound on GSPO's per-token log-ratio (``compute_policy_loss_gspo``)."""


class TokenBatch(NamedTuple):
    """The selected response tokens of a step or micro-batch, flat: every tensor is [N], in the same order."""

    logp: torch.Tensor
    """log pi_theta(a_t | s_t), carrying the gradient."""
    old_logp: torch.Tensor
    """The ratio's baseline: the sampler's logprob, or under TIS the trainer's own pre-step logprob (detached)."""
    advantages: torch.Tensor
    segments: torch.Tensor | None
    """The sequence (row) each token belongs to, integer ids; a loss that needs them (``gspo``) refuses None."""


class PolicyTerms(NamedTuple):
    """What a policy loss returns, each [N]."""

    pg: torch.Tensor
    """The per-token policy-gradient loss, before the normalisation weights."""
    ratio: torch.Tensor
    """The importance ratio the loss used, per token (no gradient needed; for the statistics)."""
    clipped: torch.Tensor
    """Bool: tokens the clip acted on (PPO: whose gradient it removed; CISPO: whose weight it capped)."""


PolicyLossFn = Callable[[TokenBatch, float, float, "float | None"], PolicyTerms]
"""``loss(tokens, clip_low, clip_high, clip_ratio_c) -> PolicyTerms``."""


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss."""

    name: str
    fn: PolicyLossFn
    dual_clip: bool = False
    """Whether it reads dual-clip's ``clip_ratio_c`` (a setting it would ignore is refused instead)."""


POLICY_LOSSES: dict[str, PolicyLoss] = {}
"""Every policy loss by name, filled by `register_policy_loss`."""


def register_policy_loss(name: str, *, dual_clip: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss as ``name``; a name registered twice is an error."""

    def register(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered already")
        POLICY_LOSSES[name] = PolicyLoss(name, fn, dual_clip)
        return fn

    return register


def policy_loss_named(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; choose from {list(POLICY_LOSSES)}") from None


@register_policy_loss("vanilla", dual_clip=True)
def vanilla(tokens: TokenBatch, clip_low: float, clip_high: float, clip_ratio_c: float | None) -> PolicyTerms:
    """PPO-clip with the log-ratio clamp and optional dual-clip (module docstring)."""
    adv = tokens.advantages
    log_ratio = (tokens.logp - tokens.old_logp).clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    pg = -(ratio * adv).minimum(ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    # the clipped branch is the minimum (so it carries no gradient) exactly when the ratio left the trust region in
    # the direction the advantage pushes it
    clipped = ((adv > 0) & (ratio > 1.0 + clip_high)) | ((adv < 0) & (ratio < 1.0 - clip_low))
    if clip_ratio_c is not None:  # dual-clip's bound is the loss: no gradient either
        pg = (-adv * clip_ratio_c).minimum(pg).where(adv < 0, pg)
        clipped |= (adv < 0) & (ratio > clip_ratio_c)
    return PolicyTerms(pg, ratio, clipped)


@register_policy_loss("gspo")
def gspo(tokens: TokenBatch, clip_low: float, clip_high: float, clip_ratio_c: float | None) -> PolicyTerms:
    """GSPO: the sequence-level ratio, clipped per sequence (module docstring)."""
    if tokens.segments is None:
        raise ValueError("the gspo policy loss needs each token's sequence (segments)")
    logp, adv, segments = tokens.logp, tokens.advantages, tokens.segments
    _, inverse, counts = segments.unique(return_inverse=True, return_counts=True)
    delta = (logp - tokens.old_logp).detach()
    per_sequence = delta.new_zeros(counts.numel()).index_add(0, inverse, delta) / counts.to(delta.dtype)
    log_ratio = (logp - logp.detach() + per_sequence[inverse]).clamp(max=SEQUENCE_LOG_RATIO_MAX)
    ratio = log_ratio.exp()
    unclipped, bounded = -adv * ratio, -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return PolicyTerms(unclipped.maximum(bounded), ratio.detach(), bounded > unclipped)


@register_policy_loss("cispo")
def cispo(tokens: TokenBatch, clip_low: float, clip_high: float, clip_ratio_c: float | None) -> PolicyTerms:
    """CISPO: a clipped, stop-gradient importance weight on ``A * logp`` (module docstring)."""
    log_ratio = (tokens.logp - tokens.old_logp).clamp(min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    return PolicyTerms(-weight * tokens.advantages * tokens.logp, ratio.detach(), ratio != weight)
