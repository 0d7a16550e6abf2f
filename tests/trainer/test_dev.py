"""`Trainer.dev` end to end (store server process, runner processes), the report, and `Trainer.fit`."""

from __future__ import annotations

import io
import json

import dev_agents
import pytest
from rich.console import Console

from lightrail.cli import main
from lightrail.inspection.report import digest_failures
from lightrail.store import MemoryStore
from lightrail.trainer import Trainer, TrainerContext, message_pattern
from lightrail.types import Attempt, AttemptStatus, ErrorInfo, PromptTemplate, RolloutStatus, Task

TASKS = [
    {"a": 1, "b": 2},
    {"a": 3, "b": 4, "off_by": 1},
    {"a": 5, "b": -1},
    {"a": 6, "b": -2},
    {"a": 7, "missing": "a.txt"},
    {"a": 8, "missing": "b.txt"},
]
RESOURCES = {"prompt": PromptTemplate(template="{a} + {b} = ?")}


def console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=False), out


def test_dev_end_to_end_with_runner_processes(tmp_path):
    con, out = console()
    trainer = Trainer(n_runners=2, concurrency=2, runs_dir=tmp_path / "runs", console=con)
    report = trainer.dev(dev_agents.grader, [Task(input=t, task_id=f"t{i}") for i, t in enumerate(TASKS)], RESOURCES)

    assert [row.task_id for row in report.rows] == [f"t{i}" for i in range(6)]
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 2 + [RolloutStatus.FAILED] * 4
    assert [row.reward for row in report.rows[:2]] == [1.0, 0.0]
    assert all(row.attempts == 1 for row in report.rows)
    assert all(row.spans >= 3 for row in report.rows)  # root + prompt event + reward or exception
    assert all(row.seconds is not None and row.seconds >= 0 for row in report.rows)
    assert report.store.startswith(str(tmp_path / "runs")) and report.store.endswith("store.db")

    by_type = {group.type: group for group in report.digest}
    assert set(by_type) == {"ValueError", "KeyError"}
    assert by_type["ValueError"].pattern == "negative operand <n> in task <n>"
    assert by_type["ValueError"].count == 2 and len(by_type["ValueError"].rollout_ids) == 2
    assert by_type["KeyError"].pattern == "<str>"  # str(KeyError) quotes its message
    assert by_type["KeyError"].example.startswith('"no such file')

    text = out.getvalue()
    assert "rollouts" in text and report.rows[0].rollout_id in text
    assert "6 rollouts in" in text and "2 succeeded" in text and "4 failed" in text
    assert "failure digest: 4 attempts in 2 groups" in text
    assert "negative operand <n> in task <n>" in text


def test_dev_with_an_in_process_store_and_bad_agents():
    con, out = console()
    report = Trainer(n_runners=1, store=MemoryStore(), concurrency=3, console=con).dev(
        "dev_agents:grader", TASKS[:2], RESOURCES
    )
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 2
    assert "failure digest: no failed attempts" in out.getvalue()
    with pytest.raises(ValueError, match="lambda"):
        Trainer(console=con).dev(lambda task: 1.0, TASKS)


def test_lightrail_dev_command(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(t) for t in [{"a": 1, "b": 1, "off_by": 0}]) + "\n")
    code = main(["dev", "--agent", "dev_agents:grader", "--tasks", str(tasks), "--runners", "1", "-k", "1",
                 "--store", str(tmp_path / "store.db")])  # fmt: skip
    out = capsys.readouterr().out
    assert "1 rollout in" in out
    # no resources were given, so the agent's `prompt_template` cannot be injected: a clear failure, digested
    assert code == 1 and "LookupError" in out and "no PromptTemplate" in out


