"""Ray runner actors on a real two-node Ray cluster on this machine (`ray_cluster.LocalRayCluster`) against a real
``lightrail store serve`` process: a node lost mid-run costs only its in-flight attempts (lost, then retried through
the store's leases), the supervisor replaces its actors, and the replacements serve; bad settings are clear errors.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

pytest.importorskip("ray", reason="Ray runners need the lightrail[ray] extra")

from ray_cluster import LocalRayCluster  # noqa: E402

from lightrail.agent.ray import RaySettings, start_ray_runners  # noqa: E402
from lightrail.store import StoreClient  # noqa: E402
from lightrail.trainer import StoreServerProcess  # noqa: E402
from lightrail.types import AttemptStatus, RetryPolicy, RolloutSpec, RolloutStatus, Task  # noqa: E402

HERE = Path(__file__).parent
AGENT = "sample_agents:sleeper"  # sleeps task["sleep"] seconds, returns reward 1.0
RUNTIME_ENV = {"env_vars": {"PYTHONPATH": str(HERE)}}  # how the agent's module reaches the actors


@pytest.fixture(scope="module")
def cluster():
    with LocalRayCluster(num_cpus=4) as cluster:  # the head: room for its own runners plus the replacements
        cluster.node2 = cluster.add_node(num_cpus=2, resources={"node2": 100})
        yield cluster


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


def node_with(resource: str) -> str:
    import ray

    (node,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
    return node


async def wait_until(predicate, timeout_s: float, what: str) -> None:
    """A test-side watch on state the test cannot subscribe to (the supervisor's counter)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


def pid_of(worker_id: str) -> int:
    return int(worker_id.split(":")[1])  # worker ids are host:pid:suffix


async def test_a_lost_node_costs_only_its_in_flight_attempts_and_its_actors_are_replaced(cluster, server, store):
    import ray

    policy = RetryPolicy(lease_s=2.0, max_attempts=5)
    specs = [RolloutSpec(task=Task(input={"sleep": 1.0}), policy=policy) for _ in range(32)]
    rollouts = await store.enqueue(specs)
    runners = await asyncio.to_thread(
        start_ray_runners, server.url, AGENT, token=server.token, address=cluster.address, n=4, k=2,
        runtime_env=RUNTIME_ENV, grace_s=1.0,
    )  # fmt: skip
    try:
        first = runners.actors
        placed = ray.get([actor.ready.remote() for actor in first])
        node2 = node_with("node2")
        on_node2 = {p["pid"] for p in placed if p["node_id"] == node2}
        assert on_node2, f"SPREAD placed no runner on the second node: {placed}"

        # kill the node while its runners hold leases
        async def leases_on_node2() -> int:
            running = await store.query_rollouts(status=[RolloutStatus.RUNNING])
            attempts = [(await store.query_attempts(r.rollout_id))[-1] for r in running]
            return sum(a.status is AttemptStatus.RUNNING and pid_of(a.worker_id) in on_node2 for a in attempts)

        deadline = time.monotonic() + 30
        while await leases_on_node2() < 2:
            assert time.monotonic() < deadline, "the second node's runners never leased a rollout"
            await asyncio.sleep(0.05)
        cluster.node2.kill()

        done = await store.wait([r.rollout_id for r in rollouts], timeout_s=60)
        assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * len(rollouts)
        lost = 0
        for r in rollouts:
            attempts = await store.query_attempts(r.rollout_id)
            statuses = [a.status for a in attempts]
            assert statuses.count(AttemptStatus.SUCCEEDED) == 1, statuses  # finished once, never twice
            assert set(statuses) <= {AttemptStatus.SUCCEEDED, AttemptStatus.LOST}, statuses
            lost += statuses.count(AttemptStatus.LOST)
            assert all(pid_of(a.worker_id) in on_node2 for a in attempts if a.status is AttemptStatus.LOST)
        assert lost >= 1  # the node died holding leases: those attempts were lost and retried elsewhere

        # the supervisor noticed the dead actors and replaced them; the replacements serve new work
        await wait_until(lambda: runners.replaced >= len(on_node2), 30, f"replaced={runners.replaced}")
        assert runners.alive()
        fresh = [a for a in runners.actors if a not in first]
        fresh_pids = {p["pid"] for p in ray.get([actor.ready.remote() for actor in fresh], timeout=60)}
        more = await store.enqueue([RolloutSpec(task=Task(input={"sleep": 0.3}), policy=policy) for _ in range(8)])
        done = await store.wait([r.rollout_id for r in more], timeout_s=30)
        assert [r.status for r in done] == [RolloutStatus.SUCCEEDED] * len(more)
        served_by = {pid_of(a.worker_id) for r in more for a in await store.query_attempts(r.rollout_id)}
        assert served_by & fresh_pids, (served_by, fresh_pids)
    finally:
        await asyncio.to_thread(runners.stop, 2.0)
    assert not runners.alive()
    assert not ray.is_initialized()  # start_ray_runners connected, so stop() disconnected


def test_bad_settings_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown Ray actor option.*num_cpu"):
        RaySettings(resources={"num_cpu": 1})
    with pytest.raises(ValueError, match="resources.num_gpus must be a number"):
        RaySettings(resources={"num_gpus": "two"})
    with pytest.raises(msgspec.ValidationError, match="not 'auto'.*HOST:PORT"):
        msgspec.convert({"address": "head-node"}, RaySettings)  # as the trainer config decodes it
    with pytest.raises(msgspec.ValidationError, match="unknown field `nodes`"):
        msgspec.convert({"nodes": 3}, RaySettings)


async def test_resources_no_node_offers_and_an_agent_that_does_not_import_fail_at_start(cluster, server):
    import ray

    start = dict(token=server.token, address=cluster.address, n=1, k=1, runtime_env=RUNTIME_ENV)
    with pytest.raises(ValueError, match=r"no node of the cluster .* offers \{'CPU': 1.0, 'gpu_island': 1.0\}"):
        await asyncio.to_thread(
            start_ray_runners, server.url, AGENT, resources={"resources": {"gpu_island": 1}}, **start
        )
    assert not ray.is_initialized()  # a failed start leaves no connection behind
    with pytest.raises(
        RuntimeError,
        match="failed to start: MissingReference: agent 'no_such_module:agent': no module named 'no_such_module'",
    ):
        await asyncio.to_thread(start_ray_runners, server.url, "no_such_module:agent", **start)
    assert not ray.is_initialized()


def test_a_trainer_runs_its_rollouts_on_ray_actors_only(cluster, tmp_path, monkeypatch):
    """``Trainer(ray=RaySettings(...))`` (``trainer: {runners: {ray: ...}}`` in a config): no runner process of its
    own, every rollout served by the actors, which the trainer stops with its session."""
    import ray

    from lightrail import Trainer

    monkeypatch.syspath_prepend(str(HERE))  # the trainer checks that the agent imports before it starts
    settings = RaySettings(address=cluster.address, n=2, k=3, runtime_env=RUNTIME_ENV)
    trainer = Trainer(ray=settings, runs_dir=tmp_path / "runs", grace_s=1.0)
    assert trainer.n_runners == 0
    report = trainer.dev(AGENT, [{"sleep": 0.2} for _ in range(12)])
    assert report.counts.get(RolloutStatus.SUCCEEDED) == 12
    assert {row.reward for row in report.rows} == {1.0}
    assert not ray.is_initialized()  # the session stopped its actors and closed the connection it opened
