"""Outcome-advantage estimators (grpo, rloo, dr_grpo, reinforce_pp, reinforce_pp_baseline) against hand-computed
numbers, and through `group_advantages` with credit assignment and intermediate rewards.

The groups used below, with their hand computations:

    [1, 0, 0, 1]   mean 1/2, sample std sqrt(1/3)       grpo ±(1/2)/sqrt(1/3) = ±0.8660; dr_grpo ±1/2;
                                                         rloo: 1 − mean(1, 0, 0) = 2/3, 0 − mean(1, 1, 0) = −2/3
    [1, 0, 0]      mean 1/3, sample std sqrt(1/3)       grpo (2/3, −1/3, −1/3)/sqrt(1/3); dr_grpo (2/3, −1/3, −1/3);
                                                         rloo: 1 − 0 = 1, 0 − 1/2 = −1/2 (ties get equal values)
    [2]            a group of one: no baseline          0 for every group estimator
    [3, 3, 3]      std 0                                0 for every group estimator (no division by zero)
"""

from __future__ import annotations

import math

import pytest
from adapter_spans import llm_call, reward

from lightrail.adapters import Identical, PerTurn, build_episode, group_advantages
from lightrail.adapters.advantages import (
    ADVANTAGE_ESTIMATORS,
    leave_one_out,
    outcome_advantages,
    register_advantage_estimator,
    whiten,
)
from lightrail.types import RetryPolicy, Rollout, RolloutStatus, Task

GROUPS = [[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [2.0], [3.0, 3.0, 3.0]]
S = math.sqrt(1 / 3)

EXPECTED = {
    "grpo": [[0.5 / S, -0.5 / S, -0.5 / S, 0.5 / S], [(2 / 3) / S, (-1 / 3) / S, (-1 / 3) / S], [0.0], [0.0] * 3],
    "dr_grpo": [[0.5, -0.5, -0.5, 0.5], [2 / 3, -1 / 3, -1 / 3], [0.0], [0.0] * 3],
    "rloo": [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [1.0, -0.5, -0.5], [0.0], [0.0] * 3],
}


@pytest.mark.parametrize("estimator", sorted(EXPECTED))
def test_group_estimators_by_hand(estimator):
    got = outcome_advantages(GROUPS, estimator, eps=1e-12)
    assert [len(g) for g in got] == [len(g) for g in GROUPS]
    for g, want in zip(got, EXPECTED[estimator], strict=True):
        assert g == pytest.approx(want, abs=1e-9)


def test_grpo_default_is_todays_normalisation_and_std_is_optional():
    # eps = 1e-6 as before: (1/2) / (sqrt(1/3) + 1e-6)
    assert outcome_advantages([[1.0, 0.0]], "grpo")[0][0] == 0.5 / (math.sqrt(0.5) + 1e-6)
    assert outcome_advantages([[3.0, 1.0]], "grpo", scale_by_std=False) == [[1.0, -1.0]]
    # dr_grpo never divides, whatever scale_by_std says
    assert outcome_advantages([[3.0, 1.0]], "dr_grpo", scale_by_std=True) == [[1.0, -1.0]]


def test_leave_one_out_is_the_rescaled_centred_reward():
    r = [4.0, 1.0, 1.0, 2.0]  # mean 2: n / (n - 1) * (r - mean) = 4/3 * (2, -1, -1, 0)
    assert leave_one_out(r) == pytest.approx([8 / 3, -4 / 3, -4 / 3, 0.0])
    assert leave_one_out([7.0]) == [0.0] and leave_one_out([]) == []


def test_reinforce_pp_whitens_over_the_batch_without_a_group_baseline():
    # Flat batch (1, 0, 2): mean 1, Bessel variance (0 + 1 + 1) / 2 = 1, so z = (0, -1, 1) / sqrt(1 + 1e-8).
    got = outcome_advantages([[1.0, 0.0], [2.0]], "reinforce_pp")
    k = 1 / math.sqrt(1 + 1e-8)
    assert got == [[0.0, -k], [k]]
    # A group of one still gets a signal (no group baseline): REINFORCE++ works with one sample per prompt.
    assert got[1][0] > 0.9


def test_reinforce_pp_weights_rollouts_by_their_tokens():
    # Weights (3, 1, 0): N = 4 tokens, mean (3*1 + 0) / 4 = 0.75, variance (3 * 0.0625 + 0.5625) / 3 = 0.25,
    # std 0.5: z = (0.5, -1.5, 2.5) (the rollout without trained tokens does not move the statistics).
    got = outcome_advantages([[1.0, 0.0], [2.0]], "reinforce_pp", tokens=[[3, 1], [0]])
    assert [z for g in got for z in g] == pytest.approx([0.5, -1.5, 2.5], abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens():
    # Centred: (0.5, -0.5), (0) for the group of one, (0, 0) for the tie; batch mean 0, variance 0.5 / 4 = 0.125.
    got = outcome_advantages([[1.0, 0.0], [2.0], [3.0, 3.0]], "reinforce_pp_baseline")
    r2 = math.sqrt(2)
    assert got == [pytest.approx([r2, -r2], abs=1e-6), [0.0], [0.0, 0.0]]


def test_whitening_edge_cases():
    assert outcome_advantages([[1.0, 1.0], [1.0]], "reinforce_pp") == [[0.0, 0.0], [0.0]]  # std 0: all zero
    assert outcome_advantages([[5.0]], "reinforce_pp") == [[0.0]]  # one token/rollout: nothing to compare
    assert whiten([]) == []
    with pytest.raises(ValueError, match="one weight per value"):
        whiten([1.0, 2.0], [1])


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError, match=r"advantage: expected one of .*'rloo'.*got 'rlooo'"):
        outcome_advantages([[1.0]], "rlooo")
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "gae"}
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is registered already"):
        register_advantage_estimator("grpo")(lambda groups, options: [list(g) for g in groups])


