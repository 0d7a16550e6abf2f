"""What is trained: only rollouts that succeeded with a reward and have data; the rest is counted by reason (and a
raise or a timeout is trained only with an explicit ``failure_reward``, never as a made-up 0)."""

from __future__ import annotations

from adapter_spans import llm_call

from lightrail.adapters import build_episode, select_trainable
from lightrail.types import RetryPolicy, Rollout, RolloutStatus, Task


def rollout(rid: str, status: RolloutStatus, mode: str = "train", reward: float | None = 1.0) -> Rollout:
    return Rollout(
        reward=reward if status is RolloutStatus.SUCCEEDED else None,
        rollout_id=rid,
        task=Task(input={}, task_id="t"),
        mode=mode,  # type: ignore[arg-type]
        sample_index=0,
        resources_version=None,
        policy=RetryPolicy(),
        status=status,
        created_at=0.0,
    )


def ep(rid: str, *spans_args):
    return build_episode(
        [llm_call(*a, rollout_id=rid, attempt_id=f"{rid}-a") for a in spans_args], rollout_id=rid, attempt_id=f"{rid}-a"
    )


def test_status_and_mode_exclusions():
    S = RolloutStatus
    rollouts = [
        rollout("ok", S.SUCCEEDED),
        rollout("raised", S.FAILED),  # the agent raised: no reward of its own
        rollout("slow", S.TIMEOUT),
        rollout("infra", S.INFRA_ERROR),
        rollout("infra2", S.INFRA_ERROR),
        rollout("cancel", S.CANCELLED),
        rollout("run", S.RUNNING),
        rollout("val", S.SUCCEEDED, mode="val"),
        rollout("silent", S.SUCCEEDED, reward=None),  # returned None, emitted nothing
        rollout("nan", S.SUCCEEDED, reward=float("nan")),
    ]
    kept, excluded = select_trainable(rollouts)
    assert [r.rollout_id for r in kept] == ["ok"]
    assert excluded.counts == {
        "failed": 1, "timeout": 1, "infra_error": 2, "cancelled": 1, "not_finished": 1, "validation": 1,
        "no_reward": 1, "non_finite_reward": 1,
    }  # fmt: skip
    assert excluded.rollout_ids["infra_error"] == ["infra", "infra2"]
    assert excluded.total == 9
    kept, excluded = select_trainable(rollouts, modes=("train", "val"))
    assert [r.rollout_id for r in kept] == ["ok", "val"]


def test_failures_are_trained_only_with_an_explicit_failure_reward():
    """With ``failure_reward`` a raise and a timeout are kept, and `group_advantages` scores them with it (not 0)."""
    from lightrail.adapters import group_advantages

    S = RolloutStatus
    rollouts = [rollout("ok", S.SUCCEEDED, reward=1.0), rollout("raised", S.FAILED), rollout("slow", S.TIMEOUT)]
    kept, excluded = select_trainable(rollouts, failure_reward=-0.5)
    assert [r.rollout_id for r in kept] == ["ok", "raised", "slow"] and excluded.total == 0
    episodes = {r: ep(r, ("a", [1], [2])) for r in ("ok", "raised", "slow")}
    transitions, _ = group_advantages(((r, episodes[r.rollout_id]) for r in kept), failure_reward=-0.5)
    assert [t.reward for t in transitions] == [1.0, -0.5, -0.5]


def test_data_exclusions_with_episodes():
    S = RolloutStatus
    rollouts = [rollout(r, S.SUCCEEDED) for r in ("good", "partial", "noids", "nocalls", "nospans")]
    episodes = {
        "good": ep("good", ("a", [1], [2])),
        "partial": ep("partial", ("a", [1], [2]), ("b", None, [3])),
        "noids": ep("noids", ("a", None, [2]), ("b", [1], None)),
        "nocalls": ep("nocalls"),
    }
    kept, excluded = select_trainable(rollouts, episodes)
    assert [r.rollout_id for r in kept] == ["good", "partial"]
    assert excluded.counts == {"missing_token_ids": 1, "no_llm_calls": 1, "no_spans": 1}
