"""What the showcase-agent tests share: `lightrail train` overrides for one tiny GRPO step or a shortened SFT-then-GRPO
recipe, and that step's metrics."""

from __future__ import annotations

import json
from typing import Any

ONE_TINY_STEP = ["model=tiny", "grpo.steps=1", "grpo.tasks_per_step=2", "grpo.n_samples=2", "grpo.val_every=0"]
"""The tiny random model, one step of 2 tasks × 2 samples, validation only before and after."""

SHORT_RECIPE = [
    "model=tiny",
    "sft.steps=2",
    "sft.batch_size=4",
    "sft.val_sampling={temperature: 0.0, max_tokens: 16}",
    "trainer.n_runners=1",
    "trainer.concurrency=4",
    "grpo.steps=1",
    "grpo.tasks_per_step=2",
    "grpo.n_samples=2",
    "grpo.checkpoint_every=0",
    "grpo.sampling={temperature: 1.0, max_tokens: 16}",
    "grpo.val_sampling={temperature: 0.0, max_tokens: 16}",
]
"""A config's ``[sft, grpo]`` recipe shortened: the tiny random model, 2 SFT steps of 4 rows, one runner of 4
rollouts, one GRPO step of 2 tasks × 2 samples, 16-token answers, no checkpoint."""


def train_step_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The one ``train`` line of a run's ``metrics.jsonl`` (fails unless there is exactly one)."""
    with open(report["metrics"], encoding="utf-8") as f:
        (step,) = [m for m in map(json.loads, f) if m["kind"] == "train"]
    return step


def assert_the_recipe_learns(config_path, out_dir, *, n_val: int, sft_floor: float, overrides=()) -> dict[str, Any]:
    """Run a showcase's ``[sft, grpo]`` recipe (``config_path``) reduced to fit a slow test: its SFT stage as
    configured, then 4 GRPO steps of 8 tasks × 4 samples, validated on ``n_val`` held-out tasks. Held-out success
    must go up twice: the untrained model solves none, SFT through the agent's own framework reaches ``sft_floor``,
    and GRPO ends above the start it measured in the same run (the SFT model's score; the full recipe's GRPO figures
    are ``bench/showcases.py``'s). Returns the run's report."""
    from lightrail.trainer.config import load_config, train

    config = load_config(
        config_path,
        overrides=[
            f"out_dir={out_dir}",
            f"data_args.n_val={n_val}",
            "sft.validate_before=true",
            "grpo.steps=4",
            "grpo.tasks_per_step=8",
            "grpo.n_samples=4",
            "grpo.checkpoint_every=0",
            *overrides,
        ],
    )
    report = train(config).report
    sft = report["stages"]["sft"]
    assert sft["val_before"] == 0.0 and sft["val_after"] >= sft_floor, sft
    assert report["steps"] == 4 and report["val_after"] > report["val_before"], report
    return report


async def episodes_of(store_path) -> list[tuple[Any, Any]]:
    """Every rollout of a run's SQLite store with its episode (its spans assembled), in the store's order."""
    from lightrail.adapters import build_episode
    from lightrail.store.sqlite import SQLiteStore

    store = SQLiteStore(str(store_path))
    try:
        return [(r, build_episode(await store.query_spans(r.rollout_id))) for r in await store.query_rollouts()]
    finally:
        await store.close()


def request_model(call) -> str:
    """The model name an episode's call asked the gateway for (``teacher``: the SFT stage's teacher program)."""
    from lightrail.types import Attr

    request = call.span.attributes[Attr.REQUEST]
    return (json.loads(request) if isinstance(request, str) else request)["model"]


def assert_sft_trained_every_teacher_call(report: dict[str, Any], run_dir, *, rollouts: int, calls: int) -> None:
    """A shortened recipe's SFT stage (2 steps) kept every teacher chat, right or wrong, and trained every call of
    them (``min_reward: null``, every agent of the chats in ``sft.agents``)."""
    sft = report["stages"]["sft"]
    assert sft["kept_rollouts"] == rollouts and sft["steps"] == 2
    with open(f"{run_dir}/sft/metrics.jsonl", encoding="utf-8") as f:
        (data,) = [m for m in map(json.loads, f) if m["kind"] == "data"]
    assert (data["calls_trained"], data["calls_other_agents"]) == (calls, 0)


def policy_overrides(policies: dict[str, list[str]], agent: str) -> list[str]:
    """`lightrail train` overrides for one tiny GRPO step with ``grpo.policies`` (one LoRA adapter per policy) on
    ``agent``, a showcase wrapped to be scored by its sample's parity (``showcase_by_sample.py``: every group of two
    samples carries an advantage, so every policy updates)."""
    mapping = ", ".join(f"{name}: [{', '.join(agents)}]" for name, agents in policies.items())
    return [
        *ONE_TINY_STEP,
        "algorithm=grpo",
        f"agent={agent}",
        "grpo.agents=null",
        f"grpo.policies={{{mapping}}}",
        "grpo.config={lr: 1.0e-2, lora: {r: 4}}",
    ]


async def assert_each_call_served_and_trained_by_its_agents_policy(
    report: dict[str, Any], store_path, policies: dict[str, list[str]], agent_of
) -> dict[str, Any]:
    """One GRPO step with ``policies`` (``{policy: [agent, ...]}``) ran through a showcase's framework: no call was
    misrouted; every call was made by the agent ``agent_of(call)`` reads off its prompt (independent of the
    OpenTelemetry path), which the runner named on the request; every answered call was served by that agent's policy
    (the response model ``policy-<policy>``) at version 0, or 1 for the held-out calls after the step; every policy
    updated once, on exactly the answered calls of its agents in the step's rollouts, and the training spans name,
    for every call trained, its agent's policy. Returns the step's metrics."""
    from lightrail.adapters import build_episode
    from lightrail.store.sqlite import SQLiteStore
    from lightrail.types import Attr

    policy_of = {agent: name for name, agents in policies.items() for agent in agents}
    step = train_step_metrics(report)
    assert (step["misrouted"], step["excluded"]) == (0, 0), step
    in_step: dict[str, set[str]] = {name: set() for name in policies}
    trained = []
    store = SQLiteStore(str(store_path))
    try:
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id)
            for call in build_episode(spans).calls:
                a = call.span.attributes
                agent = agent_of(call)
                assert (a[Attr.CALLER_AGENT], call.agent_name) == (agent, agent)
                if call.prompt_ids is None:
                    continue  # refused (a prompt past the tiny model's context): nothing was served
                policy = policy_of[agent]
                after = rollout.mode == "val" and rollout.metadata.get("step") == 1
                served = (a[Attr.RESPONSE_MODEL], a[Attr.POLICY_VERSION])
                assert served == (f"policy-{policy}", int(after)), (agent, rollout.mode, served)
                if rollout.mode == "train":
                    in_step[policy].add(call.response_id)
            trained += [c for s in spans if s.name == Attr.SPAN_TRAINING for c in s.attributes[Attr.TRAINING_CALLS]]
    finally:
        await store.close()
    for name in policies:
        assert step[f"{name}/transitions"] == len(in_step[name]) > 0, (name, step)
        assert (step[f"{name}/policy_version"], step[f"{name}/skipped"]) == (1, False), (name, step)
        assert {c["response_id"] for c in trained if c["policy"] == name} == in_step[name]
    assert all(c["policy"] == policy_of[c["agent"]] for c in trained)
    assert step["transitions"] == sum(len(ids) for ids in in_step.values()) == len(trained)
    return step
