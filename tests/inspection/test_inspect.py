"""``lightrail runs | rollouts | show | failures`` on a SQLite store filled by a real GRPO run (tiny model, gateway,
runner process), and the failure digest GRPO prints at each validation."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from lightrail.cli import main
from lightrail.inspection.runs import derive_runs
from lightrail.store.sqlite import SQLiteStore
from lightrail.types import Attr, RetryPolicy, Rollout, RolloutSpec, RolloutStatus, Task

TRAIN = [{"question": "1+1"}, {"question": "2+2"}]
VAL = [{"question": "3+3"}, {"question": "4+4", "fail": 7}, {"question": "5+5", "fail": 9}, {"question": "6+6"}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One GRPO step with validation before and after (2 of 4 val tasks raise), then two rollouts tagged with a
    run id enqueued by hand (nobody runs them). Yields the store path and what GRPO printed."""
    from lightrail import Trainer
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO
    from lightrail.engine.models import build_tiny_model

    root = tmp_path_factory.mktemp("inspect")
    model = build_tiny_model(root / "model", size="tiny", seed=0)
    grpo = GRPO(
        model, steps=1, tasks_per_step=2, n_samples=2, val_every=0, checkpoint_every=0, config=UpdateConfig(lr=1e-3),
        sampling={"temperature": 1.0, "max_tokens": 6}, val_sampling={"temperature": 0.0, "max_tokens": 6},
        out_dir=root / "run",
    )  # fmt: skip
    store = root / "run" / "store.db"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        Trainer(n_runners=1, concurrency=4, store=str(store), algorithm=grpo).fit(
            "tests.inspection.inspect_agents:chatty", TRAIN, VAL
        )

    async def tag() -> None:
        db = SQLiteStore(store)
        specs = [RolloutSpec(task=Task(input=i), metadata={"run": "probe"}, rollout_id=f"ro-probe-{i}") for i in (1, 2)]
        await db.enqueue(specs)
        await db.close()

    asyncio.run(tag())
    return store, printed.getvalue()


def stored(store) -> tuple[list[Rollout], dict[str, list]]:
    """Every rollout of the store and the attempts of each, read through the store API."""

    async def read():
        db = SQLiteStore(store)
        try:
            rollouts = await db.query_rollouts()
            return rollouts, {r.rollout_id: await db.query_attempts(r.rollout_id) for r in rollouts}
        finally:
            await db.close()

    return asyncio.run(read())


