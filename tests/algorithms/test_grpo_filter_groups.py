"""`GRPO(filter_groups=True)` (DAPO's dynamic sampling) through the real loop: groups whose samples all scored the
same are left out of the update, and more tasks are sampled until enough groups carry a signal."""

from __future__ import annotations

import asyncio
import json

from grpo_helpers import tiny_grpo

from lightrail import MemoryStore, Trainer
from lightrail.engine.models import build_tiny_model
from lightrail.types import Attr

AGENT = "loop_agents:half_constant_agent"  # reward: 1 on even answers, the reply length's parity on odd ones


def test_uniform_groups_are_left_out_and_replaced_by_more_tasks(tmp_path):
    from examples.calculator.data import make_splits

    train, val = make_splits(40, 2, seed=1)
    constant = {t["question"] for t in train if t["answer"] % 2 == 0}
    assert 5 < len(constant) < 35
    store = MemoryStore()
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    grpo = tiny_grpo(model, tmp_path / "run", filter_groups={"max_rounds": 4}, steps=2, tasks_per_step=3)
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=grpo).fit(AGENT, train, val)

    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if m["kind"] == "train"]
    assert len(steps) == 2

    async def read():
        rollouts = [r for r in await store.query_rollouts() if r.mode == "train"]
        trained = set()
        for r in rollouts:
            if any(s.name == Attr.SPAN_TRAINING for s in await store.query_spans(r.rollout_id)):
                trained.add(r.rollout_id)
        return rollouts, trained

    rollouts, trained = asyncio.run(read())
    sampled = [r for r in rollouts if r.task.input["question"] in constant]
    assert sampled, "no constant task was sampled: the test's data does not exercise the filter"
    assert trained and not trained & {r.rollout_id for r in sampled}  # no uniform group reached the update
    for m in steps:
        groups = len({r.task.task_id for r in rollouts if r.metadata["step"] == m["step"]})
        assert groups - m["groups_filtered"] >= 3 or m["sample_rounds"] == 4  # enough groups, or out of rounds
        assert m["sample_rounds"] >= 1 and (m["sample_rounds"] == 1) == (groups == 3)
    assert sum(m["groups_filtered"] for m in steps) >= len({r.task.input["question"] for r in sampled})
    assert len(rollouts) > 2 * 3 * 4  # the filtered groups were replaced by more tasks
