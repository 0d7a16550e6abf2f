"""Remote runner pickup: how fast a runner started by hand, knowing only the store's URL and token, gets work.

A ``lightrail runner`` process is started the way a user starts one on another host: its own working directory and
a bare environment (``PATH``, the agent's import path, ``LIGHTRAIL_TOKEN``), the store as a URL. Per trial the
bench enqueues one rollout while the runner's lease request is parked in the server's long poll, and reads the
attempt's ``started_at`` (the server's clock, same machine) back from the store:

* ``remote_runner_pickup_ms_p50`` / ``_max``: enqueue call start → the remote runner's attempt started (target < 50).
* baseline, same run: ``client_pickup_ms_p50``, the same trial with a `StoreClient` lease in this process
  (bench/store.py's ``pickup_latency``): what the runner process adds on top of the store's own long poll.

    .venv/bin/python bench/_scale_remote.py [--quick]      # one JSON line last
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import REPO, ServerProcess, log  # noqa: E402
from bench.store import TOKEN, make_specs, pickup_latency  # noqa: E402
from lightrail.store import StoreClient  # noqa: E402


def noop(task: dict) -> float:
    """The agent of the pickup trials: returns at once, so each trial measures only the hand-over."""
    return 0.0


async def remote_pickup(server: ServerProcess, workdir: Path, trials: int) -> list[float]:
    env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONPATH": str(REPO), "LIGHTRAIL_TOKEN": TOKEN}
    cmd = [
        sys.executable,
        "-m",
        "lightrail.cli",
        "runner",
        "--store",
        server.url,
        "--agent",
        "bench._scale_remote:noop",
    ]
    runner = subprocess.Popen(
        cmd + ["-k", "1"], cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    trainer = StoreClient(server.url, token=TOKEN)
    out = []
    try:
        # warm-up: the runner has imported everything and its first lease request is parked
        (first,) = await trainer.enqueue(make_specs(1))
        await trainer.wait([first.rollout_id], timeout_s=60)
        for _ in range(trials):
            await asyncio.sleep(0.05)  # the runner's next lease request is parked in the long poll
            t0 = time.time()
            (rollout,) = await trainer.enqueue(make_specs(1))
            (done,) = await trainer.wait([rollout.rollout_id], timeout_s=30)
            (attempt,) = await trainer.query_attempts(done.rollout_id)
            out.append((attempt.started_at - t0) * 1000)
    finally:
        await trainer.close()
        runner.terminate()
        runner.wait(15)
    return out


def measure(quick: bool, smoke: bool = False) -> dict:
    trials = 3 if smoke else 20 if quick else 50
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(Path(tmp) / "remote.db", token=TOKEN).start()
        try:
            remote = asyncio.run(remote_pickup(server, Path(tmp), trials))
            baseline = asyncio.run(pickup_latency(server, trials))
        finally:
            server.stop()
    out = {
        "remote_runner_pickup_ms_p50": round(statistics.median(remote), 2),
        "remote_runner_pickup_ms_max": round(max(remote), 2),
        "client_pickup_ms_p50": round(statistics.median(baseline), 2),
        "remote_pickup_trials": trials,
    }
    log(
        f"remote runner pickup p50 {out['remote_runner_pickup_ms_p50']} ms (in-process client {out['client_pickup_ms_p50']})"
    )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(measure(parser.parse_args().quick)))
