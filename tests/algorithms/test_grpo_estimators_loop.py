"""`GRPO(advantage=...)` through the real loop (trainer, in-process runner, gateway, engine, updater): the estimator
shapes the advantages of the step and its natural loss aggregation reaches the updater."""

from __future__ import annotations

import json

import pytest
from grpo_helpers import tiny_grpo

from lightrail import MemoryStore, Trainer
from lightrail.engine.models import build_tiny_model

AGENT = "loop_agents:parity_agent"  # reward: parity of the sampled reply's length (0 or 1)


@pytest.mark.parametrize(
    ("advantage", "loss_norm", "bound"),
    [
        # R − mean of a 0/1 group of 4: |z| <= 3/4, no std division
        ("dr_grpo", "sequence_sum_norm", 0.75),
        # whitened over the batch (formulas: tests/adapters/test_estimators.py); token-mean stays its aggregation
        ("reinforce_pp", "token", None),
    ],
)
def test_estimator_runs_through_the_loop(tmp_path, advantage, loss_norm, bound):
    from examples.calculator.data import make_splits

    train, val = make_splits(8, 2, seed=1)
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    grpo = tiny_grpo(model, tmp_path / "run", advantage=advantage)
    Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo).fit(AGENT, train, val)
    assert grpo.report["advantage"] == advantage and grpo.report["loss_norm"] == loss_norm
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-1" / "updater.json").read_text())["config"]
    assert saved["loss_norm"] == loss_norm
    assert saved["loss_norm_tokens"] == (8 if loss_norm == "sequence_sum_norm" else None)  # L = max_tokens
    step = next(json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["kind"] == "train")  # fmt: skip
    assert step["rollouts"] == 8 and step["excluded"] == 0
    if bound is not None:
        assert 0.0 < step["adv_abs_max"] <= bound + 1e-12 or step["zero_std_groups"] == 2
