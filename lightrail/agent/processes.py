"""Runner processes: `run_runners` starts N of them, each one `Runner` with its own event loop.

Processes are started with the ``spawn`` method (no ``fork`` assumptions: works the same on Linux, macOS and
Windows, and nothing of the parent's threads or event loops leaks into children). A child receives only
picklable arguments: the store URL and token, and the agent as an import reference (``"module:object"``) or a
picklable object. The token travels through the spawn pipe, never the command line. An agent whose class sets
``send_by_value = True`` (`lightrail.agl`'s) is cloudpickled instead and its runners are started as ``PYTHON -c``
under this interpreter (below): spawn would run the parent's script again in each child.

``runner_python`` runs the runners under another interpreter (an environment where the agent's framework is
installed, e.g. CrewAI's own venv): each runner is then ``PYTHON -c ...`` reading the same arguments, pickled,
from its stdin. Multiprocessing's spawn cannot do this: it hands the child the parent's ``sys.path``, which would
mix the two environments' site-packages. The child gets only the parent's project paths (entries outside the
parent's installation, like the working directory or a test's folder).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from lightrail._lifeline import exit_with_parent

if TYPE_CHECKING:
    from lightrail.agent.runner import Runner

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
    # A session of its own: a Ctrl-C at the terminal reaches the parent alone, which stops its children once and in
    # order (runners first, while their store still answers); a parent killed hard is the lifeline's business.
    # (A runner started with ``start_new_session`` already leads its session, where setsid() is EPERM.)
    if os.getsid(0) != os.getpid():
        os.setsid()
    exit_with_parent()  # a trainer killed hard must not leave runners retrying a dead store forever
    logging.basicConfig(
        level=log_level, format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(name)s: %(message)s"
    )
    import asyncio

    runner = asyncio.run(serve_runner(store_url, agent, concurrency, token, runner_kwargs, run_kwargs))
    if runner.abandoned_threads:  # sync agents stuck in threads would keep the interpreter from exiting
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


async def serve_runner(
    store_url: str,
    agent: Any,
    concurrency: int,
    token: str | None,
    runner_kwargs: dict[str, Any],
    run_kwargs: dict[str, Any],
    started: Callable[[Runner], None] | None = None,
) -> Runner:
    """The body of every runner process and Ray runner actor: open the store at ``store_url``, turn OpenTelemetry
    on if asked, run one `Runner` until it stops, close the store; returns the `Runner`. ``started(runner)`` is
    called once the runner exists, so its host can stop it (`Runner.stop`)."""
    from lightrail.agent.runner import Runner
    from lightrail.store import open_store

    if runner_kwargs.get("otel") == "otlp":  # framework spans go straight to the store server's /v1/traces
        from lightrail.tracing import otel

        otel.setup(exporter="otlp", store_url=store_url, token=token)
        runner_kwargs = {**runner_kwargs, "otel": True}
    if isinstance(agent, bytes):  # an agent sent by value (`pickled_agent`)
        agent = pickle.loads(agent)
    store = open_store(store_url, token=token)
    try:
        runner = Runner(store, agent, concurrency=concurrency, **runner_kwargs)
        if started is not None:
            started(runner)
        await runner.run(**run_kwargs)
    finally:
        await store.close()
    return runner


def pickled_agent(agent: Any) -> bytes:
    """``agent`` pickled by value with cloudpickle (classes and functions of a script run as ``__main__`` travel
    with it; a runner unpickles it without running the script); a ValueError naming what cannot be sent."""
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(agent))
    except Exception as exc:
        raise ValueError(
            f"cannot send the agent {type(agent).__name__} to the runner processes: {type(exc).__name__}: {exc} "
            "(an attribute holding an open client, lock or thread? create it inside rollout instead)"
        ) from None


def otel_option(otel: bool | str, *, check_installed: bool = True) -> bool | str:
    """The ``otel`` setting as `serve_runner` takes it (False, True or ``"otlp"``), checked once in the parent
    rather than in every child; ValueError for anything but False, True, ``"sink"`` or ``"otlp"``."""
    if otel not in (False, True, "sink", "otlp"):
        raise ValueError(f"otel must be False, True, 'sink' or 'otlp', not {otel!r}")
    if otel and check_installed:
        from lightrail.agent.runner import require_otel

        require_otel()
    return "otlp" if otel == "otlp" else bool(otel)


def _runner_from_stdin() -> None:
    """Entry point of a runner under another interpreter: `_runner_main`'s arguments arrive pickled on stdin."""
    extra_path, args = pickle.loads(sys.stdin.buffer.read())
    # the parent's project paths first, in its order, even those this interpreter has too (a worktree whose other
    # checkout is also on the path: the parent's order decides which ``examples`` is imported)
    sys.path[:] = list(dict.fromkeys([*extra_path, *sys.path]))
    _runner_main(*args)