def test_message_patterns_and_digest():
    assert message_pattern("bad answer 42 for 'x' at 0x1f (attempt at-0123456789abcdef)") == (
        "bad answer <n> for <str> at <hex> (attempt <id>)"
    )
    assert message_pattern("timeout after 3.5s talking to 127.0.0.1:8000 (deadbeef99)") == (
        "timeout after <n>s talking to <n>:<n> (<hex>)"
    )

    def attempt(i, status, error=None):
        return Attempt(
            attempt_id=f"at-{i}", rollout_id=f"ro-{i % 3}", index=1, worker_id="w", status=status,
            started_at=0, lease_expires_at=1, error=error,
        )  # fmt: skip

    digest = digest_failures(
        [attempt(i, AttemptStatus.FAILED, ErrorInfo(type="ValueError", message=f"bad {i}")) for i in range(5)]
        + [attempt(9, AttemptStatus.LOST), attempt(10, AttemptStatus.SUCCEEDED)]
    )
    assert [(g.type, g.pattern, g.count, len(g.rollout_ids)) for g in digest] == [
        ("ValueError", "bad <n>", 5, 3),
        ("LeaseExpired", "the runner stopped heartbeating (crashed, killed or cut off)", 1, 1),
    ]


class CountingAlgorithm:
    """The smallest `Algorithm`: publishes resources, runs one batch of rollouts, logs the mean reward."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.rewards: list[float | None] = []

    async def setup(self, ctx: TrainerContext) -> None:
        self.calls.append("setup")
        await ctx.publish(RESOURCES)

    async def run(self, ctx: TrainerContext) -> None:
        self.calls.append("run")
        rollouts = await ctx.run_rollouts(ctx.train_tasks, n_samples=2)
        self.rewards = [r.reward for r in rollouts]
        ctx.log(1, mean_reward=sum(self.rewards) / len(self.rewards))

    async def close(self) -> None:
        self.calls.append("close")


def test_fit_drives_an_algorithm():
    from lightrail import Algorithm

    con, out = console()
    algorithm = CountingAlgorithm()
    assert isinstance(algorithm, Algorithm)
    Trainer(n_runners=1, store=MemoryStore(), algorithm=algorithm, console=con).fit(
        "dev_agents:grader", [{"a": 1, "b": 1}, {"a": 1, "b": 1, "off_by": 2}]
    )
    assert algorithm.calls == ["setup", "run", "close"]
    assert algorithm.rewards == [1.0, 1.0, 0.0, 0.0]  # samples of a task are adjacent
    assert "step 1" in out.getvalue() and "mean_reward=0.5" in out.getvalue()


SCRIPT = """
from lightrail import emit_reward, rollout
from lightrail.trainer import Trainer


@rollout
def agent(task):
    emit_reward(float(task))


if __name__ == "__main__":
    report = Trainer(n_runners=1, concurrency=2, runs_dir=RUNS).dev(agent, [1, 2, 3])
    print("rewards", [row.reward for row in report.rows])
"""


def test_dev_from_a_script_run_as_main(tmp_path):
    """Agents defined in a script run as ``__main__`` reach the runner processes by the script's path."""
    import subprocess
    import sys

    script = tmp_path / "train_me.py"
    script.write_text(SCRIPT.replace("RUNS", repr(str(tmp_path / "runs"))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rewards [1.0, 2.0, 3.0]" in done.stdout


def test_a_refused_key_is_named_and_the_environment_key_is_the_gateways(tmp_path, monkeypatch):
    """Runners hand the agent its gateway key in ``OPENAI_API_KEY`` too (an agent that builds its client from the
    environment works unchanged), and a key the gateway refuses is named as such, with the fix, not blamed on the
    agent making no call."""
    from lightrail.gateway.fake import ScriptedBackend
    from lightrail.inspection.capture import CaptureCause

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    con, out = console()
    trainer = Trainer(n_runners=1, concurrency=2, runs_dir=tmp_path / "runs", console=con)
    report = trainer.dev(dev_agents.env_key_agent, [{"q": 1}, {"q": 2}], llm=ScriptedBackend(["four"]))
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 2
    assert [row.llm_calls for row in report.rows] == [1, 1] and not any(row.capture for row in report.rows)

    con, out = console()
    trainer = Trainer(n_runners=1, concurrency=2, runs_dir=tmp_path / "runs2", console=con)
    report = trainer.dev(dev_agents.dummy_key_agent, [{"q": 1}, {"q": 2}], llm=ScriptedBackend(["four"]))
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 2
    assert [[p.cause for p in row.capture] for row in report.rows] == [[CaptureCause.KEY_REFUSED]] * 2
    text = out.getvalue()
    assert "the gateway refused the agent's key (401 Invalid bearer token.)" in text
    assert "api_key=llm.api_key" in text and "did not call llm.endpoint" not in text
