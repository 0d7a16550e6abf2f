"""A real Ray cluster of several nodes on this machine, for the Ray runner tests and ``bench/_scale_ray.py``.

Each node is one ``ray start --block`` process in a session of its own: the raylet, the GCS, the agents and every
worker the raylet forks stay in that session (workers get process groups of their own, so a process group is not
enough), so `RayNode.kill` takes down exactly one node (what losing a machine looks like to the cluster), and
`LocalRayCluster.stop` ends every process it started, by session id, never by name (``ray stop`` would stop every
Ray process on the machine, other clusters' included).

Every node has its own loopback address (the head 127.0.0.2, then .3, ...: Ray replaces exactly 127.0.0.1 with the
machine's outward address, so traffic would leave loopback) and free ports (no fixed 8265/10001/52365 that two
clusters would fight over);
the session files live under one short temporary directory that `stop` removes (Unix socket paths must stay
under 108 bytes, so not under pytest's deep ``tmp_path``). The GCS declares a silent node dead after about 1.5 s
(health checks every 500 ms, 3 failures) instead of Ray's default ~15 s, so tests notice the loss quickly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HEAD_IP = "127.0.0.2"
RAY = str(Path(sys.executable).with_name("ray"))
HEALTH_CHECK_ENV = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RayNode:
    """One ``ray start --block`` process group."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, startup_timeout_s: float = 90.0) -> None:
        self.log = log
        self._log_file = open(log, "w")  # noqa: SIM115 - closed in stop/kill
        self.process = subprocess.Popen(
            [RAY, "start", "--block", *args],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: kill() reaches the raylet and its workers, only them
        )
        deadline = time.monotonic() + startup_timeout_s
        while "Ray runtime started" not in log.read_text():  # `ray start` prints it once the node is registered
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ray start failed (exit code {self.process.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    @property
    def session(self) -> int:
        return self.process.pid  # start_new_session: the session id is the leader's pid

    def processes(self) -> list[int]:
        """Pids of this node's processes (the members of its session)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.getsid(int(entry)) == self.session:
                        pids.append(int(entry))
        return pids

    def kill(self) -> None:
        """SIGKILL every process of the node at once (a lost machine: no goodbye to the GCS)."""
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        self._log_file.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM ``ray start --block`` (it shuts its children down), then SIGKILL whatever is left."""
        self.process.terminate()
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        self.kill()


class LocalRayCluster:
    """A head node plus worker nodes added with `add_node`. ``address`` is the GCS address to join or connect to.

    Example::

        with LocalRayCluster(num_cpus=2) as cluster:
            node2 = cluster.add_node(num_cpus=2, resources={"node2": 100})
            ray.init(address=cluster.address)
            ...
            node2.kill()
    """

    def __init__(self, num_cpus: int = 2, resources: dict[str, float] | None = None, env: dict[str, str] | None = None):
        self.temp_dir = Path(tempfile.mkdtemp(prefix="lr-ray-", dir="/tmp"))
        self.env = {**os.environ, **HEALTH_CHECK_ENV, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.nodes: list[RayNode] = []
        self._lock = threading.Lock()
        port = free_port(HEAD_IP)
        self.address = f"{HEAD_IP}:{port}"
        try:
            self.head = self._start(
                [
                    "--head",
                    f"--port={port}",
                    "--include-dashboard=false",
                    f"--dashboard-port={free_port()}",
                    f"--ray-client-server-port={free_port()}",
                    f"--temp-dir={self.temp_dir}",
                ],
                num_cpus,
                resources,
            )
        except BaseException:
            self.stop()
            raise

    def add_node(self, num_cpus: int = 2, resources: dict[str, float] | None = None) -> RayNode:
        """Start another node joining this cluster (same machine, its own raylet and workers)."""
        return self._start([f"--address={self.address}"], num_cpus, resources)

    def _start(self, args: list[str], num_cpus: int, resources: dict[str, float] | None) -> RayNode:
        args = [
            *args,
            f"--node-ip-address=127.0.0.{2 + len(self.nodes)}",
            "--disable-usage-stats",
            f"--num-cpus={num_cpus}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
        ]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        node = RayNode(args, self.env, self.temp_dir / f"node{len(self.nodes)}.log")
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        """Stop every node (workers first, the head last) and remove the session directory."""
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
