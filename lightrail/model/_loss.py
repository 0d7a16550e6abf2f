"""The GRPO / PPO-clip policy loss as pure torch functions (no model, no optimizer, no I/O).

Notation, per response token t (a token the policy generated, ``loss_mask == 1``):

* ``logp_t = log pi_theta(a_t | s_t)``        -- the policy being trained (carries the gradient)
* ``old_t  = log pi_old(a_t | s_t)``          -- the sampler's logprob, recorded by the gateway (never recomputed:
  the tokens were sampled from whatever the engine served, so its logprobs *are* the behaviour policy)
* ``ref_t  = log pi_ref(a_t | s_t)``          -- a frozen reference (the base model), only when ``kl_coef > 0``
* ``A_t``                                     -- the advantage (GRPO: group-normalised reward, from the adapter)

Per-token loss::

    r_t    = exp(clamp(logp_t - old_t, -20, 20))
    pg_t   = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
    pg_t   = min(pg_t, -A_t * c)           for A_t < 0, with dual-clip's c (``clip_ratio_c``; None: no such bound)
    kl_t   = k(logp_t, ref_t)              a KL estimator of `lightrail.model.kl` (default ``low_var_kl``: k3,
                                           exp(x) - x - 1 with x = ref_t - logp_t, clamped as verl does)
    l_t    = pg_t + beta * kl_t

``pg_t`` is the ``vanilla`` policy loss of `lightrail.model.policy_losses`, the registry of policy losses by name;
``GSPO`` (sequence-level ratios) and ``CISPO`` (clipped, stop-gradient weights) replace it there, the rest of this
module stays the same for each (``UpdateConfig.policy_loss``). The clamp of the log-ratio to [-20, 20] before
``exp`` is verl's (``compute_policy_loss_vanilla``): a ratio beyond
e^20 is numerical breakage, not a policy change, and would overflow float32 gradients. Dual-clip PPO (Ye et al.
2020, "Mastering Complex Control in MOBA Games with Deep RL", arXiv:1912.09729; verl's ``clip_ratio_c``, default
3.0 there) bounds the loss of a token with a negative advantage whose ratio ran far above 1: without it,
``-A_t * r_t`` grows without bound (A = -1, r = 4: loss 4, gradient 4); with c = 3 it is 3 with gradient 0. The
whole per-token loss is verl's: tests/trainer/test_verl_parity.py compares it with verl's functions.

Batch loss ``L = sum_t w_t * l_t`` with normalisation weights ``w_t`` (`loss_weights`, `LossNorm`; N tokens in
the step, S segments = rows or rollouts, ``n_s`` tokens in segment s)::

    token               w_t = 1 / N                    verl "token-mean"
    sequence / rollout  w_t = 1 / (S * n_seg(t))       verl "seq-mean-token-mean" (a sequence = a row here)
    sequence_sum_norm   w_t = 1 / (S * L)              verl "seq-mean-token-sum-norm", Dr. GRPO

The first two sum to 1. The last is Dr. GRPO's aggregation (Liu et al. 2025, "Understanding R1-Zero-Like
Training", arXiv:2503.20783: the per-response ``1/|o_i|`` is replaced by a constant L, MAX_TOKENS, the generation
budget): each row's token *sum* divided by the same constant, then the mean over rows, so a token weighs the same
in a long response as in a short one. verl computes ``sum(seq_losses) / L`` per micro-batch and scales it by
``micro / mini-batch`` rows, which is this. Because ``w_t`` is computed once for the whole optimizer step, the loss
of a step is a plain *sum* over its micro-batches, so gradient accumulation is exact.

``eps_high > eps_low`` is "clip-higher" (DAPO): it lets low-probability tokens with positive advantage grow faster
and keeps entropy from collapsing.

PPO with a critic (``advantage="gae"``, `lightrail.model.ppo`) replaces the adapter's advantages by GAE over each
call's response tokens, from a value head's ``V_t`` (values of the states before tokens 0..n-1 of the call) and the
call's return R (the credit assignment's, on the last token: ``r_t = 0`` for t < n-1, ``r_{n-1} = R``)::

    delta_t = r_t + gamma * V_{t+1} - V_t          (V_n = 0: the call ends its episode)
    A_t     = delta_t + gamma * lam * A_{t+1}      (A_n = 0)          `gae`
    G_t     = A_t + V_t                             the value target

and adds ``value_coef * sum_t w_t * v_t`` with the clipped value loss (`value_loss`; V_old = the values before the
step's first optimizer step, ``eps_v`` = ``value_clip``)::

    v_t = 1/2 * max((V_t - G_t)^2, (V_old,t + clip(V_t - V_old,t, -eps_v, eps_v) - G_t)^2)

Stale tokens (asynchronous GRPO, ``GRPO(async_=True)``): a token sampled by an older policy version than the one
being trained is corrected by truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl). With ``is_cap = C``::

    prox_t = log pi_old_trainer(a_t | s_t) = logp_t, detached    (the trainer's weights before this optimizer step)
    w_t    = min(exp(prox_t - old_t), C)                          (no gradient)
    r_t    = exp(logp_t - prox_t)
    pg_t   = -w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

so the trust region is measured from the trainer's current weights and the gap to the sampler (staleness plus
numerics) is a capped per-token weight instead of a ratio the clip would zero. One optimizer step per update
(``mini_batches == 1``, which async mode requires) makes ``prox`` exactly the trainer's pre-step logprob, at no
extra forward pass; then ``r_t = 1`` in value, and the gradient is ``-w_t * A_t * grad logp_t``: TIS's policy
gradient. An on-policy token (same weights, float32 both sides) has ``w_t = 1`` up to numerics.
"""

