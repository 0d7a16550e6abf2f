"""Runner processes: `run_runners` starts N of them, each one `Runner` with its own event loop.

Processes are started with the ``spawn`` method (no ``fork`` assumptions: works the same on Linux, macOS and
Windows, and nothing of the parent's threads or event loops leaks into children). A child receives only
picklable arguments: the store URL and token, and the agent as an import reference (``"module:object"``) or a
picklable object. The token travels through the spawn pipe, never the command line.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from typing import Any

__all__ = ["RunnerProcesses", "run_runners"]

RUNNER_ENV = "LIGHTRAIL_RUNNER_PROCESS"
"""Set in runner processes; `Trainer.dev` refuses to start runners from inside one (a script without a
``__main__`` guard would otherwise start runners recursively)."""


def _runner_main(
    store_url: str,
    agent: Any,
    concurrency: int,
    token: str | None,
    runner_kwargs: dict[str, Any],
    run_kwargs: dict[str, Any],
    log_level: int,
) -> None:
    os.environ[RUNNER_ENV] = "1"
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(name)s: %(message)s"
    )
    import asyncio

    from lightrail.agent.runner import Runner
    from lightrail.store import open_store

    async def main() -> Runner:
        store = open_store(store_url, token=token)
        runner = Runner(store, agent, concurrency=concurrency, **runner_kwargs)
        try:
            await runner.run(**run_kwargs)
        finally:
            await store.close()
        return runner

    runner = asyncio.run(main())
    if runner.abandoned_threads:  # sync agents stuck in threads would keep the interpreter from exiting
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class RunnerProcesses:
    """Handle on runner processes started by `run_runners`."""

    def __init__(self, processes: Sequence[BaseProcess]):
        self.processes = list(processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def alive(self) -> list[BaseProcess]:
        """Processes still running."""
        return [p for p in self.processes if p.is_alive()]

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for every process to exit (up to ``timeout_s`` in total); True if all did."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for p in self.processes:
            p.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.alive()

    def stop(self, grace_s: float = 10.0, kill_after_s: float = 5.0) -> None:
        """SIGTERM every runner (each stops leasing and gives in-flight rollouts ``grace_s``, see `Runner`),
        wait for them, and kill those still running ``kill_after_s`` after their grace period."""
        for p in self.alive():
            if p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
        if not self.join(grace_s + kill_after_s):
            for p in self.alive():
                p.kill()
            self.join(5.0)

    def __enter__(self) -> RunnerProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_runners(
    store_url: str,
    agent_ref: Any,
    n: int,
    concurrency: int,
    token: str | None = None,
    *,
    max_rollouts: int | None = None,
    idle_exit_s: float | None = None,
    log_level: int = logging.WARNING,
    **runner_kwargs: Any,
) -> RunnerProcesses:
    """Start ``n`` runner processes against the store server at ``store_url``, each running up to
    ``concurrency`` rollouts at once; returns at once with a handle (use it as a context manager, or call
    `RunnerProcesses.stop`). Extra keyword arguments go to `Runner` (``grace_s``, ``lease_wait_s``, ...).

    Example::

        with run_runners("http://127.0.0.1:4747", "my_agents:solve", n=4, concurrency=8, token=token) as procs:
            ...  # enqueue and wait on the store
    """
    from lightrail.agent.agent import LitAgent, agent_reference

    if isinstance(agent_ref, LitAgent) and not isinstance(agent_ref, str):
        # an importable reference is cheaper and safer than pickling the object; else fall back to pickling
        with contextlib.suppress(ValueError):
            agent_ref = agent_reference(agent_ref)
    ctx = multiprocessing.get_context("spawn")
    run_kwargs = {"max_rollouts": max_rollouts, "idle_exit_s": idle_exit_s}
    processes = []
    for i in range(n):
        p = ctx.Process(
            target=_runner_main,
            args=(store_url, agent_ref, concurrency, token, runner_kwargs, run_kwargs, log_level),
            name=f"lightrail-runner-{i}",
            daemon=False,  # runners clean up (finish attempts) on SIGTERM; daemonic children would be killed
        )
        p.start()
        processes.append(p)
    return RunnerProcesses(processes)
