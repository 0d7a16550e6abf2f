"""Save / load of a `PolicyUpdater`: a resumed run continues exactly as the uninterrupted one would have."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from grpo_helpers import make_rows, tiny_llama

from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.model.checkpoint import atomic_directory

CASES = {
    # Full fine-tuning with a KL term: the frozen reference must come back too (the fresh updater's own copy is of a
    # differently initialised model).
    "full+kl": (UpdateConfig(lr=3e-3, kl_coef=0.1, warmup_steps=3, weight_decay=0.01, micro_batch_tokens=60), 0, 1),
    # LoRA with dropout: the RNG state decides the dropout masks of step 3, so it has to be restored.
    "lora+dropout": (UpdateConfig(lr=1e-2, lora=LoraSettings(r=4, dropout=0.1), micro_batch_tokens=60), 0, 0),
}


@pytest.mark.parametrize("case", CASES)
def test_resume_gives_identical_next_steps(case, tmp_path):
    config, seed_a, seed_b = CASES[case]
    rows = [make_rows(8, seed=s) for s in range(4)]

    torch.manual_seed(123)
    upd = PolicyUpdater(tiny_llama(seed=seed_a), config)
    upd.step(rows[0])
    upd.step(rows[1])
    upd.save(tmp_path / "ckpt")
    expected = [upd.step(rows[2]), upd.step(rows[3])]
    expected_weights = {n: p.detach().clone() for n, p in upd._trainable.items()}

    torch.manual_seed(999)  # whatever the RNG did meanwhile, the checkpoint's state wins
    # A new process would rebuild the model from its files: the base weights are the same for LoRA (the adapter is
    # initialised differently via the seed), a different random init for full fine-tuning.
    fresh = PolicyUpdater(tiny_llama(seed=seed_b), dataclasses.replace(config, seed=42))
    fresh.load(tmp_path / "ckpt")
    assert fresh.steps == 2
    got = [fresh.step(rows[2]), fresh.step(rows[3])]

    for e, g in zip(expected, got, strict=True):
        for key in ("loss", "pg_loss", "kl_ref", "clip_frac", "grad_norm", "lr", "entropy"):
            assert g[key] == e[key], key  # bitwise on CPU
    for name, value in expected_weights.items():
        assert torch.equal(fresh._trainable[name], value), name


def test_checkpoint_contents_and_overwrite(tmp_path):
    upd = PolicyUpdater(tiny_llama(), UpdateConfig(lora=LoraSettings(r=2)))
    upd.step(make_rows(4))
    dest = tmp_path / "ckpt"
    upd.save(dest)
    upd.step(make_rows(4, seed=1))
    upd.save(dest)  # replaces the previous checkpoint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary or old directories left
    assert sorted(p.name for p in dest.iterdir()) == ["trainable.safetensors", "trainer_state.pt", "updater.json"]
    meta = json.loads((dest / "updater.json").read_text())
    assert meta["steps"] == 2 and meta["config"]["lora"]["r"] == 2

    other = PolicyUpdater(tiny_llama(), UpdateConfig(lora=LoraSettings(r=8)))
    with pytest.raises(ValueError, match="lora"):
        other.load(dest)


def test_failed_save_leaves_the_previous_checkpoint(tmp_path):
    dest = tmp_path / "ckpt"
    with atomic_directory(dest) as tmp:
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(dest) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("crash mid-save")
    assert (dest / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_resumed_run_trains_with_the_rate_and_schedule_of_its_own_config(tmp_path):
    rows = [make_rows(4, seed=s) for s in range(4)]
    upd = PolicyUpdater(tiny_llama(), UpdateConfig(lr=1e-3, micro_batch_tokens=60))
    assert [upd.step(r)["lr"] for r in rows[:2]] == [1e-3, 1e-3]
    upd.save(tmp_path / "ckpt")
    # resumed at step 2 with twice the rate, decaying to 0 at step 4 (say, to settle a run that was meant to stop)
    resumed = PolicyUpdater(tiny_llama(), UpdateConfig(lr=2e-3, decay_start=1, decay_steps=4, micro_batch_tokens=60))
    resumed.load(tmp_path / "ckpt")
    assert [resumed.step(r)["lr"] for r in rows[2:]] == pytest.approx([2e-3 * 2 / 3, 2e-3 * 1 / 3])
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [0.0, 0.0]


def test_learning_rate_warms_up_then_decays_linearly_to_zero():
    from lightrail.model.updater import lr_factor

    assert [lr_factor(s, 0, 0) for s in (0, 5, 500)] == [1.0, 1.0, 1.0]  # constant by default
    assert [lr_factor(s, 4, 0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s, 0, 4) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    # both: up to the full rate over the warm-up, then down from it to 0 at step decay_steps
    assert [lr_factor(s, 2, 6) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    # warm-up, stable, decay: the full rate holds until decay_start, then falls to 0 at decay_steps
    assert [lr_factor(s, 2, 8, decay_start=4) for s in range(9)] == [0.5, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    assert [lr_factor(s, 2, 6, decay_start=1) for s in range(7)] == [lr_factor(s, 2, 6) for s in range(7)]
    upd = PolicyUpdater(tiny_llama(), UpdateConfig(lr=1e-3, warmup_steps=2, decay_steps=4, micro_batch_tokens=60))
    lrs = [upd.step(make_rows(4, seed=s))["lr"] for s in range(5)]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4, 0.0])  # the rate each step trained with
    config = UpdateConfig(lr=1e-3, warmup_steps=1, decay_start=3, decay_steps=5, micro_batch_tokens=60)
    upd = PolicyUpdater(tiny_llama(), config)
    lrs = [upd.step(make_rows(4, seed=s))["lr"] for s in range(6)]
    assert lrs == pytest.approx([1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 0.0])
    with pytest.raises(ValueError, match="decay_steps and decay_start must be >= 0"):
        UpdateConfig(decay_steps=-1)
    with pytest.raises(ValueError, match=r"decay_steps \(3\) must come after warmup_steps \(3\)"):
        UpdateConfig(warmup_steps=3, decay_steps=3)
    with pytest.raises(ValueError, match=r"decay_start \(600\) needs a later decay_steps, not 0"):
        UpdateConfig(decay_start=600)  # a hold with no fall after it is a mistake, not a constant rate


def test_a_stage_whose_steps_miss_its_decay_schedule_says_so(caplog):
    """`--set sft.steps=1200` on a config decaying to 0 at step 800 would train 400 steps at rate 0, and 600 would stop
    at half the rate: both stages say so when built, before any work; steps equal to decay_steps say nothing."""
    from lightrail.algorithms import GRPO, SFT

    config = UpdateConfig(lr=1e-3, warmup_steps=10, decay_start=400, decay_steps=800)
    with caplog.at_level("WARNING", logger="lightrail.algorithms"):
        SFT("unused", config=config, steps=1200)
        GRPO("unused", config=config, steps=600)
        SFT("unused", config=config, steps=800)
        SFT("unused", config=UpdateConfig(lr=1e-3, warmup_steps=10), steps=1200)  # a constant rate has no end to miss
    assert [r.getMessage() for r in caplog.records] == [
        "SFT: steps (1200) run past config.decay_steps (800): the last 400 train at rate 0",
        "GRPO: steps (600) stop short of config.decay_steps (800): the rate ends at 50% of lr",
    ]


def test_pruning_keeps_the_newest_complete_checkpoints_and_one_being_written(tmp_path):
    from lightrail.algorithms import GRPO, SFT
    from lightrail.algorithms.run.folder import LOOP_STATE, latest_checkpoint, prune_checkpoints

    root = tmp_path / "checkpoints"
    for step, complete in ((5, True), (10, True), (15, False), (20, True), (25, False)):
        (root / f"step-{step}").mkdir(parents=True)
        if complete:
            (root / f"step-{step}" / LOOP_STATE).write_text("{}")
    assert prune_checkpoints(tmp_path, None) == []  # the default keeps every one
    deleted = prune_checkpoints(tmp_path, 2)
    # step 15 was a crash's leftover (no loop state, older than the newest complete one); step 25 may be being
    # written right now, so it stays
    assert sorted(p.name for p in deleted) == ["step-15", "step-5"]
    assert sorted(p.name for p in root.iterdir()) == ["step-10", "step-20", "step-25"]
    assert latest_checkpoint(tmp_path).name == "step-20"
    for stage in (SFT, GRPO):
        with pytest.raises(ValueError, match=r"keep_checkpoints must be >= 1 \(None keeps every one\), not 0"):
            stage("unused", keep_checkpoints=0)
