"""Runners under another interpreter (``run_runners(..., runner_python=...)``): the CrewAI environment
(``.venv-crewai``, built by scripts/_env.sh) runs real rollouts against a store server in this environment, with
its own site-packages only; a wrong interpreter is refused before any runner starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lightrail.agent import run_runners
from lightrail.store import StoreClient
from lightrail.trainer import StoreServerProcess
from lightrail.types import Attr, RolloutSpec, RolloutStatus, Task
from tests._frameworks import CREWAI_PYTHON, needs_crewai_env

ROOT = Path(__file__).resolve().parents[2]


@needs_crewai_env
async def test_runners_under_the_crewai_interpreter_run_rollouts(tmp_path):
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        rollouts = await store.enqueue([RolloutSpec(task=Task(input={"x": x})) for x in (0.25, 0.5, 0.75)])
        ids = [r.rollout_id for r in rollouts]
        ref = "sample_agents:where_am_i"  # a module the other environment can import (no pytest there)
        with run_runners(server.url, ref, n=1, concurrency=2, token=server.token, runner_python=CREWAI_PYTHON):
            done = await store.wait(ids, timeout_s=60)
        assert [(r.status, r.reward) for r in done] == [(RolloutStatus.SUCCEEDED, x) for x in (0.25, 0.5, 0.75)]
        for rollout_id in ids:
            (event,) = [s for s in await store.query_spans(rollout_id) if s.attributes.get(Attr.EVENT_NAME)]
            assert event.attributes["executable"] == CREWAI_PYTHON
            assert event.attributes["prefix"] == str(Path(CREWAI_PYTHON).parents[1])  # the venv of bin/python
            assert event.attributes["has_crewai"] is True
            assert event.attributes["has_torch"] is False  # the trainer's site-packages did not come along
    finally:
        await store.close()
        server.stop()


def test_an_interpreter_without_lightrail_is_refused_with_the_fix(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    with pytest.raises(ValueError, match=r"cannot import lightrail .*pip install -e"):
        run_runners(
            "http://127.0.0.1:9", "m:agent", n=1, concurrency=1, runner_python=str(tmp_path / "bare/bin/python")
        )
    with pytest.raises(ValueError, match="no such executable"):
        run_runners("http://127.0.0.1:9", "m:agent", n=1, concurrency=1, runner_python=str(tmp_path / "nope"))