def test_every_list_of_estimator_names_is_the_registrys():
    """The settings check, verl's mapping and the critic switch read the registry: a name registered in a test is
    accepted by each at once, and refused again once it is gone."""
    from lightrail.algorithms.settings import GRPOSection
    from lightrail.trainer.verl_compat import verl_settings

    with pytest.raises(ValueError, match=r"grpo.advantage: expected one of \['grpo', .*'gae'\], got 'opo'"):
        GRPOSection(advantage="opo")
    register_advantage_estimator("opo", verl="opo")(lambda groups, options: [[0.0] * len(g) for g in groups])
    try:
        assert GRPOSection(advantage="opo").critic is False and GRPOSection(advantage="gae").critic is True
        assert verl_settings({"algorithm": {"adv_estimator": "opo"}}).grpo["advantage"] == "opo"
        assert outcome_advantages([[1.0, 0.0]], "opo") == [[0.0, 0.0]]
    finally:
        del ADVANTAGE_ESTIMATORS["opo"]
    with pytest.raises(ValueError, match="algorithm.adv_estimator.*lightrail's estimators are grpo, rloo"):
        verl_settings({"algorithm": {"adv_estimator": "opo"}})


# -- through group_advantages: credit assignment and intermediate rewards on top of z_i --------------------------


def rollout(rid: str, task: str) -> Rollout:
    return Rollout(
        rollout_id=rid,
        task=Task(input={}, task_id=task),
        mode="train",
        sample_index=0,
        resources_version=None,
        policy=RetryPolicy(),
        status=RolloutStatus.SUCCEEDED,
        created_at=0.0,
    )


def episode(rid: str, calls: list[str], final: float, linked: dict[str, float] | None = None):
    """One response token per call; ``linked`` maps response ids to intermediate rewards."""
    ids = dict(rollout_id=rid, attempt_id=f"{rid}-a1")
    spans = [llm_call(resp, [1, i], [2 + i], agent="s", **ids) for i, resp in enumerate(calls)]
    spans += [reward(v, final=False, linked=resp, **ids) for resp, v in (linked or {}).items()]
    spans.append(reward(final, **ids))
    return build_episode(spans)


def adv(transitions) -> dict[str, float]:
    return {t.metadata["response_id"]: t.advantage for t in transitions}


@pytest.mark.parametrize("estimator", list(ADVANTAGE_ESTIMATORS))
def test_every_estimator_keeps_credit_and_centred_intermediate_rewards(estimator):
    """z_i from the estimator; PerTurn credit adds the +0.1 (centred by the group's mean 0.1 / 3) to call a only."""
    items = [
        (rollout("r1", "A"), episode("r1", ["a", "b"], 1.0, {"a": 0.1})),
        (rollout("r2", "A"), episode("r2", ["c"], 0.0)),
        (rollout("r3", "A"), episode("r3", ["d"], 0.0)),
    ]
    transitions, report = group_advantages(items, PerTurn(), estimator=estimator)
    tokens = [[2, 1, 1]] if estimator.startswith("reinforce_pp") else None
    z = outcome_advantages([[1.0, 0.0, 0.0]], estimator, tokens=tokens)[0]
    assert adv(transitions) == pytest.approx({"a": z[0] + 0.1 - 0.1 / 3, "b": z[0], "c": z[1], "d": z[2]})
    # Raw returns are the estimator-independent outcome plus the uncentred reward.
    assert {t.metadata["response_id"]: t.reward for t in transitions} == pytest.approx(
        {"a": 1.1, "b": 1.0, "c": 0.0, "d": 0.0}
    )
    assert (report.groups, report.rollouts) == (1, 3)


def test_reinforce_pp_counts_the_trained_tokens_of_each_rollout():
    """Group A: r1 (two calls = 2 tokens, outcome 1), r2 (1 token, 0); group B: r3 (1 token, 1).
    Token-weighted batch: N = 4, mean 3/4, variance (2/16 + 9/16 + 1/16) / 3 = 1/4, std 1/2 → (0.5, -1.5, 0.5)."""
    items = [
        (rollout("r1", "A"), episode("r1", ["a", "b"], 1.0)),
        (rollout("r2", "A"), episode("r2", ["c"], 0.0)),
        (rollout("r3", "B"), episode("r3", ["d"], 1.0)),
    ]
    transitions, report = group_advantages(items, Identical(), estimator="reinforce_pp")
    assert adv(transitions) == pytest.approx({"a": 0.5, "b": 0.5, "c": -1.5, "d": 0.5}, abs=1e-6)
    assert report.singleton_groups == 1


def test_the_default_estimator_is_unchanged():
    items = [
        (rollout("r1", "A"), episode("r1", ["a", "b"], 1.0, {"a": 0.1})),
        (rollout("r2", "A"), episode("r2", ["c"], 0.0)),
    ]
    default, _ = group_advantages(items, PerTurn())
    explicit, _ = group_advantages(items, PerTurn(), estimator="grpo")
    assert adv(default) == adv(explicit)
    h = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv(default) == pytest.approx({"a": h + 0.1 - 0.05, "b": h, "c": -h})
