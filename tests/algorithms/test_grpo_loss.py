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
