"""Runner processes against a real store server process: a killed runner's rollout is retried elsewhere, and
SIGTERM shuts a runner down gracefully (through the ``lightrail runner`` command)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightrail.agent import run_runners
from lightrail.store import StoreClient
from lightrail.trainer import StoreServerProcess
from lightrail.types import AttemptStatus, RetryPolicy, RolloutSpec, RolloutStatus, Task

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = StoreServerProcess(tmp_path_factory.mktemp("store") / "store.db")
    yield server
    server.stop()


@pytest.fixture
async def store(server):
    client = StoreClient(server.url, token=server.token)
    yield client
    await client.close()


async def attempts_when(store, rollout_id, predicate, timeout_s=10.0):
    """The rollout's attempts once ``predicate`` holds (a test-side watch; the runner itself never polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        attempts = await store.query_attempts(rollout_id)
        if predicate(attempts):
            return attempts
        await asyncio.sleep(0.02)
    raise TimeoutError(f"attempts of {rollout_id}: {await store.query_attempts(rollout_id)}")


def pid_of(worker_id: str) -> int:
    return int(worker_id.split(":")[1])  # worker ids are host:pid:suffix


async def test_sigkilled_runner_loses_its_lease_and_another_runner_retries(server, store):
    policy = RetryPolicy(lease_s=1.0, max_attempts=3)
    (rollout,) = await store.enqueue([RolloutSpec(task=Task(input={"sleep": 1.0}), policy=policy)])
    with run_runners(server.url, "sample_agents:sleeper", n=2, concurrency=1, token=server.token) as runners:
        (first,) = await attempts_when(store, rollout.rollout_id, lambda a: len(a) == 1)
        victim = pid_of(first.worker_id)
        assert victim in runners.pids
        os.kill(victim, signal.SIGKILL)
        (done,) = await store.wait([rollout.rollout_id], timeout_s=20)
        assert done.status is RolloutStatus.SUCCEEDED and done.reward == 1.0
        lost, retry = await store.query_attempts(rollout.rollout_id)
        assert lost.status is AttemptStatus.LOST  # recorded, not trained as reward 0
        assert retry.status is AttemptStatus.SUCCEEDED
        assert pid_of(retry.worker_id) in runners.pids and pid_of(retry.worker_id) != victim
        assert [p.exitcode for p in runners.processes if p.pid == victim] == [-signal.SIGKILL]


async def test_sigterm_lets_quick_rollouts_finish_and_hands_back_the_rest(server, store, tmp_path):
    quick, slow = await store.enqueue(
        [
            RolloutSpec(task=Task(input={"sleep": 0.4})),
            RolloutSpec(task=Task(input={"sleep": 60, "mark": str(tmp_path / "cancelled")})),
        ]
    )
    env = {**os.environ, "LIGHTRAIL_TOKEN": server.token, "PYTHONPATH": os.pathsep.join([str(HERE), os.getcwd()])}
    cmd = [sys.executable, "-m", "lightrail.cli", "runner", "--store", server.url, "--agent", "sample_agents:sleeper"]
    proc = subprocess.Popen(cmd + ["-k", "2", "--grace", "1.0"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        await attempts_when(store, slow.rollout_id, lambda a: len(a) == 1)
        await attempts_when(store, quick.rollout_id, lambda a: len(a) == 1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 20)  # the slow rollout would sleep longer: cut after the grace
        assert code == 0 and time.monotonic() - t0 >= 0.9  # the 1 s grace was given
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read()
    assert (await store.get_rollout(quick.rollout_id)).status is RolloutStatus.SUCCEEDED, stderr
    (attempt,) = await store.query_attempts(slow.rollout_id)
    assert attempt.status is AttemptStatus.INFRA_ERROR and attempt.error.type == "RunnerShutdown"
    assert (await store.get_rollout(slow.rollout_id)).status is RolloutStatus.QUEUED  # retried at once
    assert (tmp_path / "cancelled").read_text().strip() == attempt.attempt_id  # the agent saw the cancellation
    await store.cancel([slow.rollout_id])  # do not leave work for other tests' runners
