"""Fault drill: the trainer itself SIGKILLed mid-run (its store server and runners go with it), then
``lightrail train --resume``: the run continues from its newest complete checkpoint, the rollouts the dead session
left unfinished are cancelled rather than run against a gateway that is gone, every step is in ``metrics.jsonl``
once, and nothing acknowledged is lost. A store server killed under a training run, and a standalone gateway
killed under runners, are drilled below. (Runner kills are drilled in ``tests/trainer/test_external_runners.py``,
store kills without a trainer in ``tests/store/test_durability.py`` and ``tests/store/test_postgres.py``.)
The gateway a training run starts lives in the trainer's process: killing it is the trainer drill.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from lightrail.store import SyncStoreClient
from lightrail.types import (
    LLM,
    AttemptStatus,
    Attr,
    Resources,
    RetryPolicy,
    RolloutSpec,
    RolloutStatus,
    Task,
)
from tests.trainer.test_config import CONFIG, ROOT, _write

STEPS = 4


def _train(config: Path, run: Path, *extra: str) -> list[str]:
    # These drills are about crashes, not learning: the random tiny model scores 0 on every calculator task, a run
    # the guard would rightly stop after three steps without a learning signal (`guard.max_empty_steps`).
    guard = ("--set", "grpo.guard.max_empty_steps=0")
    return [sys.executable, "-m", "lightrail.cli", "train", str(config), "--out", str(run), *guard, *extra]


def _statuses(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT rollout_id, status FROM rollouts WHERE mode = 'train'"))


def test_a_killed_trainer_resumes_from_its_checkpoint(tmp_path):
    config = _write(tmp_path, CONFIG.replace("  steps: 1\n", "  steps: 1\n  checkpoint_every: 1\n"))
    run = tmp_path / "run"
    args = ("--steps", str(STEPS), "--set", "trainer.concurrency=2")
    first = subprocess.Popen(_train(config, run, *args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoint = run / "checkpoints" / "step-1" / "loop_state.json"
    try:
        deadline = time.monotonic() + 300
        while not checkpoint.exists():  # step 1 trained and saved: step 2's rollouts are being enqueued or run
            assert first.poll() is None, first.stderr.read().decode() if first.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
    saved = max(int(p.parent.name.split("-")[1]) for p in run.glob("checkpoints/step-*/loop_state.json"))
    at_kill = _statuses(run / "store.db")
    unfinished = {rid for rid, status in at_kill.items() if status in ("queued", "running")}

    resumed = subprocess.run(_train(config, run, *args, "--resume"), cwd=ROOT, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "held-out success:" in resumed.stdout

    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == STEPS
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m["step"] for m in lines if m["kind"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))  # each step once: the ones after the checkpoint were redone
    after = _statuses(run / "store.db")
    assert not {rid for rid, status in after.items() if status in ("queued", "running")}  # nothing left behind
    assert all(after[rid] in ("cancelled", "infra_error", "succeeded", "failed") for rid in unfinished)
    # everything acknowledged before the kill is still there, as it was
    assert {rid: s for rid, s in after.items() if rid in at_kill and rid not in unfinished} == {
        rid: s for rid, s in at_kill.items() if rid not in unfinished
    }
    # the resumed steps ran rollouts of their own: (steps after the checkpoint) x 2 tasks x 2 samples, all finished
    new = [s for rid, s in after.items() if rid not in at_kill]
    assert len(new) == (STEPS - saved) * 4 and all(s in ("succeeded", "failed") for s in new), (saved, new)


async def test_only_the_runs_own_unfinished_rollouts_are_cancelled():
    """What the trainer does before its runners start: queued and running rollouts tagged with this run are
    cancelled; another run's, and this run's finished ones, are left alone."""
    from lightrail.algorithms.protocol import cancel_unfinished
    from lightrail.store import MemoryStore
    from lightrail.types import AttemptStatus, RolloutSpec, Task

    store = MemoryStore()
    tagged = [RolloutSpec(rollout_id=f"{run}-{i}", task=Task(input={}), metadata={"run": run})
              for run in ("mine", "other") for i in range(3)]  # fmt: skip
    await store.enqueue(tagged)
    done = await store.lease("w")  # mine-0: finished before the crash
    await store.finish(done.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.lease("w")  # mine-1: running when the trainer died
    assert await cancel_unfinished(store, "mine") == 2
    status = {r.rollout_id: r.status.value for r in await store.query_rollouts()}
    assert status == {"mine-0": "succeeded", "mine-1": "cancelled", "mine-2": "cancelled",
                      "other-0": "queued", "other-1": "queued", "other-2": "queued"}  # fmt: skip
    assert await cancel_unfinished(store, None) == 0


def test_a_training_run_survives_its_store_server_killed_and_restarted(tmp_path):
    """The run's store is a ``lightrail store serve`` process of its own (as on a cluster): SIGKILLed mid-run and
    started again on the same port and file, the trainer, its gateway and its runners ride it out on their
    retries, and the run completes with every step once and nothing left unfinished."""
    from tests._served import Served, free_port

    port, db, token = free_port(), tmp_path / "store.db", "drill-token"
    serve = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", str(db), "--port", str(port)]
    env = {"LIGHTRAIL_TOKEN": token}
    config = _write(tmp_path, CONFIG + f"store: http://127.0.0.1:{port}\n")
    run = tmp_path / "run"
    server = Served(serve, port, tmp_path / "store-1.log", env)
    server.wait_healthy(60)
    trainer = subprocess.Popen(_train(config, run, "--steps", str(STEPS)), cwd=ROOT, env={**os.environ, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not _train_steps(run):  # a step trained: rollouts of the next are in flight
            assert trainer.poll() is None, trainer.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no training step after 300 s"
            time.sleep(0.1)
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
        server = Served(serve, port, tmp_path / "store-2.log", env)  # same port, same file
        server.wait_healthy(60)
        out, err = trainer.communicate(timeout=600)
        assert trainer.returncode == 0, err[-3000:]
    finally:
        trainer.kill()
        server.stop()
    assert "held-out success:" in out
    assert _train_steps(run) == list(range(1, STEPS + 1))
    status = _statuses(db)
    assert status and not {rid for rid, s in status.items() if s in ("queued", "running")}


def _train_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [m["step"] for m in map(json.loads, path.read_text().splitlines()) if m["kind"] == "train"]


def test_a_gateway_killed_and_restarted_loses_no_call_an_agent_saw(tmp_path):
    """A ``lightrail gateway serve`` process (the tiny model, recording into a store server) serves the runners'
    agents, three calls per rollout; it is SIGKILLed while calls are in flight and started again on the same port.
    The agents' clients retry through the outage, every rollout succeeds once, and every response an agent
    received is recorded as a call of its attempt: the gateway answers only once the call's span is stored."""
    from tests._served import Served, free_port

    store_port, gateway_port, token, gateway_token = free_port(), free_port(), "drill-token", "drill-gateway"
    db, total = tmp_path / "store.db", 48
    store_cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", str(db), "--port", str(store_port)]
    store_url = f"http://127.0.0.1:{store_port}"
    gateway_cmd = [sys.executable, "-m", "lightrail.cli", "gateway", "serve", "--model", "tiny", "--port",
                   str(gateway_port), "--store", store_url, "--store-token", token, "--token", gateway_token]  # fmt: skip
    env = {"LIGHTRAIL_TOKEN": token}
    store = Served(store_cmd, store_port, tmp_path / "store.log", env)
    store.wait_healthy(60)
    gateway = Served(gateway_cmd, gateway_port, tmp_path / "gateway-1.log")
    runners: list[subprocess.Popen] = []
    try:
        gateway.wait_healthy(120)
        with SyncStoreClient(store_url, token=token) as client:
            llm = LLM(endpoint=gateway.root, model="tiny", api_key=gateway_token)
            version = client.put_resources(Resources(items={"llm": llm})).version
            policy = RetryPolicy(lease_s=30.0, max_attempts=3)
            client.enqueue([RolloutSpec(task=Task(input={"n": n}), resources_version=version, policy=policy)
                            for n in range(total)])  # fmt: skip
            for name in ("a", "b"):
                runner = [sys.executable, "-m", "lightrail.cli", "runner", "--store", store_url, "--agent",
                          "drill_agents:three_calls", "-k", "4", "--worker-id", name]  # fmt: skip
                runner_env = {**os.environ, **env, "PYTHONPATH": str(Path(__file__).parent)}
                log = (tmp_path / f"runner-{name}.log").open("wb")
                runners.append(subprocess.Popen(runner, env=runner_env, stdout=log, stderr=subprocess.STDOUT))
            deadline = time.monotonic() + 300
            while _finished(client) < total // 4:  # agents are calling: kill the gateway under them
                assert time.monotonic() < deadline, gateway.log_tail()
                time.sleep(0.05)
            os.killpg(gateway.proc.pid, signal.SIGKILL)
            gateway.proc.wait(30)
            killed_at = _finished(client)
            gateway = Served(gateway_cmd, gateway_port, tmp_path / "gateway-2.log")  # same port, same store
            gateway.wait_healthy(120)
            while _finished(client) < total:
                assert time.monotonic() < deadline, (tmp_path / "runner-a.log").read_text()[-3000:]
                time.sleep(0.1)
            rollouts = client.query_rollouts()
            attempts = {r.rollout_id: client.query_attempts(r.rollout_id) for r in rollouts}
            spans = {r.rollout_id: client.query_spans(r.rollout_id) for r in rollouts}
    finally:
        for runner in runners:
            runner.kill()
            runner.wait(10)
        gateway.stop()
        store.stop()

    assert killed_at < total  # the kill came while rollouts were still running
    unseen = 0
    for rollout in rollouts:
        assert rollout.status is RolloutStatus.SUCCEEDED, rollout
        won = [a for a in attempts[rollout.rollout_id] if a.status is AttemptStatus.SUCCEEDED]
        assert len(won) == 1  # trained on once
        mine = [s for s in spans[rollout.rollout_id] if s.attempt_id == won[0].attempt_id]
        (seen,) = [s.attributes["response_ids"] for s in mine if s.attributes.get(Attr.EVENT_NAME) == "seen"]
        recorded = [s.attributes[Attr.RESPONSE_ID] for s in mine if s.name == Attr.SPAN_LLM_CALL]
        assert len(seen) == 3 and set(seen) <= set(recorded), (rollout.rollout_id, seen, recorded)
        unseen += len(recorded) - len(seen)
    # A call answered in the instant the gateway died can be stored though its answer never arrived (its retry is
    # recorded too): at most one per agent holding a call then.
    assert unseen <= 8


def _finished(client) -> int:
    counts = client.counts()
    return sum(n for status, n in counts.items() if status not in (RolloutStatus.QUEUED, RolloutStatus.RUNNING))
