"""The runner in one process against a real `MemoryStore`: concurrency, outcomes, cancellation, shutdown."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from lightrail.agent import Runner, rollout
from lightrail.store import MemoryStore, SQLiteStore
from lightrail.types import AttemptStatus, Attr, RetryPolicy, RolloutSpec, RolloutStatus, StatusCode, Task


@pytest.fixture
async def store():
    s = MemoryStore()
    yield s
    await s.close()


async def enqueue(store, *inputs, policy: RetryPolicy | None = None):
    specs = [RolloutSpec(task=Task(input=i), policy=policy or RetryPolicy()) for i in inputs]
    return [r.rollout_id for r in await store.enqueue(specs)]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("agent", ["sample_agents:tagged", "sample_agents:sync_tagged"])
async def test_concurrent_rollouts_keep_their_spans_apart(store, agent):
    ids = await enqueue(store, *({"reward": float(i)} for i in range(8)))
    runner = Runner(store, agent, concurrency=8, handle_signals=False)
    stats = await runner.run(max_rollouts=8)
    assert stats.ended["succeeded"] == 8
    if agent.endswith(":tagged"):  # the 8 ran at once: every one had emitted its first step before any ended
        firsts, ends = [], []
        for rollout_id in ids:
            spans = await store.query_spans(rollout_id)
            firsts.append(min(s.start_time for s in spans if s.attributes.get(Attr.EVENT_NAME) == "step"))
            ends.append(max(s.end_time or s.start_time for s in spans))
        assert max(firsts) < min(ends)
    for i, rollout_id in enumerate(ids):
        rollout = await store.get_rollout(rollout_id)
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == float(i)
        (attempt,) = await store.query_attempts(rollout_id)
        spans = await store.query_spans(rollout_id)
        assert {s.attempt_id for s in spans} == {attempt.attempt_id}
        assert len({s.trace_id for s in spans}) == 1
        (root,) = [s for s in spans if s.name == Attr.SPAN_ROLLOUT]
        assert root.status.code is StatusCode.OK and root.attributes["lightrail.worker_id"] == runner.worker_id
        for s in spans:
            if "rid" in s.attributes:  # the agent tagged it with the ids it saw: they must match where it landed
                assert s.attributes["rid"] == rollout_id
            if "aid" in s.attributes:
                assert s.attributes["aid"] == attempt.attempt_id
            if s is not root:
                assert s.parent_id is not None
        rewards = [s for s in spans if s.name == Attr.SPAN_REWARD]
        if agent.endswith(":tagged"):
            assert len(rewards) == 4 and sum(not s.attributes[Attr.REWARD_FINAL] for s in rewards) == 3
            assert all(
                s.attributes[Attr.LINKED_RESPONSE_ID].startswith(attempt.attempt_id)
                for s in rewards
                if not s.attributes[Attr.REWARD_FINAL]
            )
        else:
            names = {s.attributes.get(Attr.EVENT_NAME) for s in spans}
            assert {"sync", "inner"} <= names  # "inner" came from a thread the sync agent started itself


async def test_returned_reward_wins_over_emitted_final_reward(store):
    ids = await enqueue(store, {"emit": 0.25}, {"emit": 0.25, "return": 0.75}, {}, {"return": True})
    await Runner(store, "sample_agents:behave", concurrency=4, handle_signals=False).run(max_rollouts=4)
    rewards = [(await store.get_rollout(r)).reward for r in ids]
    assert rewards == [0.25, 0.75, None, 1.0]
    spans = await store.query_spans(ids[1])
    finals = [s.attributes[Attr.REWARD] for s in spans if s.name == Attr.SPAN_REWARD]
    assert finals == [0.25, 0.75]  # the returned reward is recorded as the last final reward span


async def test_exceptions_are_classified(store):
    infra, failed = await enqueue(
        store, {"connect": closed_port()}, {"raise": 7}, policy=RetryPolicy(max_attempts=2, lease_s=5)
    )
    stats = await Runner(store, "sample_agents:behave", concurrency=2, handle_signals=False).run(max_rollouts=3)
    assert stats.ended == {"infra_error": 2, "failed": 1}
    infra_attempts = await store.query_attempts(infra)
    assert [a.status for a in infra_attempts] == [AttemptStatus.INFRA_ERROR] * 2  # retried, never a reward 0
    assert infra_attempts[0].error.type == "httpx.ConnectError"
    assert (await store.get_rollout(infra)).status is RolloutStatus.INFRA_ERROR
    (attempt,) = await store.query_attempts(failed)
    assert attempt.status is AttemptStatus.FAILED
    assert attempt.error.type == "ValueError" and attempt.error.message.startswith("bad answer 7")
    assert "raise ValueError" in attempt.error.traceback
    spans = await store.query_spans(failed)
    (exc_span,) = [s for s in spans if s.name == Attr.SPAN_EXCEPTION]
    assert exc_span.attributes[Attr.EXCEPTION_TYPE] == "ValueError"
    (root,) = [s for s in spans if s.name == Attr.SPAN_ROLLOUT]
    assert root.status.code is StatusCode.ERROR


async def test_a_bad_return_value_fails_the_attempt(store):
    @rollout
    def agent(task):
        return "yes"

    (rid,) = await enqueue(store, 1)
    await Runner(store, agent, handle_signals=False).run(max_rollouts=1)
    (attempt,) = await store.query_attempts(rid)
    assert attempt.status is AttemptStatus.FAILED and "expected a float" in attempt.error.message


async def test_store_cancel_reaches_the_agent_within_a_heartbeat(store):
    cancelled_at: list[float] = []

    @rollout
    async def agent(task):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise

    (rid,) = await enqueue(store, 1, policy=RetryPolicy(lease_s=0.6))  # heartbeat every 0.2 s
    runner = Runner(store, agent, handle_signals=False)
    run = asyncio.ensure_future(runner.run(max_rollouts=1))
    while not (await store.query_attempts(rid)):
        await asyncio.sleep(0.01)
    await store.cancel([rid])
    stats = await asyncio.wait_for(run, 15)  # the agent would sleep 30 s: the runner cancelled it
    assert cancelled_at
    assert stats.ended == {"cancelled": 1}  # the store ended it: the runner does not report it again
    (attempt,) = await store.query_attempts(rid)
    assert attempt.status is AttemptStatus.CANCELLED


async def test_time_budget_ends_the_attempt_as_timeout(store):
    (rid,) = await enqueue(store, {"sleep": 30}, policy=RetryPolicy(lease_s=5, timeout_s=0.3))
    # the agent would sleep 30 s: the 0.3 s budget ends it
    await asyncio.wait_for(Runner(store, "sample_agents:behave", handle_signals=False).run(max_rollouts=1), 15)
    assert (await store.get_rollout(rid)).status is RolloutStatus.TIMEOUT


async def test_stale_finish_is_logged_not_fatal(store, caplog):
    @rollout
    async def agent(task, rollout):
        await store.cancel([rollout.rollout_id])  # the attempt ends in the store before the agent returns
        return 1.0

    await enqueue(store, 1, 2)
    stats = await Runner(store, agent, concurrency=2, handle_signals=False).run(max_rollouts=2)
    assert stats.ended == {"stale": 2}


async def test_graceful_stop_finishes_quick_rollouts_and_hands_back_the_rest(store):
    quick, slow = await enqueue(store, {"sleep": 0.2, "return": 1.0}, {"sleep": 30, "return": 1.0})
    runner = Runner(store, "sample_agents:behave", concurrency=2, grace_s=0.6, handle_signals=False)
    run = asyncio.ensure_future(runner.run())
    while len(await store.query_rollouts(status=[RolloutStatus.RUNNING])) < 2:
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    runner.stop()
    stats = await asyncio.wait_for(run, 15)  # the slow one would sleep 30 s: cut at the end of the grace
    assert time.monotonic() - t0 >= 0.5  # the grace was given
    assert stats.ended == {"succeeded": 1, "infra_error": 1}
    assert (await store.get_rollout(quick)).status is RolloutStatus.SUCCEEDED
    (attempt,) = await store.query_attempts(slow)
    assert attempt.status is AttemptStatus.INFRA_ERROR and attempt.error.type == "RunnerShutdown"
    assert (await store.get_rollout(slow)).status is RolloutStatus.QUEUED  # retried at once, not after a lease


async def test_idle_exit_and_long_poll(store):
    runner = Runner(store, "sample_agents:behave", handle_signals=False)
    run = asyncio.ensure_future(runner.run(idle_exit_s=0.5))
    await asyncio.sleep(0.2)
    (rid,) = await enqueue(store, {"return": 1.0})  # picked up by the waiting long poll at once
    done = await store.wait([rid], timeout_s=1)
    assert done and done[0].status is RolloutStatus.SUCCEEDED
    stats = await asyncio.wait_for(run, 3)
    assert stats.leased == 1


async def test_missing_resources_version_is_an_infra_error(store):
    (rid,) = [r.rollout_id for r in await store.enqueue([RolloutSpec(task=Task(input=1), resources_version=9)])]
    await Runner(store, "sample_agents:behave", handle_signals=False).run(max_rollouts=1)
    (attempt,) = await store.query_attempts(rid)
    assert attempt.status is AttemptStatus.INFRA_ERROR  # not the agent's fault: never trained as reward 0


def test_a_store_outage_is_reported_at_a_rate_not_per_retry_and_ends_after_the_patience(caplog):
    """Fifty failed leases in a row: one status line (the next after 30 s), and with a patience of 0 s the
    runner gives up on the first failure with `StoreUnavailableError` naming the last error."""
    import logging

    from lightrail.agent.runner import _Outage
    from lightrail.store import StoreUnavailableError

    outage = _Outage(patience_s=None)
    with caplog.at_level(logging.WARNING, logger="lightrail.agent.runner"):
        for _ in range(50):
            outage.failed(ConnectionRefusedError("nobody there"))
    lines = [r.getMessage() for r in caplog.records if "store unreachable" in r.getMessage()]
    assert len(lines) == 1 and "ConnectionRefusedError: nobody there" in lines[0] and "giving up" not in lines[0]
    with pytest.raises(StoreUnavailableError, match="unreachable for 0 s, giving up: nobody there"):
        _Outage(patience_s=0.0).failed(ConnectionRefusedError("nobody there"))


def test_an_incompatible_langchain_leaves_calls_unnamed_and_attempts_running(tmp_path):
    """The runner names LangChain calls once an agent imported ``langchain_core``; a LangChain lightrail cannot
    hook into (here one without the callbacks module) is said once in the log and every attempt still runs. In a
    subprocess: the real ``lightrail runner`` importing the incompatible package first on its path."""
    (tmp_path / "incompatible" / "langchain_core").mkdir(parents=True)
    (tmp_path / "incompatible" / "langchain_core" / "__init__.py").write_text('"""No callbacks, no runnables."""\n')
    (tmp_path / "lc_agents.py").write_text(
        "import langchain_core  # noqa: F401\n\n\ndef solve(task):\n    return 1.0\n"
    )

    async def enqueue_two() -> list[str]:
        store = SQLiteStore(tmp_path / "store.db")
        ids = [r.rollout_id for r in await store.enqueue([RolloutSpec(task=Task(input={"i": i})) for i in range(2)])]
        await store.close()
        return ids

    ids = asyncio.run(enqueue_two())
    path = os.pathsep.join([str(tmp_path / "incompatible"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "lightrail", "runner", "--store", "store.db", "--agent", "lc_agents:solve"]
        + ["--max-rollouts", "2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr

    async def statuses() -> list[RolloutStatus]:
        store = SQLiteStore(tmp_path / "store.db")
        found = [(await store.get_rollout(i)).status for i in ids]
        await store.close()
        return found

    assert asyncio.run(statuses()) == [RolloutStatus.SUCCEEDED] * 2
    assert done.stderr.count("cannot name LangChain calls by their runnables") == 1, done.stderr
    assert "ModuleNotFoundError" in done.stderr and "Traceback" not in done.stderr
