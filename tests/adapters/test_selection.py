"""Infrastructure exclusion: only policy outcomes with data are trained; the rest is counted by reason."""

from __future__ import annotations

from adapter_spans import llm_call

from lightrail.adapters import build_episode, select_trainable
from lightrail.types import RetryPolicy, Rollout, RolloutStatus, Task


def rollout(rid: str, status: RolloutStatus, mode: str = "train") -> Rollout:
    return Rollout(
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
        rollout("raised", S.FAILED),  # the agent's own failure: a real outcome
        rollout("slow", S.TIMEOUT),
        rollout("infra", S.INFRA_ERROR),
        rollout("infra2", S.INFRA_ERROR),
        rollout("cancel", S.CANCELLED),
        rollout("run", S.RUNNING),
        rollout("val", S.SUCCEEDED, mode="val"),
    ]
    kept, excluded = select_trainable(rollouts)
    assert [r.rollout_id for r in kept] == ["ok", "raised", "slow"]
    assert excluded.counts == {"infra_error": 2, "cancelled": 1, "not_finished": 1, "validation": 1}
    assert excluded.rollout_ids["infra_error"] == ["infra", "infra2"]
    assert excluded.total == 5
    kept, excluded = select_trainable(rollouts, modes=("train", "val"))
    assert [r.rollout_id for r in kept] == ["ok", "raised", "slow", "val"]


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