from __future__ import annotations

import torch

from lightrail.model.kl import kl_estimator as kl_estimator_by_name
from lightrail.model.policy_losses import TokenBatch, policy_loss_named
from lightrail.model.update_config import LOSS_AGG, LOSS_NORMS, LossNorm, resolve_loss_norm

__all__ = [
    "LOSS_AGG",
    "LOSS_NORMS",
    "LossNorm",
    "gae",
    "loss_weights",
    "mismatch_kl",
    "policy_loss",
    "resolve_loss_norm",
    "tis_weights",
    "token_entropy",
    "value_loss",
    "whiten",
]


def loss_weights(
    segment_ids: torch.Tensor | None, n_tokens: int | None = None, *, sum_norm: float | None = None
) -> torch.Tensor:
    """Normalisation weights ``w_t`` for the flat list of a step's masked tokens.

    ``segment_ids`` (1-D, integer) names the segment (row or rollout) each token belongs to; then
    ``w_t = 1 / (S * n_{seg(t)})`` with S the number of distinct segments (they sum to 1), or with ``sum_norm = L``
    ``w_t = 1 / (S * L)`` (Dr. GRPO's constant normaliser). ``None`` means token-mean over ``n_tokens`` tokens:
    ``w_t = 1 / N``.

        >>> loss_weights(torch.tensor([0, 0, 0, 1]))   # row 0 has 3 tokens, row 1 has 1
        tensor([0.1667, 0.1667, 0.1667, 0.5000], dtype=torch.float64)
        >>> loss_weights(torch.tensor([0, 0, 0, 1]), sum_norm=4)   # 2 rows, L = 4: 1 / 8 each
        tensor([0.1250, 0.1250, 0.1250, 0.1250], dtype=torch.float64)
    """
    if segment_ids is None:
        if sum_norm is not None:
            raise ValueError("sum_norm needs segment_ids (the mean is over segments)")
        if n_tokens is None:
            raise ValueError("give segment_ids or n_tokens")
        return torch.full((n_tokens,), 1.0 / max(n_tokens, 1), dtype=torch.float64)
    if segment_ids.numel() == 0:
        return torch.zeros(0, dtype=torch.float64)
    _, inverse, counts = torch.unique(segment_ids, return_inverse=True, return_counts=True)
    if sum_norm is not None:
        if not sum_norm > 0:
            raise ValueError(f"sum_norm must be positive, not {sum_norm!r}")
        return torch.full((segment_ids.numel(),), 1.0 / (counts.numel() * float(sum_norm)), dtype=torch.float64)
    # float64: the weights of a step with ~1e5 tokens are ~1e-5 each; summing them in fp32 would drift.
    return 1.0 / (counts.numel() * counts[inverse].to(torch.float64))


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    is_cap: float | None = None,
    clip_ratio_c: float | None = None,
    kl_estimator: str = "low_var_kl",
    loss: str = "vanilla",
    segment_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clipped policy-gradient loss with an optional KL penalty; see the module docstring for the formula.

    ``loss`` names the per-token policy-gradient term in `lightrail.model.policy_losses.POLICY_LOSSES` (``vanilla``:
    the PPO-clip above; ``gspo``, ``cispo``); everything else here is the same for each. ``segment_ids`` ([N] like
    ``logp``, or like ``mask`` with one) name each token's sequence, for a loss that needs them (``gspo``).

    ``clip_ratio_c = c`` (> 1) dual-clips tokens with a negative advantage: their loss is at most ``-A * c``
    (None: off). ``kl_estimator`` names the penalty's estimator in `lightrail.model.kl.KL_ESTIMATORS` (used with
    ``ref_logp`` and ``kl_coef != 0``).

    ``is_cap = C`` corrects stale tokens by truncated importance sampling (module docstring, "Stale tokens"): the
    ratio is taken against ``logp`` detached and each token weighted by `tis_weights`; stats then add
    ``is_weight_mean`` and ``is_clipped_frac`` (tokens whose weight was capped). None: the plain loss, both stats 0.

    ``logp`` (with grad), ``old_logp``, ``advantages`` and optionally ``ref_logp`` have one entry per token. With
    ``mask`` (same shape, 1 = response token) only masked tokens count; without it every entry is a response token.
    ``weights`` are `loss_weights` for the selected tokens (default token-mean over them); passing a step's global
    weights sliced to a micro-batch makes the micro-batch losses add up to the step loss.

    Returns ``(loss, stats)``; stats are detached means over the selected tokens (not weighted by ``weights``):
    ``pg_loss``, ``kl_ref`` (the KL estimator's value to the reference, 0 without one), ``clip_frac`` (tokens whose clipped term is
    active, i.e. that get no gradient), ``approx_kl = mean((r - 1) - log r)`` (the k3 estimator of
    KL(pi_old || pi_theta) from pi_old's samples; 0 while nothing changed), ``ratio_mean``, ``ratio_max`` and
    ``tokens`` (the count).

        >>> loss, stats = policy_loss(torch.tensor([-1.0]), torch.tensor([-1.0]), torch.tensor([2.0]))
        >>> float(loss)            # r = 1, no clipping: -(1 * 2)
        -2.0
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip's lower bound on the loss), not {clip_ratio_c}")
    estimate_kl = kl_estimator_by_name(kl_estimator)
    term = policy_loss_named(loss)
    if clip_ratio_c is not None and not term.dual_clip:
        raise ValueError(f"clip_ratio_c is dual-clip's bound: the {loss} policy loss has none (leave it unset)")
    if mask is not None:
        sel = mask.bool()
        logp, old_logp, advantages = logp[sel], old_logp[sel], advantages[sel]
        ref_logp = ref_logp[sel] if ref_logp is not None else None
        segment_ids = segment_ids[sel] if segment_ids is not None else None
    n = logp.numel()
    if weights is None:
        weights = loss_weights(None, n)
    weights = weights.to(device=logp.device, dtype=logp.dtype)
    old_logp = old_logp.to(logp.dtype)
    advantages = advantages.to(logp.dtype)

    is_weight = is_capped = logp.new_zeros(0)
    baseline = old_logp
    if is_cap is not None:
        baseline = logp.detach()  # prox: the trust region is measured from the trainer's pre-step weights
        is_weight, is_capped = tis_weights(baseline, old_logp, is_cap)
    pg, ratio, is_clipped = term.fn(
        TokenBatch(logp, baseline, advantages, segment_ids), clip_low, clip_high, clip_ratio_c
    )
    if is_cap is not None:
        pg = is_weight * pg
    per_token = pg
    kl_ref = None
    if ref_logp is not None and kl_coef != 0.0:
        kl_ref = estimate_kl(logp, ref_logp.to(logp.dtype))
        per_token = per_token + kl_coef * kl_ref
    total = (weights * per_token).sum()

    with torch.no_grad():
        denom = max(n, 1)
        log_ratio = ratio.log()
        stats = {
            "pg_loss": pg.sum() / denom,
            "kl_ref": kl_ref.sum() / denom if kl_ref is not None else logp.new_zeros(()),
            "clip_frac": is_clipped.sum().to(logp.dtype) / denom,
            "approx_kl": ((ratio - 1.0) - log_ratio).sum() / denom,
            "ratio_mean": ratio.sum() / denom,
            "ratio_max": ratio.max() if n else logp.new_zeros(()),
            "is_weight_mean": is_weight.sum() / denom,
            "is_clipped_frac": is_capped.sum().to(logp.dtype) / denom,
            "tokens": torch.tensor(n),
        }
    return total, {k: v.detach() for k, v in stats.items()}


def tis_weights(prox_logp: torch.Tensor, old_logp: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights ``w_t = min(exp(prox_t - old_t), cap)`` (no gradient) of tokens sampled with
    logprobs ``old_logp`` and trained from weights whose logprobs are ``prox_logp``; returns the weights and a mask of
    the capped ones (Yao et al. 2025; see the module docstring).

        >>> w, capped = tis_weights(torch.tensor([-1.0, -1.0, 0.0]), torch.tensor([-1.0, -0.5, -5.0]), cap=2.0)
        >>> [round(x, 4) for x in w.tolist()], capped.tolist()     # 1, e^-0.5, min(e^5, 2)
        ([1.0, 0.6065, 2.0], [False, False, True])
    """
    if not cap > 0:
        raise ValueError(f"is_cap must be positive, not {cap!r}")
    with torch.no_grad():
        raw = torch.exp(prox_logp.detach() - old_logp.detach().to(prox_logp.dtype))
        return torch.clamp(raw, max=cap), raw > cap


def mismatch_kl(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate ``(r - 1) - log r`` (r = exp(logp - old_logp)) of KL(sampler || trainer): how far the
    trainer's logprobs of the sampled tokens (``logp``) are from the ones the sampler recorded (``old_logp``).

    Computed in float64 with ``expm1`` (no gradient): a healthy float32 pair differs by ~1e-7 per token, and
    ``(r - 1) - log r`` in float32 would be rounding noise of that size. Never negative; 0 exactly when they agree.

        >>> mismatch_kl(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])).tolist()   # e^-1 - 1 + 1
        [0.0, 0.36787944117144233]
    """
    with torch.no_grad():
        log_ratio = logp.detach().to(torch.float64) - old_logp.detach().to(torch.float64)
        return torch.expm1(log_ratio) - log_ratio


def token_entropy(logits: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` of each row of ``logits`` (no gradient).

    Pass ``lse = logsumexp(logits, -1)`` when it is already computed; the cost is then one softmax over the rows.
    """
    with torch.no_grad():
        if lse is None:
            lse = torch.logsumexp(logits, dim=-1)
        return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def gae(rewards: torch.Tensor, values: torch.Tensor, *, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over one episode of n steps that ends after its last one (Schulman et al.
    2016, arXiv:1506.02438): ``(advantages, returns)``, both [n], ``returns = advantages + values`` (module
    docstring). ``rewards`` and ``values`` are [n]; no gradient flows through them.

        >>> adv, ret = gae(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.25]), gamma=1.0, lam=0.5)
        >>> adv.tolist(), ret.tolist()   # delta = [0.25 - 0.5, 1 - 0.25]; A_0 = -0.25 + 0.5 * 0.75
        ([0.125, 0.75], [0.625, 1.0])
    """
    if rewards.shape != values.shape or rewards.ndim != 1:
        raise ValueError(f"rewards and values must be 1-D of one length, got {rewards.shape} and {values.shape}")
    with torch.no_grad():
        values = values.detach()
        nxt = torch.cat([values[1:], values.new_zeros(1)])
        delta = rewards.to(values.dtype) + gamma * nxt - values
        adv = torch.empty_like(delta)
        running = 0.0
        for t in range(delta.numel() - 1, -1, -1):  # calls are short (tokens of one answer): a loop is cheap
            running = float(delta[t]) + gamma * lam * running
            adv[t] = running
        return adv, adv + values


def whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with the sample variance (verl's ``masked_whiten``); fewer than two entries
    give zeros (no spread to scale by)."""
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) * torch.rsqrt(x.var() + eps)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    clip: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss ``sum_t w_t * 1/2 * max((V - G)^2, (V_old + clip(V - V_old, +-clip) - G)^2)``
    (``clip=None``: the plain squared error); ``weights`` default to token-mean.

    Returns ``(loss, stats)``: ``value_loss`` (unweighted token mean of the per-token term), ``value_clip_frac``
    (tokens where the clipped term is the larger one, so the value gets no gradient), ``value_mean``, ``tokens``.

        >>> loss, stats = value_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0]), clip=0.5)
        >>> float(loss)   # max((1 - 2)^2, (0 + 0.5 - 2)^2) / 2
        1.125
    """
    old_values = old_values.to(values.dtype)
    returns = returns.to(values.dtype)
    n = values.numel()
    if weights is None:
        weights = loss_weights(None, n)
    weights = weights.to(device=values.device, dtype=values.dtype)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        clipped_more = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        moved = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (moved - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clipped_more = clipped > unclipped
    per_token = 0.5 * per_token
    loss = (weights * per_token).sum()
    with torch.no_grad():
        denom = max(n, 1)
        stats = {
            "value_loss": per_token.detach().sum() / denom,
            "value_clip_frac": clipped_more.sum().to(values.dtype) / denom,
            "value_mean": values.detach().sum() / denom,
            "tokens": torch.tensor(n),
        }
    return loss, stats
