"""One GRPO step through the face: ``agl.Trainer(algorithm=agl.VERL(config), adapter={"agent_match": ...})`` on the
tiny model, with the article's ``resources["main_llm"]`` and the reference's ``identical`` credit."""

from __future__ import annotations

import io
import json

import agl_agents
from rich.console import Console

import lightrail.agl as agl
from lightrail.adapters.credit import credit_by_name
from lightrail.engine.models import build_tiny_model


def test_one_grpo_step_trains_only_the_calls_agent_match_searches_with_identical_credit(tmp_path):
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    config = {
        "algorithm": {"adv_estimator": "grpo"},
        "data": {"train_batch_size": 2, "max_response_length": 4},
        "actor_rollout_ref": {
            "model": {"path": str(model)},
            "rollout": {"n": 4},
            "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}},
        },
        "trainer": {"total_epochs": 1, "val_before_train": False, "test_freq": 0},
    }
    algorithm = agl.VERL(config, out_dir=tmp_path / "run")
    trainer = agl.Trainer(n_runners=1, algorithm=algorithm, adapter={"agent_match": "write|rewrite"},
        initial_resources={"prompt": agl.PromptTemplate(template="write: {{ question }}", engine="jinja")},
                          runs_dir=tmp_path, console=Console(file=io.StringIO()))  # fmt: skip
    trainer.fit(agl_agents.SpiderLikeAgent(), train_dataset=[{"question": "a"}, {"question": "b"}],
                val_dataset=[{"question": "c"}])  # fmt: skip
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [m for m in metrics if m["kind"] == "train"]
    # resources["main_llm"] reached GRPO's policy; the initial prompt template (not published by GRPO) is there too
    assert step["rollouts"] == 8 and step["excluded"] == 0
    # three calls a rollout; check_query is not searched by "write|rewrite" (a full match would take neither)
    assert step["transitions"] == 2 * 8
    assert set(step["mismatch_by_agent"]) == {"write_query", "rewrite_query"}
    assert type(algorithm.credit).__name__ == type(credit_by_name("identical")).__name__
