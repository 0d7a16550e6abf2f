"""The run guard's drills: a GRPO run on the tiny model, through the real trainer, gateway, engine, store and runners,
with one fault planted in the agent or the settings. Each is caught at the step it happens, with a one-line cause,
and a run that keeps training nothing stops (`RunStopped`) instead of exiting as if it had trained."""

from __future__ import annotations

import io
import json

import msgspec
import pytest
from rich.console import Console

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import UpdateConfig
from lightrail.algorithms.grpo import GRPO
from lightrail.algorithms.run.guard import RunGuard, RunStopped, StepHealth
from lightrail.algorithms.settings import GuardSection
from lightrail.engine.models import build_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("guard") / "model", size="tiny", seed=0)


TASKS = [{"question": f"{a} + {a} = ?", "answer": 2 * a} for a in range(1, 9)]


def _grpo(model, out_dir, **overrides) -> GRPO:
    settings = dict(
        config=UpdateConfig(lr=1e-3), steps=3, tasks_per_step=2, n_samples=4, validate_before=False,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        val_every=0, checkpoint_every=0, out_dir=out_dir, guard={"max_empty_steps": 2},
    )  # fmt: skip
    return GRPO(model, **{**settings, **overrides})


def _fit(grpo: GRPO, agent: str) -> None:
    Trainer(n_runners=1, concurrency=8, store=MemoryStore(), algorithm=grpo).fit(agent, TASKS, [])


def _train_lines(out_dir) -> list[dict]:
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["kind"] in ("train", "stop")]


def test_an_agent_that_raises_in_every_rollout_stops_the_run_and_is_never_trained_as_zero(model, tmp_path, capsys):
    grpo = _grpo(model, tmp_path / "run")
    with pytest.raises(RunStopped) as stopped:
        _fit(grpo, "guard_agents:raising_agent")
    cause = str(stopped.value)
    assert cause.startswith("GRPO step 2: 2 steps in a row trained nothing: every rollout failed (8 failed)"), cause
    assert "8x NameError: name 'expected_answer' is not defined" in cause
    lines = _train_lines(tmp_path / "run")
    steps = [m for m in lines if m["kind"] == "train"]
    assert [m["step"] for m in steps] == [1, 2]  # step 3 never ran
    for m in steps:  # the failures are counted, excluded, and nothing was trained on them
        assert m["rollouts_failed"] == 8 and m["excluded_failed"] == 8 and m["transitions_trained"] == 0
        assert m["rollouts_trainable"] == 0 and m["calls"] == 8
    assert lines[-1] == {"kind": "stop", "step": 2, "cause": cause}
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
    out = capsys.readouterr().out
    # caught at step 1, the step it happened, with its cause
    assert "GRPO step 1 trained nothing: every rollout failed (8 failed): 8x NameError" in out.replace("\n", " ")


def test_failed_rollouts_train_with_an_explicit_failure_reward(model, tmp_path):
    """``guard.failure_reward`` is the opt-in: the failures are kept at that reward (and, all equal, carry no signal,
    which the guard reports as such rather than as failures)."""
    grpo = _grpo(model, tmp_path / "run", guard={"max_empty_steps": 1, "failure_reward": -1.0})
    with pytest.raises(RunStopped, match="no learning signal.*rewards seen: -1"):
        _fit(grpo, "guard_agents:raising_agent")
    (step,) = [m for m in _train_lines(tmp_path / "run") if m["kind"] == "train"]
    assert step["rollouts_trainable"] == 8 and step.get("excluded_failed", 0) == 0 and step["reward_values"] == 1


def test_a_constant_reward_is_caught_at_the_first_step(model, tmp_path, capsys):
    grpo = _grpo(model, tmp_path / "run")
    with pytest.raises(RunStopped, match="no learning signal"):
        _fit(grpo, "guard_agents:constant_agent")
    out = capsys.readouterr().out.replace("\n", " ")
    assert "GRPO step 1 trained nothing: no learning signal" in out and "rewards seen: 0.5" in out


def test_a_nan_reward_fails_the_rollout_with_its_cause(model, tmp_path):
    grpo = _grpo(model, tmp_path / "run", guard={"max_empty_steps": 1})
    with pytest.raises(RunStopped, match="GRPO step 1: .*ValueError: reward must be a finite number, got nan"):
        _fit(grpo, "guard_agents:nan_agent")


def test_a_selection_that_matches_nothing_is_an_error_at_the_first_step_naming_the_agents_seen(model, tmp_path):
    # agents_pattern is a full match: 'write|rewrite' selects no call named 'write_query'
    grpo = _grpo(model, tmp_path / "run", agents_pattern="write|rewrite", guard={"max_empty_steps": 0})
    with pytest.raises(RunStopped) as stopped:
        _fit(grpo, "guard_agents:writer_agent")
    assert str(stopped.value) == (
        "GRPO step 1: agents_pattern 'write|rewrite' matches no call; the calls were made by ['write_query']"
    )


def test_main_llm_is_published_and_an_unpublished_resource_is_named(model, tmp_path):
    """An agent written as Agent Lightning's walkthrough writes it (``resources["main_llm"]``) trains; one asking for
    a resource nobody published fails with a line naming the published ones."""
    grpo = _grpo(model, tmp_path / "ok", steps=1)
    _fit(grpo, "guard_agents:MainLLMAgent")
    (step,) = [m for m in _train_lines(tmp_path / "ok") if m["kind"] == "train"]
    assert step["rollouts_succeeded"] == 8 and step["calls_selected"] == 8

    grpo = _grpo(model, tmp_path / "judge", guard={"max_empty_steps": 1})
    with pytest.raises(RunStopped) as stopped:
        _fit(grpo, "guard_agents:JudgeAgent")
    assert (
        "8x ResourceNotPublished: resource 'judge' was not published; the resources of this rollout are 'llm', "
        "'main_llm'" in str(stopped.value)
    )