def _project_paths() -> list[str]:
    """This process's import paths that belong to the project, not to its Python installation: what a runner
    under another interpreter needs to import the agent (``""`` is the working directory, as in ``python -c``)."""
    installs = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
    paths = []
    for entry in sys.path:
        real = os.path.realpath(entry or os.getcwd())
        installed = any(real == root or real.startswith(root + os.sep) for root in installs)
        if not installed and os.path.basename(real) not in ("site-packages", "dist-packages"):  # user site too
            paths.append(real)
    return paths


def _checked_interpreter(python: str) -> str:
    """The absolute path of ``python`` (a path, ``~`` and ``$VARS`` expanded, or a command on ``PATH``), once it
    has shown it can import lightrail; otherwise a ValueError saying what to fix."""
    expanded = os.path.expandvars(os.path.expanduser(python))
    found = shutil.which(expanded)
    if found is None:
        raise ValueError(f"runner_python {python!r}: no such executable")
    probe = subprocess.run(
        [found, "-c", "import lightrail.agent.processes"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(
            f"runner_python {python!r} cannot import lightrail ({last}); install it there, e.g. "
            f"`{found} -m pip install -e '.[openai,otel]'`"
        )
    return os.path.abspath(found)


class InterpreterProcess:
    """A runner under another interpreter, with the part of `multiprocessing.Process`'s interface that
    `RunnerProcesses` uses (``pid``, ``name``, ``exitcode``, ``is_alive``, ``join``, ``kill``)."""

    def __init__(self, python: str, args: tuple[Any, ...], name: str) -> None:
        self.name = name
        code = "from lightrail.agent.processes import _runner_from_stdin; _runner_from_stdin()"
        # its own session, as `_runner_main` makes one: the parent stops it, a terminal's Ctrl-C does not
        self._popen = subprocess.Popen([python, "-c", code], stdin=subprocess.PIPE, start_new_session=True)
        assert self._popen.stdin is not None
        with self._popen.stdin:  # the token travels here, never on the command line
            self._popen.stdin.write(pickle.dumps((_project_paths(), args), protocol=4))

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()


class RunnerProcesses:
    """Handle on runner processes started by `run_runners`."""

    def __init__(self, processes: Sequence[BaseProcess | InterpreterProcess]):
        self.processes = list(processes)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def alive(self) -> list[BaseProcess | InterpreterProcess]:
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
    runner_python: str | None = None,
    otel: bool | str = False,
    **runner_kwargs: Any,
) -> RunnerProcesses:
    """Start ``n`` runner processes against the store server at ``store_url``, each running up to
    ``concurrency`` rollouts at once; returns at once with a handle (use it as a context manager, or call
    `RunnerProcesses.stop`). Extra keyword arguments go to `Runner` (``grace_s``, ``lease_wait_s``, ...).
    ``runner_python`` (a path or command) runs the runners under that interpreter instead of this one; it must
    have lightrail and the agent's dependencies installed. ``otel``: False, True (OpenTelemetry spans through each
    runner's batcher, see `Runner`) or ``"otlp"`` (exported to the store server's ``/v1/traces`` instead).

    Example::

        with run_runners("http://127.0.0.1:4747", "my_agents:solve", n=4, concurrency=8, token=token) as procs:
            ...  # enqueue and wait on the store
    """
    from lightrail.agent.agent import LitAgent, agent_reference

    if getattr(agent_ref, "send_by_value", False) is True:
        # sent by value to children started with `-c` (not spawn: spawn re-runs the parent's script as
        # ``__mp_main__``, which a script without a ``__main__`` guard turns into a recursive start)
        agent_ref = pickled_agent(agent_ref)
        runner_python = runner_python or sys.executable
    elif isinstance(agent_ref, LitAgent) and not isinstance(agent_ref, str):
        # an importable reference is cheaper and safer than pickling the object; else fall back to pickling
        with contextlib.suppress(ValueError):
            agent_ref = agent_reference(agent_ref)
    if otel:  # another interpreter checks its own packages when its Runner starts
        runner_kwargs["otel"] = otel_option(otel, check_installed=runner_python is None)
    ctx = multiprocessing.get_context("spawn")
    run_kwargs = {"max_rollouts": max_rollouts, "idle_exit_s": idle_exit_s}
    args = (store_url, agent_ref, concurrency, token, runner_kwargs, run_kwargs, log_level)
    if runner_python is None:
        python = None
    elif runner_python == sys.executable:
        python = sys.executable  # this interpreter imports lightrail: no probe
    else:
        python = _checked_interpreter(runner_python)
    processes: list[BaseProcess | InterpreterProcess] = []
    try:
        for i in range(n):
            if python is not None:
                processes.append(InterpreterProcess(python, args, name=f"lightrail-runner-{i}"))
                continue
            p = ctx.Process(
                target=_runner_main,
                args=args,
                name=f"lightrail-runner-{i}",
                daemon=False,  # runners clean up (finish attempts) on SIGTERM; daemonic children would be killed
            )
            p.start()
            processes.append(p)
    except BaseException:  # runners already started must not outlive a failed start (their parent lives on)
        RunnerProcesses(processes).stop(grace_s=0)
        raise
    return RunnerProcesses(processes)
