"""Ray runners losing a node mid-run: every rollout still finishes once, and how long the loss costs.

A real two-node Ray cluster on this machine (`tests/agent/ray_cluster.py`: a head with 4 CPUs, a second node with 2
CPUs and a ``node2`` resource, each its own ``ray start --block`` session on its own loopback address) and a real
``lightrail store serve`` process (SQLite). `start_ray_runners` places n=4 actors x k=4 rollouts (SPREAD: two per
node); the agent sleeps 0.5 s per rollout (``sample_agents:sleeper``); leases last 2 s.

Two runs of the same rollouts, in this order, each timed from enqueue to the last rollout finished:

* ``ray_run_s_no_failure`` -- the baseline: both nodes serve the whole run;
* ``ray_run_s`` -- the second node is SIGKILLed (every process of its session) once a quarter of the rollouts
  has succeeded. Its actors' in-flight attempts are lost when their leases expire and retried on the head; the
  supervisor notices the dead actors (``ray.wait`` on their ``run`` calls) and starts replacements on the head.

Figures of the failure run: ``ray_rollouts_total``, ``ray_rollouts_finished`` (succeeded),
``ray_rollouts_lost`` (rollouts that did not succeed: must be 0), ``ray_rollouts_finished_twice`` (must be 0),
``ray_attempts_lost`` (attempts lost with the node and retried), ``ray_actors_replaced``.

Run alone: ``python bench/_scale_ray.py --quick`` prints one JSON line (progress on stderr).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TEST_AGENTS = REPO / "tests" / "agent"
sys.path[:0] = [str(REPO), str(TEST_AGENTS)]

from ray_cluster import LocalRayCluster  # noqa: E402

from lightrail.agent.ray import start_ray_runners  # noqa: E402
from lightrail.store import StoreClient  # noqa: E402
from lightrail.trainer import StoreServerProcess  # noqa: E402
from lightrail.types import AttemptStatus, RetryPolicy, RolloutSpec, RolloutStatus, Task  # noqa: E402

AGENT = "sample_agents:sleeper"
SLEEP_S = 0.5
N, K = 4, 4


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


async def _run(cluster: LocalRayCluster, server: StoreServerProcess, total: int, kill_node2: bool) -> dict[str, Any]:
    done_before = (await _counts(server)).get(RolloutStatus.SUCCEEDED, 0)  # the store's counts span both runs
    store = StoreClient(server.url, token=server.token)
    runners = await asyncio.to_thread(
        start_ray_runners, server.url, AGENT, token=server.token, address=cluster.address, n=N, k=K,
        runtime_env={"env_vars": {"PYTHONPATH": str(TEST_AGENTS)}}, grace_s=1.0,
    )  # fmt: skip
    try:
        policy = RetryPolicy(lease_s=2.0, max_attempts=5)
        t0 = time.monotonic()
        rollouts = await store.enqueue(
            [RolloutSpec(task=Task(input={"sleep": SLEEP_S}), policy=policy) for _ in range(total)]
        )
        ids = [r.rollout_id for r in rollouts]
        if kill_node2:
            while (await store.counts()).get(RolloutStatus.SUCCEEDED, 0) < total // 4 + done_before:
                await asyncio.sleep(0.05)
            log(f"killing the second node at {time.monotonic() - t0:.2f}s")
            cluster.nodes[1].kill()
        done = await store.wait(ids, timeout_s=300)
        run_s = time.monotonic() - t0
        finished = sum(r.status is RolloutStatus.SUCCEEDED for r in done)
        attempts = [await store.query_attempts(rid) for rid in ids]
        twice = sum([a.status for a in per].count(AttemptStatus.SUCCEEDED) > 1 for per in attempts)
        lost_attempts = sum(a.status is AttemptStatus.LOST for per in attempts for a in per)
        replaced = runners.replaced
    finally:
        await asyncio.to_thread(runners.stop, 2.0)
        await store.close()
    return {
        "total": total,
        "finished": finished,
        "lost": total - finished,
        "finished_twice": twice,
        "attempts_lost": lost_attempts,
        "replaced": replaced,
        "run_s": round(run_s, 2),
    }


async def _counts(server: StoreServerProcess) -> dict[RolloutStatus, int]:
    store = StoreClient(server.url, token=server.token)
    try:
        return await store.counts()
    finally:
        await store.close()


def measure(quick: bool, smoke: bool = False) -> dict[str, Any]:
    """Both runs on one cluster; returns the figures named in the module docstring."""
    total = 8 if smoke else 64 if quick else 256
    with tempfile.TemporaryDirectory(prefix="lr-bench-ray-") as tmp, LocalRayCluster(num_cpus=4) as cluster:
        t0 = time.monotonic()
        cluster.add_node(num_cpus=2, resources={"node2": 100})
        log(f"cluster of 2 nodes up in {time.monotonic() - t0:.1f}s")
        server = StoreServerProcess(Path(tmp) / "store.db")
        try:
            baseline = asyncio.run(_run(cluster, server, total, kill_node2=False))
            log(f"no failure: {baseline}")
            failure = asyncio.run(_run(cluster, server, total, kill_node2=True))
            log(f"node lost: {failure}")
        finally:
            server.stop()
    return {
        "ray_rollouts_total": failure["total"],
        "ray_rollouts_finished": failure["finished"],
        "ray_rollouts_lost": failure["lost"],
        "ray_rollouts_finished_twice": failure["finished_twice"],
        "ray_attempts_lost": failure["attempts_lost"],
        "ray_actors_replaced": failure["replaced"],
        "ray_run_s": failure["run_s"],
        "ray_run_s_no_failure": baseline["run_s"],
        "ray_runners": f"{N} actors x {K} rollouts, {SLEEP_S}s per rollout, lease 2s",
    }


if __name__ == "__main__":
    print(json.dumps(measure(quick="--quick" in sys.argv)))
