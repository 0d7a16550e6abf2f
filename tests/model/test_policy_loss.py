"""`policy_loss` and `loss_weights` against hand-computed numbers.

Four response tokens, old logprob -1 each, new/old ratios r = (1.5, 0.5, 1.1, 0.7), advantages (1, 1, -1, -1),
eps = 0.2 on both sides:

    token  r    A   r*A    clip(r)*A   min    pg = -min   clipped?
    0      1.5   1   1.5    1.2         1.2    -1.2        yes (r > 1.2 with A > 0)
    1      0.5   1   0.5    0.8         0.5    -0.5        no
    2      1.1  -1  -1.1   -1.1        -1.1     1.1        no
    3      0.7  -1  -0.7   -0.8        -0.8     0.8        yes (r < 0.8 with A < 0)

token-mean loss = (-1.2 - 0.5 + 1.1 + 0.8) / 4 = 0.05; d loss / d logp_t = -w_t * A_t * r_t where unclipped, else 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightrail.algorithms import loss_weights, policy_loss

RATIOS = [1.5, 0.5, 1.1, 0.7]
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
OLD = torch.full((4,), -1.0, dtype=torch.float64)


def new_logp() -> torch.Tensor:
    return (OLD + torch.tensor([math.log(r) for r in RATIOS], dtype=torch.float64)).requires_grad_(True)


def test_token_mean_clipped_and_unclipped_tokens():
    logp = new_logp()
    loss, stats = policy_loss(logp, OLD, ADV)
    assert loss.item() == pytest.approx(0.05, abs=1e-12)
    loss.backward()
    # Clipped tokens 0 and 3 get no gradient; 1: -(1/4)(1)(0.5), 2: -(1/4)(-1)(1.1).
    assert logp.grad.tolist() == pytest.approx([0.0, -0.125, 0.275, 0.0], abs=1e-12)
    assert float(stats["clip_frac"]) == 0.5
    assert float(stats["ratio_mean"]) == pytest.approx(sum(RATIOS) / 4)
    assert float(stats["ratio_max"]) == pytest.approx(1.5)
    assert float(stats["approx_kl"]) == pytest.approx(sum((r - 1) - math.log(r) for r in RATIOS) / 4)
    assert float(stats["kl_ref"]) == 0.0
    assert int(stats["tokens"]) == 4


def test_sequence_normalisation_weights_each_row_equally():
    # Tokens 0-2 belong to row 0, token 3 to row 1: w = (1/6, 1/6, 1/6, 1/2).
    w = loss_weights(torch.tensor([0, 0, 0, 1]))
    assert w.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    logp = new_logp()
    loss, _ = policy_loss(logp, OLD, ADV, weights=w)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.1) / 6 + 0.8 / 2, abs=1e-12)  # = 0.3
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5 / 6, 1.1 / 6, 0.0], abs=1e-12)


def test_token_weights_sum_to_one_and_split_exactly():
    segs = torch.tensor([3, 3, 7, 7, 7, 9])
    w = loss_weights(segs)
    assert float(w.sum()) == pytest.approx(1.0, abs=1e-15)
    assert loss_weights(None, 5).tolist() == [0.2] * 5


def test_clip_higher_lets_positive_advantage_tokens_grow_further():
    loss, stats = policy_loss(new_logp(), OLD, ADV, clip_low=0.2, clip_high=0.6)
    # Token 0 (r = 1.5 < 1.6) is no longer clipped: pg = -1.5.
    assert loss.item() == pytest.approx((-1.5 - 0.5 + 1.1 + 0.8) / 4, abs=1e-12)
    assert float(stats["clip_frac"]) == 0.25


def test_k3_kl_penalty_to_reference():
    logp = new_logp()
    # ref - new = (ln 2, 0, -ln 2, 0): k3 = e^d - d - 1 = (1 - ln 2, 0, ln 2 - 1/2, 0), mean 0.125.
    ref = logp.detach() + torch.tensor([math.log(2), 0.0, -math.log(2), 0.0], dtype=torch.float64)
    loss, stats = policy_loss(logp, OLD, ADV, ref_logp=ref, kl_coef=0.1)
    assert float(stats["kl_ref"]) == pytest.approx(0.125, abs=1e-12)
    assert loss.item() == pytest.approx(0.05 + 0.1 * 0.125, abs=1e-12)
    loss.backward()
    # d k3 / d logp = 1 - e^d: token 0: 1 - 2 = -1, token 2: 1 - 1/2 = 0.5; times beta * w = 0.1 / 4.
    assert logp.grad.tolist() == pytest.approx([-0.025, -0.125, 0.275 + 0.0125, 0.0], abs=1e-12)


def test_mask_selects_response_tokens():
    logp = torch.cat([torch.tensor([-9.0], dtype=torch.float64), new_logp().detach()])
    old = torch.cat([torch.tensor([0.0], dtype=torch.float64), OLD])
    adv = torch.cat([torch.tensor([5.0], dtype=torch.float64), ADV])
    loss, stats = policy_loss(logp, old, adv, mask=torch.tensor([0, 1, 1, 1, 1]))
    assert loss.item() == pytest.approx(0.05, abs=1e-12)
    assert int(stats["tokens"]) == 4


def test_on_policy_ratio_is_one_and_loss_is_minus_mean_advantage():
    lp = torch.tensor([-2.0, -0.5, -3.0])
    loss, stats = policy_loss(lp, lp.clone(), torch.tensor([1.0, 2.0, 3.0]))
    assert loss.item() == pytest.approx(-2.0)
    assert float(stats["clip_frac"]) == 0.0
    assert float(stats["approx_kl"]) == 0.0


def test_dual_clip_bounds_a_negative_advantage_tokens_loss():
    """The issue's example: A = -1, ratio 4. Plain PPO-clip: loss 4, gradient 4; dual-clip with c = 3: loss 3,
    gradient 0. A positive advantage is untouched by c."""
    old = torch.tensor([-1.0, -1.0], dtype=torch.float64)
    adv = torch.tensor([-1.0, 1.0], dtype=torch.float64)
    for c, loss_want, grad_want in ((None, (4.0 - 1.2) / 2, [2.0, 0.0]), (3.0, (3.0 - 1.2) / 2, [0.0, 0.0])):
        logp = (old + math.log(4.0)).requires_grad_(True)
        loss, stats = policy_loss(logp, old, adv, clip_ratio_c=c)
        loss.backward()
        assert float(loss) == pytest.approx(loss_want)
        assert logp.grad is not None and logp.grad.tolist() == pytest.approx(grad_want)
        assert float(stats["clip_frac"]) == (1.0 if c else 0.5)  # dual-clipped tokens get no gradient either
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        policy_loss(old, old, adv, clip_ratio_c=1.0)


def test_the_kl_penalty_uses_the_named_estimator_with_verls_clamp():
    """k3 (the default, verl's low_var_kl) at ref - logp = 3 is clamped to 10 (not e^3 - 4 = 16.09), gradient 0;
    k1 is logp - ref; k3+ keeps k3's value with k2's gradient (logp - ref)."""
    zero = torch.zeros(1, dtype=torch.float64)
    for name, value, grad in (("low_var_kl", 10.0, 0.0), ("k1", -3.0, 1.0), ("k3+", 10.0, -3.0)):
        logp = torch.tensor([-4.0], dtype=torch.float64, requires_grad=True)
        loss, stats = policy_loss(logp, logp.detach(), zero, ref_logp=torch.tensor([-1.0]), kl_coef=1.0,
                                  kl_estimator=name)  # fmt: skip
        loss.backward()
        assert float(stats["kl_ref"]) == pytest.approx(value) and float(loss) == pytest.approx(value)
        assert logp.grad is not None and float(logp.grad) == pytest.approx(grad)
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; choose from \['kl', 'k1', 'abs'"):
        policy_loss(zero, zero, zero, kl_estimator="k4")


def test_the_log_ratio_is_clamped_before_exp_as_verl_does():
    """logp - old = -30 with A > 0: the ratio is e^-20 (verl's clamp), the loss -A e^-20 and the gradient 0."""
    logp = torch.tensor([-31.0], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(logp, torch.tensor([-1.0], dtype=torch.float64), torch.tensor([1e8], dtype=torch.float64))
    loss.backward()
    assert float(loss) == pytest.approx(-1e8 * math.exp(-20)) and float(logp.grad) == 0.0


def test_update_config_checks_dual_clip_and_the_estimators_name():
    from lightrail.model.updater import UpdateConfig

    assert UpdateConfig().clip_ratio_c is None and UpdateConfig().kl_estimator == "low_var_kl"
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        UpdateConfig(clip_ratio_c=0.5)
    with pytest.raises(ValueError, match=r"^kl_estimator: expected one of \['kl', 'k1', "):
        UpdateConfig(kl_estimator="k4")
