"""Loss aggregations (token_mean, seq_mean_token_mean, rollout, seq_mean_token_sum_norm) against hand-computed
weights and losses, how `GRPO` picks one per estimator, and micro-batching invariance of the Dr. GRPO one.

Rows used for the weights: row 0 has 3 response tokens and row 1 has 1 (both rollout r1), row 2 has 2 (rollout r2)::

    token_mean               1/6 each                                        (N = 6)
    seq_mean_token_mean      row 0: 1/(3*3), row 1: 1/(3*1), row 2: 1/(3*2)  (S = 3 rows)
    rollout                  r1: 1/(2*4), r2: 1/(2*2)                         (2 rollouts)
    seq_mean_token_sum_norm  1/(3*L) each, L = 4: 1/12                        (Dr. GRPO / verl)
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lightrail.algorithms import GRPO, PolicyUpdater, UpdateConfig, loss_weights, policy_loss
from lightrail.algorithms.settings import resolve_loss_agg
from lightrail.model._loss import resolve_loss_norm
from lightrail.model.updater import row_loss_weights
from lightrail.types import TrainingRow
from tests.algorithms.grpo_helpers import make_rows, tiny_llama


def _row(rollout: str, n_response: int) -> TrainingRow:
    mask = [0, 0] + [1] * n_response
    n = len(mask)
    return TrainingRow(input_ids=list(range(n)), loss_mask=mask, old_logprobs=[0.0] * n, advantages=[1.0] * n,
                       rollout_id=rollout)  # fmt: skip


ROWS = [_row("r1", 3), _row("r1", 1), _row("r2", 2)]


@pytest.mark.parametrize(
    "name, expected",
    [
        ("token_mean", [[1 / 6] * 3, [1 / 6], [1 / 6] * 2]),
        ("seq_mean_token_mean", [[1 / 9] * 3, [1 / 3], [1 / 6] * 2]),
        ("rollout", [[1 / 8] * 3, [1 / 8], [1 / 4] * 2]),
        ("seq_mean_token_sum_norm", [[1 / 12] * 3, [1 / 12], [1 / 12] * 2]),
    ],
)
def test_row_weights_by_hand(name, expected):
    got = row_loss_weights(ROWS, resolve_loss_norm(name), loss_norm_tokens=4)
    assert [w.tolist() for w in got] == [pytest.approx(e, abs=1e-15) for e in expected]


def test_sum_norm_loss_is_verls_token_sum_over_a_constant():
    """The 4-token fixture of test_policy_loss (pg = -1.2, -0.5, 1.1, 0.8; tokens 0-2 in row 0, token 3 in row 1).
    verl seq-mean-token-sum-norm: sum over rows of their token sums / L, averaged over the B = 2 rows:
    ((-1.2 - 0.5 + 1.1) + 0.8) / 4 / 2 = 0.025 with L = 4; the gradient of each unclipped token is -A r / (B L)."""
    old = torch.full((4,), -1.0, dtype=torch.float64)
    logp = (old + torch.tensor([math.log(r) for r in (1.5, 0.5, 1.1, 0.7)], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    w = loss_weights(torch.tensor([0, 0, 0, 1]), sum_norm=4)
    assert w.tolist() == [0.125] * 4
    loss, _ = policy_loss(logp, old, adv, weights=w)
    assert loss.item() == pytest.approx(0.025, abs=1e-12)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5 / 8, 1.1 / 8, 0.0], abs=1e-12)
    # Length independence: doubling a row's tokens doubles its weight in the sum (token-mean would halve each).
    assert loss_weights(torch.tensor([0, 0, 1]), sum_norm=4).tolist() == [0.125] * 3


def test_bad_names_and_missing_length_are_errors():
    with pytest.raises(ValueError, match=r"loss_agg: expected one of .*got 'token_avg'"):
        resolve_loss_norm("token_avg")
    with pytest.raises(ValueError, match="loss_norm: expected"):
        UpdateConfig(loss_norm="tokens")
    with pytest.raises(ValueError, match="needs loss_norm_tokens"):
        row_loss_weights(ROWS, "sequence_sum_norm")
    with pytest.raises(ValueError, match="sum_norm must be positive"):
        loss_weights(torch.tensor([0]), sum_norm=0)
    assert UpdateConfig(loss_norm="seq_mean_token_mean").loss_norm == "sequence"  # verl names are stored as LossNorm


def test_each_estimator_has_its_natural_aggregation_and_explicit_choices_win():
    assert resolve_loss_agg("grpo", None) == "token"  # today's default, unchanged
    assert resolve_loss_agg("rloo", None) == "token"
    assert resolve_loss_agg("reinforce_pp", None) == "token"
    assert resolve_loss_agg("dr_grpo", None) == "sequence_sum_norm"
    assert resolve_loss_agg("dr_grpo", "token_mean") == "token"
    assert resolve_loss_agg("grpo", "seq_mean_token_sum_norm") == "sequence_sum_norm"
    assert resolve_loss_agg("dr_grpo", None, UpdateConfig(loss_norm="rollout")) == "rollout"
    with pytest.raises(ValueError, match="contradicts config.loss_norm='rollout'"):
        resolve_loss_agg("grpo", "seq_mean_token_mean", UpdateConfig(loss_norm="rollout"))


def test_grpo_checks_its_options_and_resolves_the_update_config(tmp_path):
    with pytest.raises(ValueError, match="advantage: expected one of"):
        GRPO(tmp_path, advantage="dr-grpo")
    with pytest.raises(ValueError, match="loss_agg: expected one of"):
        GRPO(tmp_path, loss_agg="mean")
    dr = GRPO(tmp_path, advantage="dr_grpo", sampling={"max_tokens": 48})
    cfg = dr._loss_config(UpdateConfig())
    assert (cfg.loss_norm, cfg.loss_norm_tokens) == ("sequence_sum_norm", 48)  # L = the generation budget
    assert dr._loss_config(UpdateConfig(loss_norm_tokens=100)).loss_norm_tokens == 100
    plain = GRPO(tmp_path)
    assert plain._loss_config(UpdateConfig()) == UpdateConfig()  # grpo: nothing changes
    assert GRPO(tmp_path, advantage="rloo", loss_agg="seq_mean_token_mean")._loss_config(UpdateConfig()).loss_norm == (
        "sequence"
    )


def test_sum_norm_step_is_the_same_with_any_micro_batching():
    rows = make_rows(10, seed=1, zero_adv_rows=2)
    base = tiny_llama(seed=3, dtype=torch.float64)
    results = []
    for budget in (10_000, 40):
        cfg = UpdateConfig(lr=1e-3, loss_norm="sequence_sum_norm", loss_norm_tokens=16, micro_batch_tokens=budget,
                         dtype="float64")  # fmt: skip
        upd = PolicyUpdater(copy.deepcopy(base), cfg)
        m = upd.step(rows)
        results.append((m, {n: p.grad.clone() for n, p in upd._trainable.items() if p.grad is not None}))
    (m1, g1), (m2, g2) = results
    assert m1["micro_batches"] == 1 and m2["micro_batches"] >= 4
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-10)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], atol=1e-10, rtol=0)
    # And it is the token sum over L * rows: the same step with token-mean differs by N / (S * L).
    n_tokens, n_rows = sum(sum(r.loss_mask) for r in rows), len(rows)
    upd = PolicyUpdater(copy.deepcopy(base), UpdateConfig(lr=1e-3, dtype="float64"))
    m_token = upd.step(rows)
    assert m1["loss"] == pytest.approx(m_token["loss"] * n_tokens / (n_rows * 16), rel=1e-9)
