"""Credit schemes on hand-built episodes, with the docstring's worked example as exact values."""

from __future__ import annotations

import pytest
from adapter_spans import llm_call, reward

from lightrail.adapters import (
    Discounted,
    Identical,
    IntermediateReward,
    PerTurn,
    build_episode,
    credit_by_name,
    spans_to_transitions,
)
from lightrail.adapters.credit import split_linked


def worked_example():
    spans = [
        llm_call("a", [1], [2]),
        llm_call("b", [1, 2, 3], [4]),
        llm_call("c", [1, 2, 3, 4, 5], [6]),
        reward(0.1, final=False, linked="a"),
        reward(-0.1, final=False, linked="c"),
        reward(0.5, final=False),  # unlinked: no response id
        reward(1.0),
    ]
    return build_episode(spans)


def test_identical_ignores_intermediate():
    e = worked_example()
    assert Identical()(e.calls, 1.0, e.intermediate) == [1.0, 1.0, 1.0]


def test_per_turn_adds_linked_rewards_only():
    e = worked_example()
    assert PerTurn()(e.calls, 1.0, e.intermediate) == pytest.approx([1.1, 1.0, 0.9])
    assert e.report.intermediate_rewards == 3
    assert e.report.unlinked_rewards == 1


def test_per_turn_unlinked_episode_fallback():
    e = worked_example()
    assert PerTurn(unlinked="episode")(e.calls, 1.0, e.intermediate) == pytest.approx([1.6, 1.5, 1.4])


def test_discounted_with_intermediate():
    e = worked_example()
    assert Discounted(gamma=0.5)(e.calls, 1.0, e.intermediate) == pytest.approx([0.325, 0.45, 0.9])


def test_discounted_final_only_is_gamma_power():
    e = worked_example()
    assert Discounted(gamma=0.5)(e.calls, 2.0, []) == pytest.approx([0.5, 1.0, 2.0])
    assert Discounted(gamma=0.5, unlinked="episode")(e.calls, 0.0, [IntermediateReward(value=1.0)]) == (
        pytest.approx([0.25, 0.5, 1.0])
    )


def test_reward_linked_to_unknown_call_is_unlinked():
    spans = [llm_call("a", [1], [2]), reward(0.3, final=False, linked="zzz"), reward(1.0)]
    e = build_episode(spans)
    assert PerTurn()(e.calls, 1.0, e.intermediate) == [1.0]
    assert e.report.unlinked_rewards == 1


def test_one_linking_rule_for_credit_advantages_and_reports():
    e = worked_example()
    linked, unlinked = split_linked(e.calls, e.intermediate)
    assert [(r.value, r.response_id) for r in linked] == [(0.1, "a"), (-0.1, "c")]
    assert [(r.value, r.response_id) for r in unlinked] == [(0.5, None)]
    assert len(unlinked) == e.report.unlinked_rewards


def test_credit_by_name():
    assert credit_by_name("discounted", gamma=0.9) == Discounted(gamma=0.9)
    assert credit_by_name("per_turn") == PerTurn()
    with pytest.raises(ValueError, match="unknown credit"):
        credit_by_name("nope")
    with pytest.raises(ValueError, match="gamma"):
        Discounted(gamma=1.5)


def test_a_registered_credit_assignment_is_a_configs_credit():
    """``credit:`` is checked against the registry (`CREDIT_ASSIGNMENTS`): a scheme registered by a user is a
    config's name at once, its ``credit_args`` its keyword arguments; an unknown name lists the registered ones."""
    from dataclasses import dataclass

    from lightrail.adapters.credit import CREDIT_ASSIGNMENTS, register_credit_assignment
    from lightrail.algorithms.settings import GRPOSection

    with pytest.raises(
        ValueError, match=r"grpo.credit: expected one of \['identical', 'per_turn', 'discounted'\], got 'last_only'"
    ):
        GRPOSection(credit="last_only")

    @register_credit_assignment("last_only")
    @dataclass(frozen=True)
    class LastOnly:
        scale: float = 1.0

        def __call__(self, calls, final_reward, intermediate):
            return [0.0] * (len(calls) - 1) + [self.scale * final_reward]

    try:
        assert GRPOSection(credit="last_only", credit_args={"scale": 2.0}).credit_scheme() == LastOnly(scale=2.0)
        assert credit_by_name("last_only")(["a", "b"], 1.0, []) == [0.0, 1.0]
        with pytest.raises(ValueError, match="registered already"):
            register_credit_assignment("last_only")(LastOnly)
    finally:
        del CREDIT_ASSIGNMENTS["last_only"]


def test_transitions_carry_per_call_returns_and_rewards_link_by_id_not_order():
    # the reward spans come from another process: their seq says nothing about which call they follow
    spans = [
        reward(0.2, final=False, linked="b", seq=1),
        reward(1.0, seq=2),
        llm_call("a", [1], [2], seq=100),
        llm_call("b", [1, 2, 3], [4], seq=101),
    ]
    transitions, report = spans_to_transitions(spans, credit=PerTurn())
    assert [t.metadata["response_id"] for t in transitions] == ["a", "b"]
    assert [t.reward for t in transitions] == pytest.approx([1.0, 1.2])
    assert report.final_rewards == 1 and report.no_final_reward == 0


def test_last_final_reward_wins_and_missing_final_is_counted():
    e = build_episode([llm_call("a", [1], [2]), reward(0.0), reward(1.0)])
    assert e.final_reward == 1.0 and e.report.final_rewards == 2
    transitions, report = spans_to_transitions([llm_call("a", [1], [2])])
    assert transitions[0].reward == 0.0 and report.no_final_reward == 1
    transitions, _ = spans_to_transitions([llm_call("a", [1], [2])], final_reward=0.7)
    assert transitions[0].reward == 0.7


def test_reward_without_final_flag_is_final_unless_linked():
    e = build_episode([llm_call("a", [1], [2]), reward(0.2, final=None, linked="a"), reward(0.9, final=None)])
    assert e.final_reward == 0.9
    assert [(r.value, r.response_id) for r in e.intermediate] == [(0.2, "a")]