def lightrail(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_grpo_prints_the_failure_digest_at_each_validation(run):
    _, printed = run
    for step in (0, 1):  # before training and after the one step
        assert f"GRPO validation at step {step}: held-out success " in printed, printed  # the figure, each time
        assert "tasks); failure digest: 2 attempts in 1 group" in printed, printed
    assert "2x failed in 2 rollouts  ValueError: bad question <n> in <str>" in printed


def test_runs_lists_the_training_session_and_the_tagged_run(run, capsys):
    store, _ = run
    rollouts, _ = stored(store)
    training = [r for r in rollouts if r.metadata["run"] != "probe"]
    assert {r.metadata["run"] for r in training} == {str(store.parent)}  # the trainer tags its rollouts
    assert len(training) == 2 * 2 + 2 * len(VAL)  # one step of 2 tasks x 2 samples, two validations
    code, out, _ = lightrail(capsys, "runs", "--store", str(store))
    assert code == 0
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert set(lines) == {"1", "2"}
    first = [cell.strip() for cell in lines["1"].split("│")[1:-1]]
    failed = sum(r.status is RolloutStatus.FAILED for r in training)
    assert first[1] == str(store.parent) and first[4] == str(len(training))
    assert first[5] == f"{len(training) - failed} succeeded, {failed} failed" and failed == 4
    assert first[6] == "8 val, 4 train"
    versions = sorted({r.resources_version for r in training})
    assert first[8] == f"v{versions[0]}..v{versions[-1]}"
    second = [cell.strip() for cell in lines["2"].split("│")[1:-1]]
    assert second[1] == "probe" and second[4] == "2" and second[5] == "2 queued"


def test_rollouts_pages_failed_rollouts_newest_first_with_their_errors(run, capsys):
    store, _ = run
    rollouts, attempts = stored(store)
    failed = [r for r in rollouts if r.status is RolloutStatus.FAILED][::-1]
    code, out, _ = lightrail(capsys, "rollouts", "--store", str(store), "--status", "failed", "--limit", "3")
    assert code == 0
    shown = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ro-")]
    assert shown == [r.rollout_id for r in failed[:3]]
    for r in failed[:3]:
        error = attempts[r.rollout_id][-1].error
        assert f"ValueError: {error.message}" in out
    assert "1-3 of 4 failed rollouts, newest first; --offset 3 for the next 1" in out

    code, out, _ = lightrail(capsys, "rollouts", "--store", str(store), "--status", "failed", "--offset", "3")
    assert [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ro-")] == [
        failed[3].rollout_id
    ]
    code, out, _ = lightrail(capsys, "rollouts", "--store", str(store), "--run", "1", "--mode", "train")
    train = [r.rollout_id for r in rollouts if r.mode == "train" and r.metadata["run"] != "probe"][::-1]
    assert [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ ro-")] == train
    code, out, _ = lightrail(capsys, "rollouts", "--store", str(store), "--run", "probe")
    assert "ro-probe-2" in out and "ro-probe-1" in out and "1-2 of 2 rollouts of run probe" in out


def test_show_prints_attempts_span_tree_traceback_and_messages(run, capsys):
    store, _ = run
    rollouts, attempts = stored(store)
    failed = next(r for r in rollouts if r.status is RolloutStatus.FAILED)

    async def spans(rollout_id):
        db = SQLiteStore(store)
        try:
            return await db.query_spans(rollout_id)
        finally:
            await db.close()

    code, out, _ = lightrail(capsys, "show", failed.rollout_id, "--store", str(store))
    assert code == 0
    attempt = attempts[failed.rollout_id][-1]
    assert f"rollout {failed.rollout_id}  failed" in out and attempt.attempt_id in out
    assert f"task {failed.task.task_id}: " in out and '"fail": ' in out
    assert f"spans of attempt 1 ({len(await_(spans(failed.rollout_id)))})" in out
    assert "rollout attempt 1 failed on " in out
    assert out.count("llm call chat.completions  model policy") == 2
    assert "event answered" in out and f"exception ValueError: {attempt.error.message}" in out
    assert "traceback" in out and "raise ValueError" in out
    # the conversation, the resent history not repeated: system, user, answer, user, answer
    calls = [s for s in await_(spans(failed.rollout_id)) if s.name == Attr.SPAN_LLM_CALL]
    messages = out[out.index("messages\n") :]
    answers = [c.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"] for c in calls]
    assert messages.count("system: You add numbers.") == 1 and messages.count("user: Are you sure?") == 1
    assert "(a new conversation)" not in messages
    for answer in answers:  # whitespace-only answers (a random tiny model) are shown quoted
        assert f"assistant: {answer if answer.strip() else json.dumps(answer)}" in messages or not answer

    ok = next(r for r in rollouts if r.status is RolloutStatus.SUCCEEDED and r.mode == "train")
    code, out, _ = lightrail(capsys, "show", ok.rollout_id, "--store", str(store))
    assert code == 0 and f"reward = {ok.reward} (final)" in out and "traceback" not in out

    code, out, err = lightrail(capsys, "show", "ro-nope", "--store", str(store))
    assert code == 1 and "ro-nope" in err
    code, out, err = lightrail(capsys, "show", ok.rollout_id, "--attempt", "2", "--store", str(store))
    assert code == 1 and "has attempts [1], not 2" in err


def await_(coro):
    return asyncio.run(coro)


def test_failures_digests_the_store_or_one_run(run, capsys):
    store, _ = run
    code, out, _ = lightrail(capsys, "failures", "--store", str(store))
    assert code == 0
    assert f"failure digest of {store}: 4 attempts in 1 group" in out
    assert "4x failed in 4 rollouts  ValueError: bad question <n> in <str>" in out
    code, out, _ = lightrail(capsys, "failures", "--store", str(store), "--run", "2")
    assert "failure digest of run 2: no failed attempts" in out
    code, out, _ = lightrail(capsys, "failures", "--store", str(store), "--limit", "1")
    assert "1 attempt in 1 group" in out and "from the newest 1 of 4 rollouts that failed or were retried" in out


def test_store_from_the_environment_or_a_run_directory_as_a_subprocess(run):
    store, _ = run
    env = {**os.environ, "LIGHTRAIL_STORE": str(store.parent), "COLUMNS": "250"}
    done = subprocess.run(
        [sys.executable, "-m", "lightrail", "rollouts", "--status", "succeeded,failed", "--limit", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout  # piped: plain text
    assert "1-1 of 12 succeeded/failed rollouts" in done.stdout


def test_bad_arguments_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LIGHTRAIL_STORE", raising=False)
    code, _, err = lightrail(capsys, "runs")
    assert code == 2 and "give --store PATH|URL or set $LIGHTRAIL_STORE" in err
    code, _, err = lightrail(capsys, "runs", "--store", str(tmp_path / "missing.db"))
    assert code == 2 and "no store at" in err and not (tmp_path / "missing.db").exists()
    (tmp_path / "s.db").touch()
    code, _, err = lightrail(capsys, "rollouts", "--store", str(tmp_path / "s.db"), "--status", "broken")
    assert code == 2 and "--status takes queued, running" in err


def _rollout(rollout_id: str, created: float, ended: float | None, **metadata) -> Rollout:
    return Rollout(
        rollout_id=rollout_id, task=Task(input=0), mode="train", sample_index=0, resources_version=None,
        policy=RetryPolicy(), status=RolloutStatus.SUCCEEDED, created_at=created, ended_at=ended, metadata=metadata,
    )  # fmt: skip


def test_derive_runs_by_tag_then_by_idle_gap():
    rollouts = [
        _rollout("a", 0, 50),
        _rollout("apo", 10, 20, apo_run="x1"),
        _rollout("b", 55, 100),  # within the gap of a's end
        _rollout("c", 150, None),  # 50 s after b ended: same run at gap 60
        _rollout("d", 400, 410),  # 250 s after c was enqueued (still running): a new run
        _rollout("apo2", 420, 430, apo_run="x1"),
    ]
    runs = derive_runs(rollouts, gap_s=60)
    assert [(r.number, r.tag, [x.rollout_id for x in r.rollouts]) for r in runs] == [
        (1, None, ["a", "b", "c"]),
        (2, "x1", ["apo", "apo2"]),
        (3, None, ["d"]),
    ]


def test_an_attempt_index_a_queued_rollout_does_not_have_is_an_error():
    from lightrail import MemoryStore
    from lightrail.inspection.runs import rollout_details
    from lightrail.types import RolloutSpec, Task

    async def go():
        store = MemoryStore()
        (queued,) = await store.enqueue([RolloutSpec(task=Task(input={"q": 1}))])
        assert (await rollout_details(store, queued.rollout_id)).attempt is None  # nothing to show yet: no error
        with pytest.raises(LookupError, match=rf"rollout {queued.rollout_id} has attempts \[\], not 2"):
            await rollout_details(store, queued.rollout_id, 2)

    asyncio.run(go())
