"""The short variant of the training demo, end to end: a small Llama built here, warm-started on the imperfect
teacher, then GRPO through real runner processes, the gateway, the embedded engine and a SQLite store. On a
fixed seed, held-out success (greedy) must go up, and every artefact the demo promises must exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from examples.calculator.demo import DemoSettings, run_demo
from examples.calculator.teacher import SYSTEMATIC, demonstrations, shape


def test_teacher_is_imperfect_and_systematic():
    from examples.calculator.agent import parse_answer
    from examples.calculator.data import make_splits

    train, _ = make_splits(1000, 0)
    right = {}
    for problem, conversation in zip(train, demonstrations(train), strict=True):
        right.setdefault(shape(problem["expression"]), []).append(
            parse_answer(conversation[-1]["content"]) == problem["answer"]
        )
    rate = {k: sum(v) / len(v) for k, v in right.items()}
    for systematic in SYSTEMATIC:  # wrong most of the time on these shapes: the habit GRPO has to fix
        assert rate[systematic] < 0.4
    assert all(r > 0.6 for k, r in rate.items() if k not in SYSTEMATIC)


@pytest.mark.slow  # 11 of the default suite's 42 minutes on a fresh clone (2026-11-28); `scripts/test -m slow`
@pytest.mark.timeout(1500)  # ~5 min warm start + ~4 min of GRPO, more on a busy machine
def test_quick_demo_raises_held_out_success(tmp_path, monkeypatch):
    import torch

    # The rest of the suite runs one torch thread per process; this test runs alone and is CPU-bound.
    threads = torch.get_num_threads()
    monkeypatch.setenv("LIGHTRAIL_TORCH_THREADS", "2")
    torch.set_num_threads(2)
    settings = DemoSettings.quick(out=tmp_path / "demo", seed=0)
    report = run_demo(settings)
    assert report["val_after"] > report["val_before"], report
    for key in ("reward_curve", "checkpoint", "metrics"):
        assert Path(report[key]).exists(), key
    lines = [json.loads(line) for line in Path(report["metrics"]).read_text().splitlines()]
    train = [m for m in lines if m["kind"] == "train"]
    assert len(train) == settings.grpo_steps
    assert all(m["excluded"] == 0 for m in train)  # nothing was lost to infrastructure
    assert train[-1]["policy_version"] == sum(not m["skipped"] for m in train)  # every update reached the engine
    monkeypatch.undo()
    torch.set_num_threads(threads)
