"""Group advantages by hand: normalised outcome through the credit assignment, plus raw intermediate rewards."""

from __future__ import annotations

import math

import pytest
from adapter_spans import llm_call, reward

from lightrail.adapters import AgentFilter, Discounted, Identical, PerTurn, build_episode, group_advantages, to_rows
from lightrail.adapters.advantages import normalize_group
from lightrail.types import RetryPolicy, Rollout, RolloutStatus, Task


def rollout(rid: str, task: str, reward_: float | None = None) -> Rollout:
    return Rollout(
        rollout_id=rid,
        task=Task(input={}, task_id=task),
        mode="train",
        sample_index=0,
        resources_version=None,
        policy=RetryPolicy(),
        status=RolloutStatus.SUCCEEDED,
        created_at=0.0,
        reward=reward_,
    )


def episode(rid: str, calls: list[tuple[str, str]], final: float | None, linked: dict[str, float] | None = None):
    """Calls are (response id, agent) pairs; ``linked`` maps response ids to intermediate rewards."""
    ids = dict(rollout_id=rid, attempt_id=f"{rid}-a1")
    spans = [llm_call(resp, [1, i], [2 + i], agent=agent, **ids) for i, (resp, agent) in enumerate(calls)]
    spans += [reward(v, final=False, linked=resp, **ids) for resp, v in (linked or {}).items()]
    if final is not None:
        spans.append(reward(final, **ids))
    return build_episode(spans)


def adv(transitions) -> dict[str, float]:
    return {t.metadata["response_id"]: t.advantage for t in transitions}


def test_normalize_group():
    h = math.sqrt(3) / 2  # (1 - 0.5) / sample std sqrt(1/3)
    assert normalize_group([1.0, 0.0, 0.0, 1.0], eps=0.0) == pytest.approx([h, -h, -h, h])
    assert normalize_group([3.0, 1.0], scale_by_std=False) == [1.0, -1.0]
    assert normalize_group([5.0]) == [0.0]
    assert normalize_group([2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]


def test_docstring_example_without_std():
    items = [
        (rollout("r1", "A"), episode("r1", [("a", "s"), ("b", "s")], 1.0, {"a": 0.1})),
        (rollout("r2", "A"), episode("r2", [("c", "s")], 0.0)),
    ]
    transitions, report = group_advantages(items, PerTurn(), scale_by_std=False, center_intermediate=False)
    assert adv(transitions) == pytest.approx({"a": 0.6, "b": 0.5, "c": -0.5})
    # Transition.reward keeps the raw per-call return
    assert {t.metadata["response_id"]: t.reward for t in transitions} == pytest.approx({"a": 1.1, "b": 1.0, "c": 0.0})
    assert (report.groups, report.rollouts, report.zero_std_groups, report.singleton_groups) == (1, 2, 0, 0)
    # the group travels on to the training rows
    rows, _ = to_rows(transitions)
    assert [(r.rollout_id, r.group_id, r.advantages) for r in rows] == [
        ("r1", "A", pytest.approx([0.0, 0.0, 0.6])),
        ("r1", "A", pytest.approx([0.0, 0.0, 0.5])),
        ("r2", "A", pytest.approx([0.0, 0.0, -0.5])),
    ]


def test_std_scales_outcome_but_not_intermediate():
    items = [
        (rollout("r1", "A"), episode("r1", [("a", "s"), ("b", "s")], 1.0, {"a": 0.1})),
        (rollout("r2", "A"), episode("r2", [("c", "s")], 0.0)),
    ]
    transitions, _ = group_advantages(items, PerTurn(), eps=0.0)
    z = 0.5 / math.sqrt(0.5)  # sample std of (1, 0) is sqrt(0.5)
    # +0.1 centred by the group's mean intermediate return (0.05), not scaled by the std
    assert adv(transitions) == pytest.approx({"a": z + 0.05, "b": z, "c": -z})


def test_a_reward_every_sample_earned_carries_no_advantage():
    """All samples called the tool successfully and all failed the task: nothing to learn, so no push (an Adam
    step would turn a uniform +0.1 into a full-size update)."""
    items = [
        (rollout(f"r{i}", "A"), episode(f"r{i}", [(f"t{i}", "s"), (f"x{i}", "s")], 0.0, {f"t{i}": 0.1}))
        for i in range(4)
    ]
    transitions, _ = group_advantages(items, PerTurn())
    assert all(a == pytest.approx(0.0) for a in adv(transitions).values())
    # one sample skips the tool: the callers keep an edge over it (0.1 minus the group's mean of 0.075)
    items[3] = (rollout("r3", "A"), episode("r3", [("x3", "s")], 0.0))
    advantages = adv(group_advantages(items, PerTurn())[0])
    assert advantages["t0"] == pytest.approx(0.1 - 0.075) and advantages["x0"] == 0.0 and advantages["x3"] == 0.0


def test_identical_credit_is_plain_grpo():
    outcomes = [1.0, 0.0, 0.5, 0.5]
    items = [(rollout(f"r{i}", "A"), episode(f"r{i}", [(f"x{i}", "s")], r)) for i, r in enumerate(outcomes)]
    transitions, _ = group_advantages(items, Identical(), eps=1e-6)
    assert [t.advantage for t in transitions] == pytest.approx(normalize_group(outcomes, eps=1e-6))


def test_discounted_credit_discounts_the_normalised_outcome():
    items = [
        (rollout("r1", "A"), episode("r1", [("a", "s"), ("b", "s")], 2.0)),
        (rollout("r2", "A"), episode("r2", [("c", "s")], 0.0)),
    ]
    transitions, _ = group_advantages(items, Discounted(gamma=0.5), scale_by_std=False)
    assert adv(transitions) == pytest.approx({"a": 0.5, "b": 1.0, "c": -1.0})


def test_zero_std_and_singleton_groups_keep_intermediate_signal():
    items = [
        (rollout("r1", "A"), episode("r1", [("a", "s")], 1.0, {"a": 0.1})),
        (rollout("r2", "A"), episode("r2", [("b", "s")], 1.0, {"b": -0.1})),
        (rollout("r3", "B"), episode("r3", [("c", "s")], 0.7, {"c": 0.2})),
    ]
    transitions, report = group_advantages(items, PerTurn())
    assert adv(transitions) == pytest.approx({"a": 0.1, "b": -0.1, "c": 0.2})
    assert (report.groups, report.zero_std_groups, report.singleton_groups) == (2, 1, 1)


def test_outcome_falls_back_to_rollout_reward_then_missing_reward():
    items = [
        (rollout("r1", "A", reward_=1.0), episode("r1", [("a", "s")], None)),
        (rollout("r2", "A"), episode("r2", [("b", "s")], None)),
    ]
    transitions, report = group_advantages(items, Identical(), scale_by_std=False)
    assert adv(transitions) == pytest.approx({"a": 0.5, "b": -0.5})
    assert report.defaulted_rewards == 1


def test_agent_filter_applies_after_credit():
    items = [
        (rollout("r1", "A"), episode("r1", [("a", "planner"), ("b", "solver")], 1.0, {"a": 0.3})),
        (rollout("r2", "A"), episode("r2", [("c", "solver")], 0.0)),
    ]
    transitions, _ = group_advantages(items, PerTurn(), agents=AgentFilter(names={"solver"}), scale_by_std=False)
    assert adv(transitions) == pytest.approx({"b": 0.5, "c": -0.5})
    assert [t.turn for t in transitions] == [1, 0]