def test_a_sampling_typo_is_refused_when_the_settings_are_made(model, tmp_path):
    with pytest.raises(
        ValueError, match=r"grpo.sampling: unknown setting\(s\) \['max_token'\]; did you mean 'max_tokens'"
    ):
        _grpo(model, tmp_path / "run", sampling={"max_token": 16})


def test_a_healthy_run_reports_its_health_and_raises_no_alarm(model, tmp_path, capsys):
    grpo = _grpo(model, tmp_path / "run", steps=2, guard={"max_empty_steps": 1}, n_samples=8)
    _fit(grpo, "guard_agents:parity_agent")
    steps = [m for m in _train_lines(tmp_path / "run") if m["kind"] == "train"]
    assert len(steps) == 2
    for m in steps:
        assert m["rollouts_succeeded"] == 16 and m["rollouts_failed"] == 0 and m["calls_per_rollout"] == 1.0
        assert m["calls_with_token_ids"] == 16 == m["calls_selected"] and m["update_finite"] is True
        assert m["transitions_trained"] > 0 and m["groups_with_spread"] >= 1
    assert "trained nothing" not in capsys.readouterr().out


def test_the_async_pipeline_stops_the_same_way(model, tmp_path):
    """``grpo.async`` trains from the same step function: a failing agent stops it at the same step, while the
    batches sampling ahead are cancelled with the run."""
    grpo = _grpo(model, tmp_path / "run", async_=True, steps=4)
    with pytest.raises(RunStopped, match=r"^GRPO step 2: 2 steps in a row trained nothing: every rollout failed"):
        _fit(grpo, "guard_agents:raising_agent")


def _checked(guard, *records) -> str:
    """Run ``guard.check`` on each `StepHealth` (no rollout failed, so no store is read); what it printed."""
    import asyncio

    for health in records:
        asyncio.run(guard.check(None, health, [], stage="GRPO step"))
    return guard.console.file.getvalue().replace("\n", " ")


def _step(step: int, spread: int, rewards: list[float]) -> StepHealth:
    return StepHealth(
        step=step, rollouts=8, succeeded=8, trainable=8, calls=8, calls_with_token_ids=8, calls_selected=8,
        reward_values=len(rewards), rewards_seen=rewards, groups=2, groups_with_spread=spread,
        transitions=8 if spread else 0,
    )  # fmt: skip


def test_a_run_that_learned_to_solve_its_tasks_is_not_stopped_as_empty():
    """A healthy run that converged (every sample of every group succeeds: no spread left) is told so, and goes on;
    the same steps in a run that never had a signal (a reward constant from the start) are empty steps, and stop."""
    console = Console(file=io.StringIO(), width=400)
    guard = RunGuard(GuardSection(max_empty_steps=2), console=console, success_threshold=1.0)
    out = _checked(guard, _step(1, 2, [0.0, 1.0]), *(_step(s, 0, [1.0]) for s in (2, 3, 4)))
    assert "GRPO step 4: every sample of every group succeeded (rewards seen: 1)" in out and "nothing" in out
    assert "trained nothing" not in out and guard.empty_steps == 0

    never = RunGuard(GuardSection(max_empty_steps=2), console=Console(file=io.StringIO()), success_threshold=1.0)
    with pytest.raises(RunStopped, match="GRPO step 2: 2 steps in a row trained nothing: no learning signal"):
        _checked(never, _step(1, 0, [1.0]), _step(2, 0, [1.0]))
    # a solved step ends a run of empty ones: empty, solved, empty is not "2 in a row"
    mixed = RunGuard(GuardSection(max_empty_steps=2), console=Console(file=io.StringIO()), success_threshold=1.0)
    _checked(mixed, _step(1, 2, [0.0, 1.0]), _step(2, 0, [0.0]), _step(3, 0, [1.0]), _step(4, 0, [0.0]))
    assert mixed.empty_steps == 1
    # converged but every group at a failing reward (all 0 after learning): that is empty, and stops
    collapsed = RunGuard(GuardSection(max_empty_steps=2), console=Console(file=io.StringIO()), success_threshold=1.0)
    with pytest.raises(RunStopped, match="GRPO step 3: 2 steps in a row trained nothing"):
        _checked(collapsed, _step(1, 2, [0.0, 1.0]), _step(2, 0, [0.0]), _step(3, 0, [0.0]))


def test_the_step_line_says_when_only_the_kl_term_trained():
    """No group had a spread, yet the update ran (``kl_coef > 0`` keeps zero-advantage rows): the line says the
    transitions trained only the KL term, next to the guard's "no learning signal"."""
    assert _step(1, 0, [0.0]).line().endswith("trained 0")
    kl_only = StepHealth(**{**msgspec.structs.asdict(_step(1, 0, [0.0])), "transitions": 96, "kl_term": True})
    assert kl_only.line().endswith("trained 96 (KL term only)") and _step(1, 2, [0.0, 1.0]).line().endswith("trained 8")
    # without a KL penalty the rows that ran had no advantage (skip_zero_advantage_rows off): no such claim
    no_kl = StepHealth(**{**msgspec.structs.asdict(kl_only), "kl_term": False})
    assert no_kl.line().endswith("trained 96")
