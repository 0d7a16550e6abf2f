"""The `GRPO` algorithm loop on a tiny model, through the real trainer, gateway, engine and in-process runners:
it trains, serves every update, records its metrics, resumes a run from its newest checkpoint, and a fresh run in the
same folder sets the earlier one aside."""

from __future__ import annotations

import json

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import UpdateConfig
from lightrail.algorithms.grpo import GRPO
from lightrail.algorithms.run.folder import latest_checkpoint
from lightrail.engine.models import build_tiny_model

AGENT = "loop_agents:parity_agent"


def _problems(n: int) -> list[dict]:
    from examples.calculator.data import make_splits

    train, val = make_splits(n, 4, seed=1)
    return train, val


def _fit(grpo: GRPO, train: list[dict], val: list[dict]) -> None:
    Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo).fit(AGENT, train, val)


def test_grpo_loop_trains_serves_and_resumes(tmp_path):
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = _problems(8)
    settings = dict(
        config=UpdateConfig(lr=1e-3),
        tasks_per_step=2,
        n_samples=4,  # a group of 4 whose rewards all agree (no update) has odds 1/8
        sampling={"temperature": 1.0, "max_tokens": 8},  # parity of the sampled length: a reward that varies
        val_sampling={"temperature": 0.0, "max_tokens": 8},
        val_every=0,
        checkpoint_every=1,
        out_dir=tmp_path / "run",
    )
    first = GRPO(model, steps=2, **settings)
    _fit(first, train, val)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m for m in metrics if m["kind"] == "train"]
    assert [m["step"] for m in train_steps] == [1, 2]
    assert all(m["rollouts"] == 8 and m["excluded"] == 0 for m in train_steps), train_steps
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "loop_state.json").exists()
    assert first.report["steps"] == 2 and (tmp_path / "run" / "reward_curve.png").exists()

    resumed = GRPO(model, steps=3, resume=True, keep_checkpoints=2, **settings)
    _fit(resumed, train, val)
    assert resumed.report["steps"] == 3
    # keep_checkpoints=2: step 3's checkpoint, once complete, took step 1's place
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-2", "step-3"]
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "loop_state.json").read_text())
    assert state["step"] == 3
    # the run continued (not restarted): steps 1, 2 from the first run, only step 3 from the resumed one
    assert [m["step"] for m in state["history"] if m["kind"] == "train"] == [1, 2, 3]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if m["kind"] == "train"] == [1, 2, 3]
    # every update reached the engine, and the resumed run continued the first run's policy version
    updates = sum(1 for m in state["history"] if m["kind"] == "train" and not m["skipped"])
    assert updates >= 1 and state["policy_version"] == updates

    # a fresh run (no resume) in the same out_dir: its metrics are its own and a later resume finds its checkpoint,
    # while the earlier run's files are set aside, not deleted
    fresh = GRPO(model, steps=1, **settings)
    _fit(fresh, train, val)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if m["kind"] == "train"] == [1]
    assert latest_checkpoint(tmp_path / "run").name == "step-1"
    (earlier,) = (tmp_path / "run" / "earlier").iterdir()
    lines = [json.loads(line) for line in (earlier / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines if m["kind"] == "train"] == [1, 2, 3]
    assert latest_checkpoint(earlier).name == "step-3"
