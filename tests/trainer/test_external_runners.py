"""Runners started by hand join a training run: the trainer has no runners of its own (``n_runners=0``), the
runners are separate ``lightrail runner`` processes with their own working directory and environment that know
only the store's URL and token, and they reach the model through the gateway URL the trainer advertises in the
rollouts' resources. One runner is killed mid-run and another joins late: the run completes, every rollout is
trained on once. A runner on another host (a network namespace: its own interfaces and its own loopback, so a
loopback URL from the trainer leads nowhere) trains through the addresses the trainer binds and advertises."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from lightrail import Trainer
from lightrail.algorithms import UpdateConfig
from lightrail.algorithms.grpo import GRPO
from lightrail.engine.models import build_tiny_model
from lightrail.gateway import GatewaySettings
from lightrail.store import StoreClient, SyncStoreClient
from lightrail.trainer import StoreServerProcess
from lightrail.types import AttemptStatus, RetryPolicy, RolloutStatus

AGENTS = Path(__file__).resolve().parents[1] / "algorithms"  # loop_agents.parity_agent: one real LLM call
TOKEN = "external-runners-token"


def start_runner(url: str, name: str, workdir: Path, host: Sequence[str] = ()) -> subprocess.Popen:
    """``lightrail runner`` as a user starts it on another host: its own directory and a bare environment holding
    only what it needs (the agent's import path and the store token), nothing inherited from the trainer.
    ``host``: a command prefix that runs it elsewhere (``ip netns exec NS``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONPATH": str(AGENTS), "LIGHTRAIL_TOKEN": TOKEN}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "LIGHTRAIL_TORCH"))})
    cmd = [*host, sys.executable, "-m", "lightrail.cli", "runner", "--store", url]
    cmd += ["--agent", "loop_agents:parity_agent"]
    cmd += ["-k", "4", "--worker-id", name, "--grace", "2"]
    log = (workdir / "runner.log").open("w")
    return subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _stored(url: str) -> tuple[dict[str, tuple], list[str]]:
    """Every rollout with its attempts, and the LLM endpoint of every published resources version."""
    client = StoreClient(url, token=TOKEN)
    try:
        rollouts = await client.query_rollouts()
        attempts = {r.rollout_id: (r, await client.query_attempts(r.rollout_id)) for r in rollouts}
        latest = await client.get_resources()
        versions = range(1, latest.version + 1) if latest is not None else ()
        endpoints = [(await client.get_resources(v)).items["llm"].endpoint for v in versions]
        return attempts, endpoints
    finally:
        await client.close()


@pytest.mark.timeout(600)
def test_training_run_with_external_runners_only(tmp_path, monkeypatch):
    from examples.calculator.data import make_splits

    monkeypatch.syspath_prepend(str(AGENTS))  # the trainer checks the agent imports before it starts

    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = make_splits(8, 4, seed=1)
    server = StoreServerProcess(tmp_path / "store.db", token=TOKEN)
    port = free_port()
    advertised = f"http://localhost:{port}/v1"  # not the address the gateway binds: runners must use this one
    grpo = GRPO(
        model, steps=3, tasks_per_step=2, n_samples=4, config=UpdateConfig(lr=1e-3), val_every=0,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        out_dir=tmp_path / "run", checkpoint_every=0,
        gateway=GatewaySettings(host="127.0.0.1", port=port, advertise_url=advertised),
    )  # fmt: skip
    trainer = Trainer(
        n_runners=0, store=server.url, token=TOKEN, algorithm=grpo, retry=RetryPolicy(lease_s=2.0, max_attempts=5)
    )
    first = start_runner(server.url, "runner-a", tmp_path / "a")
    late: list[subprocess.Popen] = []

    def kill_first_then_join_late() -> None:
        """Once training rollouts are under way, SIGKILL runner A while it holds leases, then start runner B."""
        metrics = tmp_path / "run" / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not metrics.exists() and time.monotonic() < deadline:  # the first validation is done
            time.sleep(0.05)
        watch = SyncStoreClient(server.url, token=TOKEN)  # a test-side watch: kill A mid-rollout, not between
        try:
            while time.monotonic() < deadline and len(watch.query_rollouts(status=[RolloutStatus.RUNNING])) < 2:
                time.sleep(0.005)
        finally:
            watch.close()
        first.send_signal(signal.SIGKILL)
        time.sleep(0.5)
        late.append(start_runner(server.url, "runner-b", tmp_path / "b"))

    chaos = threading.Thread(target=kill_first_then_join_late, daemon=True)
    chaos.start()
    try:
        trainer.fit("loop_agents:parity_agent", train, val)
        chaos.join(10)
        rollouts, endpoints = asyncio.run(_stored(server.url))
    finally:
        for proc in [first, *late]:
            proc.kill()
            proc.wait(10)
        server.stop()

    assert grpo.report["steps"] == 3
    assert endpoints and set(endpoints) == {advertised}  # runners were given the advertised URL, and it worked
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m for m in steps if m["kind"] == "train"]
    assert [m["rollouts"] for m in train_steps] == [8, 8, 8]
    assert all(m["excluded"] == 0 for m in train_steps)  # the killed runner's attempts were retried, not lost
    assert first.returncode == -signal.SIGKILL and late, "runner A was killed and runner B started"

    statuses = Counter(a.status for _, attempts in rollouts.values() for a in attempts)
    assert statuses[AttemptStatus.LOST] >= 1  # A died holding leases
    for rollout, attempts in rollouts.values():
        assert rollout.status is RolloutStatus.SUCCEEDED
        assert [a.status for a in attempts].count(AttemptStatus.SUCCEEDED) == 1  # trained on exactly once
    workers = Counter(a.worker_id for _, attempts in rollouts.values() for a in attempts)
    assert set(workers) == {"runner-a", "runner-b"} and workers["runner-b"] > 0


def test_external_runners_need_the_store_token(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    monkeypatch.delenv("LIGHTRAIL_TOKEN", raising=False)
    trainer = Trainer(n_runners=0, store=tmp_path / "store.db", token=None, console=None)
    with pytest.raises(ValueError, match="need the store's token"):
        trainer.dev("loop_agents:parity_agent", [{"question": "1+1"}])


@pytest.fixture
def runner_host():
    """Another host on this machine: a network namespace joined to this one by a veth pair (10.213.N.1 here,
    10.213.N.2 there). Needs root and iproute2, which the test machines have; made and removed by the test."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.fail("this test makes a network namespace: it needs root and iproute2 (`apt-get install iproute2`)")
    tag = secrets.token_hex(3)
    ns, outer, inner, net = f"lr-{tag}", f"lrh{tag}", f"lrn{tag}", f"10.213.{secrets.randbelow(250) + 1}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, text=True)

    ip("netns", "add", ns)
    try:
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", ns)
        ip("addr", "add", f"{net}.1/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("-n", ns, "addr", "add", f"{net}.2/30", "dev", inner)
        ip("-n", ns, "link", "set", inner, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        yield ["ip", "netns", "exec", ns], f"{net}.1"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes the veth pair with it
        subprocess.run(["ip", "link", "del", outer], capture_output=True)


@pytest.mark.timeout(300)
def test_a_runner_on_another_host_trains_through_the_advertised_urls(tmp_path, monkeypatch, runner_host):
    from examples.calculator.data import make_splits

    monkeypatch.syspath_prepend(str(AGENTS))
    on_host, address = runner_host
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = make_splits(4, 2, seed=1)
    server = StoreServerProcess(tmp_path / "store.db", host=address, token=TOKEN)  # reachable from the other host
    loopback = StoreServerProcess(tmp_path / "other.db", token=TOKEN)
    probe = f"import urllib.request; urllib.request.urlopen('{loopback.url}/health', timeout=2)"
    unreachable = subprocess.run([*on_host, sys.executable, "-c", probe], capture_output=True)
    loopback.stop()
    assert unreachable.returncode != 0  # the trainer's loopback is not the other host's: a loopback URL would fail
    port = free_port()
    grpo = GRPO(
        model, steps=1, tasks_per_step=2, n_samples=2, config=UpdateConfig(lr=1e-3), val_every=0,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        out_dir=tmp_path / "run", checkpoint_every=0,
        gateway=GatewaySettings(host=address, port=port, advertise_url=f"http://{address}:{port}/v1"),
    )  # fmt: skip
    runner = start_runner(server.url, "remote", tmp_path / "remote", host=on_host)
    try:
        Trainer(n_runners=0, store=server.url, token=TOKEN, algorithm=grpo).fit("loop_agents:parity_agent", train, val)
        rollouts, endpoints = asyncio.run(_stored(server.url))
    finally:
        runner.kill()
        runner.wait(10)
        server.stop()
    assert server.url.startswith(f"http://{address}:")
    assert set(endpoints) == {f"http://{address}:{port}/v1"}
    assert grpo.report["steps"] == 1
    assert all(r.status is RolloutStatus.SUCCEEDED for r, _ in rollouts.values())
    assert {a.worker_id for _, attempts in rollouts.values() for a in attempts} == {"remote"}


def test_a_run_on_postgresql_is_served_through_another_store_server(tmp_path, monkeypatch, postgres_url):
    """``store: postgresql://...``: the trainer serves the database with its own store server; a runner started by
    hand reaches the same run through a second store server in front of the same database."""
    monkeypatch.syspath_prepend(str(AGENTS.parent / "agent"))
    second = StoreServerProcess(postgres_url, token=TOKEN)
    runner = subprocess.Popen(
        [sys.executable, "-m", "lightrail.cli", "runner", "--store", second.url, "--agent", "sample_agents:sleeper"]
        + ["-k", "4", "--worker-id", "via-second-server"],
        env={**os.environ, "PYTHONPATH": str(AGENTS.parent / "agent"), "LIGHTRAIL_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        trainer = Trainer(n_runners=0, store=postgres_url, token=TOKEN, runs_dir=tmp_path)
        report = trainer.dev("sample_agents:sleeper", [{"sleep": 0.05} for _ in range(8)], timeout_s=120)
        rollouts, _ = asyncio.run(_stored(second.url))
    finally:
        runner.kill()
        runner.wait(10)
        second.stop()
    assert report.counts.get(RolloutStatus.SUCCEEDED) == 8 and report.store.startswith("postgresql://")
    assert len(rollouts) == 8  # the trainer's server and the second one serve one database
    assert {a.worker_id for _, attempts in rollouts.values() for a in attempts} == {"via-second-server"}
