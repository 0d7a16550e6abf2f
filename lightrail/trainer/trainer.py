"""`Trainer`: wires a store, a store server, runner processes and an algorithm together.

`Trainer.dev` runs an agent on tasks with real runner processes and reports what happened (the first thing to
do with a new agent); `Trainer.fit` hands the same set-up to an `Algorithm`.

Processes of a session::

    trainer (this process) ──HTTP──► store server (`lightrail store serve`, SQLite file) ◄──HTTP── runner × N
         enqueue, wait, read spans                                                   lease, spans, finish

The store server is a child process on a free loopback port with a random bearer token (passed through the
environment, never the command line); ``store_host``/``store_port`` expose it to runners on other machines (then
with the token the user gives). Runners are ``spawn``-ed processes (`run_runners`), Ray actors on a Ray cluster
(``ray=RaySettings(...)``, `lightrail.agent.ray`), and/or runners started by hand anywhere that can reach the
store (``lightrail runner --store URL --agent REF``); with ``n_runners=0`` and no Ray, only those serve the run.
Every kind leases from the same store, so a runner that joins late, leaves or dies changes only throughput. A
`Store` object without a URL (e.g. a `MemoryStore`) cannot be reached by other processes: runners then run in
this process, as tasks of the trainer's event loop (useful in tests and notebooks).

Concurrency model: one event loop in the trainer process; waiting on rollouts is `Store.wait` (event-driven
long polls), never sleep loops. Child processes are stopped with SIGTERM (graceful), then killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lightrail._net import is_loopback_host
from lightrail.agent.agent import LitAgent, agent_reference, check_agent_file, load_agent
from lightrail.agent.cli import DEFAULT_CONCURRENCY
from lightrail.agent.processes import RUNNER_ENV, RunnerProcesses, run_runners
from lightrail.algorithms.protocol import Algorithm, TrainerContext, cancel_unfinished
from lightrail.inspection.report import DevReport, build_report
from lightrail.store import check_store, redact_url
from lightrail.store.base import Store
from lightrail.trainer.children import ChildWatch
from lightrail.trainer.result import FitResult
from lightrail.types import LLM, Mode, PromptTemplate, Resources, RetryPolicy, Task

if TYPE_CHECKING:
    from lightrail.agent.ray import RaySettings
    from lightrail.gateway.backends import Backend
    from lightrail.tracking import LoggerSettings, Trackers

__all__ = ["StoreServerProcess", "Trainer", "as_tasks"]

TOKEN_ENV = "LIGHTRAIL_TOKEN"


def as_tasks(items: Iterable[Any]) -> list[Task]:
    """Tasks from `Task` objects or bare task inputs (anything else is taken as a task's ``input``)."""
    return [item if isinstance(item, Task) else Task(input=item) for item in items]


class StoreServerProcess:
    """A ``lightrail store serve`` child process on a free loopback port with a random token.

    Readiness is the server's own "listening on URL" line (it binds before printing), not a polling loop.
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        startup_timeout_s: float = 30.0,
    ):
        self.token = token or secrets.token_urlsafe(24)
        env = {**os.environ, TOKEN_ENV: self.token}
        cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", str(db), "--host", host]
        cmd += ["--port", str(port), "--exit-with-parent"]  # the server must not outlive a trainer killed hard
        # its own session: a Ctrl-C at the terminal reaches the trainer alone, which stops the server last, once its
        # runners and gateway no longer need it (`--exit-with-parent` covers a trainer killed hard)
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True, start_new_session=True)
        stdout = self.process.stdout
        assert stdout is not None  # stdout=PIPE
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(startup_timeout_s)
        if not line or "listening on " not in line[0]:
            self.stop()
            raise RuntimeError(f"the store server did not start (exit code {self.process.poll()}); see its output")
        self.url = _reachable(line[0].rsplit("listening on ", 1)[1].strip())
        # keep draining stdout so a chatty server never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in stdout], daemon=True).start()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)


@dataclass
class _Session:
    store: Store
    label: str
    health_check: Callable[[], None]
    stop_runners: Callable[[], Any]
    watch: ChildWatch = field(default_factory=ChildWatch)
    """The session's watch of the processes a run needs (the algorithm's are added through `watch_child`)."""
    _handed_over: list[Callable[[], None]] = field(default_factory=list)

    def watch_child(self, name: str, exitcode: Callable[[], int | None]) -> Callable[[], None]:
        """`TrainerContext.watch_child`: watch a process the algorithm started."""
        forget = self.watch.add(name, exitcode)
        self._handed_over.append(forget)
        return forget

    def forget_algorithm_children(self) -> None:
        """Stop watching the processes the algorithm handed over (its ``close`` stops them on purpose); the
        session's own (store server, runners) stay watched until the runners are stopped."""
        for forget in self._handed_over:
            forget()
        self._handed_over.clear()

    extras: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Run agents on tasks with a store and runner processes; train them with an `Algorithm`.

    ``store``: None (a fit's: ``store.db`` in its algorithm's ``out_dir``; a dev run's: a fresh SQLite file under
    ``./runs/<timestamp>/store.db``), a SQLite path (a folder means its ``store.db``), ``memory:``, a
    store server URL (``http://...``; its token from ``token`` or ``$LIGHTRAIL_TOKEN``), or a `Store` object
    (one with a ``url`` attribute, like `StoreClient`, is shared with runner processes; any other runs the
    runners in this process). ``n_runners`` processes each run up to ``concurrency`` rollouts at once, under
    ``runner_python`` if given (another environment's interpreter, for a framework that cannot be installed
    next to the trainer's; see `run_runners`). ``otel=True`` runs them with OpenTelemetry on: the agent
    framework's spans are stored in each attempt, and LLM calls link to them (see `Runner`; needs
    ``lightrail[otel]``).
    ``retry`` is the `RetryPolicy` of the rollouts the trainer enqueues.

    Runners on other machines: ``ray=RaySettings(address="auto", n=8, k=4)`` runs them as Ray actors (then
    ``n_runners`` defaults to 0 local processes); ``n_runners=0`` without Ray waits for runners started by hand
    (``lightrail runner --store URL --agent REF -k K``; the trainer prints that command). Either way the store must
    be reachable from them: a store server URL or a PostgreSQL URL they can reach, or the trainer's own store server
    bound with ``store_host="0.0.0.0"`` (``store_port`` fixes its port) and a ``token`` they are given. The model
    they call is the algorithm's business (`GRPO`'s ``gateway`` settings).

    Experiment tracking (`lightrail.tracking`): ``loggers`` (names or `LoggerSettings`: ``tensorboard``,
    ``mlflow``, ``wandb``; default TensorBoard when installed) mirror what the algorithm records, under its
    ``out_dir``; ``experiment`` names the MLflow experiment / W&B project, ``run_config`` is logged first.

    Example::

        report = Trainer(n_runners=2, concurrency=4).dev("my_agents:solve", tasks)
        assert report.counts.get(RolloutStatus.FAILED, 0) == 0
    """

    def __init__(
        self,
        n_runners: int | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        *,
        algorithm: Algorithm | None = None,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        runs_dir: str | os.PathLike[str] = "runs",
        grace_s: float = 10.0,
        console: Any = None,
        runner_python: str | None = None,
        otel: bool = False,
        ray: RaySettings | None = None,
        store_host: str = "127.0.0.1",
        store_port: int = 0,
        loggers: Sequence[str | LoggerSettings] | None = None,
        experiment: str | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        if n_runners is None:
            n_runners = 0 if ray is not None else 2
        if n_runners < 0 or concurrency < 1:
            raise ValueError("n_runners must be >= 0 and concurrency >= 1")
        if algorithm is not None and not all(callable(getattr(algorithm, m, None)) for m in ("setup", "run", "close")):
            raise TypeError(
                f"algorithm: expected an Algorithm (GRPO(...), SFT(...), APO(...)), got {algorithm!r}"[:160]
            )
        if not 0 <= store_port < 65536:
            raise ValueError(f"store_port must be a port number (0 for any free one), not {store_port}")
        if otel and runner_python is None:
            from lightrail.agent.runner import require_otel

            require_otel()  # now, not when the first runner starts
        self.n_runners = n_runners
        self.ray = ray
        self.store_host = store_host
        self.store_port = store_port
        if isinstance(store, str):
            from lightrail.store import store_kind

            store_kind(store)  # a URL lightrail does not serve fails here, in one line, not in the first run
        self.store = store
        self.concurrency = concurrency
        self.algorithm = algorithm
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self.retry = retry or RetryPolicy()
        self.runs_dir = Path(runs_dir)
        self.grace_s = grace_s
        self.runner_python = runner_python
        self.otel = otel
        self.loggers = loggers
        self.experiment = experiment
        self.run_config = run_config
        if console is None:
            from rich.console import Console

            console = Console()
        self.console = console
        self.token_source = f"Trainer(token=...) or ${TOKEN_ENV}"
        """Where the store's token comes from, as the token errors name it (a command sets its flag here)."""

    # -- dev ------------------------------------------------------------------------------------------------

    def dev(
        self,
        agent: str | LitAgent | Callable[..., Any],
        tasks: Iterable[Any],
        resources: Resources | dict[str, LLM | PromptTemplate] | None = None,
        *,
        timeout_s: float | None = None,
        llm: Backend | None = None,
        sampling: Mapping[str, Any] | None = None,
        llm_name: str = "llm",
        mode: Mode = "val",
    ) -> DevReport:
        """Run ``agent`` once on each task (mode ``val``, or ``mode``) with real runner processes, print a per-rollout table
        and a failure digest, and return them as a `DevReport`. Rollouts that succeeded but captured nothing to
        train on (no LLM call through ``llm.endpoint``, calls without token ids, no reward) are named in the table.

        ``agent`` must be importable by the runner processes: a ``"module:object"`` string, or an object whose
        ``__module__``/``__qualname__`` lead back to it (see `agent_reference`; agents of a script run as
        ``__main__`` are loaded from the script's path, so guard its entry point with
        ``if __name__ == "__main__":``; an agent whose class sets ``send_by_value = True``, as `lightrail.agl`'s do,
        is sent by value instead). ``tasks`` are `Task` objects or bare task inputs. ``resources`` (if
        given) are published first and used by every rollout. ``llm``: a model `Backend` (`ScriptedBackend()`,
        `OpenAIUpstream(url)`, a rollout engine's) to start a gateway in front of, recording into the run's store;
        its endpoint is published as the ``llm`` resource (or ``llm_name``; with ``sampling`` as its defaults), as
        training does.
        """
        return _run_sync(
            self.dev_async(
                agent, tasks, resources, timeout_s=timeout_s, llm=llm, sampling=sampling, llm_name=llm_name, mode=mode
            )
        )

    async def dev_async(
        self,
        agent: str | LitAgent | Callable[..., Any],
        tasks: Iterable[Any],
        resources: Resources | dict[str, LLM | PromptTemplate] | None = None,
        *,
        timeout_s: float | None = None,
        llm: Backend | None = None,
        sampling: Mapping[str, Any] | None = None,
        llm_name: str = "llm",
        mode: Mode = "val",
    ) -> DevReport:
        """`dev` for callers already inside an event loop."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        task_list = as_tasks(tasks)
        started = time.monotonic()
        run = _run_name("dev")
        async with self._session(agent, run) as session, contextlib.AsyncExitStack() as gateway:
            ctx = TrainerContext(
                store=session.store, train_tasks=[], val_tasks=task_list, retry=self.retry,
                health_check=session.health_check, run=run,
            )  # fmt: skip
            items = dict(resources.items if isinstance(resources, Resources) else resources or {})
            if llm is not None:
                from lightrail.algorithms.run.policy import ServedPolicy

                served = await ServedPolicy.start(llm, session.store)
                gateway.push_async_callback(served.close)
                refresh = getattr(llm, "refresh_models", None)
                if refresh is not None:  # an upstream names its models once asked
                    await refresh()
                names = llm.model_names() or ["default"]
                items[llm_name] = served.llm(dict(sampling or {}), names[0])
            if resources is not None or llm is not None:
                await ctx.publish(items)
            with Progress(
                TextColumn("[bold]dev[/bold]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            ) as progress:
                bar = progress.add_task("rollouts", total=len(task_list))
                ctx.on_progress = lambda done, total: progress.update(bar, completed=done)
                rollouts = await ctx.run_rollouts(task_list, mode=mode, timeout_s=timeout_s)
            await session.stop_runners()
            report = await build_report(
                session.store, rollouts, store_label=session.label, seconds=time.monotonic() - started
            )
        report.render(self.console)
        return report

    # -- fit ------------------------------------------------------------------------------------------------

    def fit(
        self,
        agent: str | LitAgent | Callable[..., Any],
        train_tasks: Iterable[Any],
        val_tasks: Iterable[Any] = (),
        *,
        summary: bool = True,
    ) -> FitResult:
        """Train ``agent`` with the trainer's ``algorithm``: ``setup``, ``run``, ``close`` (see `Algorithm`),
        with runners serving the rollouts the algorithm enqueues. Returns a `FitResult` (held-out success before
        and after, the checkpoint, the report and the store) and, with ``summary``, prints it as ``lightrail train``
        does. Without a ``store``, the run's store is ``store.db`` in the algorithm's ``out_dir``."""
        return _run_sync(self.fit_async(agent, train_tasks, val_tasks, summary=summary))

    async def fit_async(
        self,
        agent: str | LitAgent | Callable[..., Any],
        train_tasks: Iterable[Any],
        val_tasks: Iterable[Any] = (),
        *,
        summary: bool = True,
    ) -> FitResult:
        """`fit` for callers already inside an event loop."""
        if self.algorithm is None:
            raise ValueError("Trainer.fit needs an algorithm: Trainer(algorithm=...)")
        algorithm = self.algorithm
        run = _run_name(algorithm)
        trackers = await asyncio.to_thread(self._open_trackers, algorithm, run)
        failed = True
        try:
            async with self._session(agent, run, out_dir=getattr(algorithm, "out_dir", None)) as session:
                label = session.label
                ctx = TrainerContext(
                    store=session.store, train_tasks=as_tasks(train_tasks), val_tasks=as_tasks(val_tasks),
                    retry=self.retry, health_check=session.health_check, log=self._log, track=trackers.log, run=run,
                    watch_child=session.watch_child,
                )  # fmt: skip
                try:
                    await algorithm.setup(ctx)
                    await algorithm.run(ctx)
                    failed = False
                except Exception as exc:  # failed on its own: a child that died a moment ago is the cause to name
                    session.watch.name_the_death(exc)  # (before the algorithm's children are forgotten below)
                    raise
                finally:
                    session.forget_algorithm_children()  # what `close` stops, it stops on purpose
                    await algorithm.close()
                    await session.stop_runners()
        finally:
            report = None if failed else getattr(algorithm, "report", None)
            await asyncio.to_thread(trackers.finish, report, failed=failed)
        out_dir = getattr(algorithm, "out_dir", None)
        result = FitResult.of(
            getattr(algorithm, "report", None) or {}, store=label, out_dir=None if out_dir is None else Path(out_dir)
        )
        if summary:  # one line per output, never wrapped: a piped log keeps each path whole
            self.console.print(result.summary(), markup=False, highlight=False, soft_wrap=True)
        return result

    def _open_trackers(self, algorithm: Algorithm, run: str) -> Trackers:
        """The experiment trackers of a fit (`lightrail.tracking`): ``loggers``, by default TensorBoard when it is
        installed, writing in the algorithm's ``out_dir`` (else ``runs_dir/<run>``); they get the run config (or the
        algorithm's class) first."""
        from lightrail.tracking import open_trackers

        loggers = self.loggers if self.loggers is not None else _default_loggers()
        out_dir = getattr(algorithm, "out_dir", None) or self.runs_dir / run
        name = Path(run).name
        trackers = open_trackers(loggers, out_dir, run_name=name, experiment=self.experiment)
        trackers.start(
            dict(self.run_config) if self.run_config is not None else {"algorithm": type(algorithm).__name__}
        )
        return trackers

    def _log(self, step: int, **metrics: Any) -> None:
        shown = "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        self.console.print(f"[bold]step {step}[/bold]  {shown}")

    # -- plumbing -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _session(self, agent: Any, run: str, *, out_dir: Any = None) -> AsyncIterator[_Session]:
        """Store (+ server process) and runners for one dev/fit run; everything is stopped on exit. Before any
        runner starts, the rollouts an earlier session of ``run`` left unfinished are cancelled (`cancel_unfinished`).
        Without a ``store``, a fit's is ``store.db`` in its algorithm's ``out_dir``."""
        if os.environ.get(RUNNER_ENV):
            raise RuntimeError(
                "Trainer started inside a runner process: the agent's script starts training at import time; "
                "guard its entry point with `if __name__ == '__main__':`"
            )
        external = self.n_runners == 0 and self.ray is None
        if isinstance(self.store, Store) and not hasattr(self.store, "url"):
            if self.runner_python is not None or external or self.ray is not None:
                raise ValueError(
                    "runner processes, Ray actors and external runners reach the store over HTTP: give the Trainer "
                    "a store with a URL or a path, not an in-process store object"
                )
            await cancel_unfinished(self.store, run)
            async with self._in_process_session(agent, self.store) as session:
                yield session
            return
        by_value = getattr(agent, "send_by_value", False) is True  # `run_runners` pickles it (cloudpickle)
        ref = agent if by_value else agent_reference(agent)
        if not by_value:
            check_agent_file(ref)  # a script that is not there fails here, not in every runner
        if not by_value and self.runner_python is None and not ref.rpartition(":")[0].endswith(".py"):
            # fail here, with the real error, rather than in every runner process (a script is not loaded a
            # second time in this process: it may be the one running us; an agent for another interpreter
            # may not import in this one)
            load_agent(ref)
        server: StoreServerProcess | None = None
        owned_store = None
        runner_sets: list[Any] = []
        # every process started here: one that exits on its own stops the run in seconds (the runners killed at once)
        watch = ChildWatch(on_exit=lambda: _kill_runners(runner_sets))
        try:
            if isinstance(self.store, Store):
                store, url, label = self.store, self.store.url, self.store.url
                token = self.token
            elif isinstance(self.store, str) and self.store.startswith(("http://", "https://")):
                from lightrail.store.client import StoreClient

                url, label, token = self.store, self.store, self.token
                store = owned_store = StoreClient(url, token=token)
            else:
                db = self._db_path(out_dir)
                if (external or not is_loopback_host(self.store_host)) and not self.token:
                    raise ValueError(
                        f"runners started elsewhere need the store's token: give {self.token_source} "
                        "(the trainer's store server then uses it)"
                    )
                server = await asyncio.to_thread(
                    StoreServerProcess, db, host=self.store_host, port=self.store_port, token=self.token
                )
                from lightrail.store.client import StoreClient

                url, label, token = server.url, redact_url(db), server.token
                watch.add(f"the store server (pid {server.process.pid})", server.process.poll)
                store = owned_store = StoreClient(url, token=token)
                self.console.print(f"[dim]watch it live: lightrail dashboard --store {db}[/dim]")
            await check_store(store, ("enqueue", "query_rollouts", "cancel", "put_resources"),
                              token_hint=f"the store's admin token: {self.token_source}")  # fmt: skip
            await cancel_unfinished(store, run)
            if self.n_runners:
                runner_sets.append(
                    run_runners(
                        url,
                        ref,
                        self.n_runners,
                        self.concurrency,
                        token,
                        grace_s=self.grace_s,
                        runner_python=self.runner_python,
                        otel=self.otel,
                    )  # fmt: skip
                )
            if self.ray is not None:
                from lightrail.agent.ray import start_ray_runners

                runner_sets.append(
                    await asyncio.to_thread(
                        start_ray_runners,
                        url,
                        ref,
                        token=token,
                        settings=self.ray,
                        otel=self.otel,
                        grace_s=self.grace_s,
                    )  # fmt: skip
                )
            if external:
                self.console.print(
                    f"[bold]waiting for runners[/bold]: start them where the agent's tools live with\n"
                    f"  {TOKEN_ENV}=<token> lightrail runner --store {url} --agent {ref} -k {self.concurrency}\n"
                    f"where <token> is best a runner token (it can touch only the attempts it leases):\n"
                    f"  {TOKEN_ENV}=<admin token> lightrail token create --store {url} --role runner --expires 7d"
                )
            stopped = False
            for process in runner_sets[0].processes if self.n_runners else []:  # (Ray's actors come and go)
                watch.add(f"runner process {process.name} (pid {process.pid})", _exitcode(process))

            async def stop_runners() -> None:
                nonlocal stopped
                await watch.stop()
                if not stopped:
                    stopped = True
                    for runners in runner_sets:  # after a child died, no grace: the run is over (a resume cancels
                        # what they held), and without their store they could only retry
                        stop = (0, 1) if watch.died else (self.grace_s,)
                        await asyncio.to_thread(runners.stop, *stop)

            try:
                check = _runners_alive_check(runner_sets[0]) if runner_sets and not self.ray else (lambda: None)
                watch.start()
                yield _Session(store, label, check, stop_runners, watch)
            except (asyncio.CancelledError, Exception) as exc:
                watch.name_the_death(exc)
                raise
            finally:
                await stop_runners()
        finally:
            watch.close()
            for runners in runner_sets:  # a failed start: the sets already started must not outlive the session
                await asyncio.to_thread(runners.stop, 0)
            if owned_store is not None:
                await owned_store.close()
            if server is not None:
                await asyncio.to_thread(server.stop)

    @contextlib.asynccontextmanager
    async def _in_process_session(self, agent: Any, store: Store) -> AsyncIterator[_Session]:
        from lightrail.agent.runner import Runner

        loaded = load_agent(agent)
        runners = [
            Runner(
                store, loaded, concurrency=self.concurrency, handle_signals=False, grace_s=self.grace_s, otel=self.otel
            )
            for _ in range(self.n_runners)
        ]
        tasks = [asyncio.ensure_future(r.run()) for r in runners]

        def check() -> None:
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise RuntimeError("a runner crashed") from t.exception()

        watch = ChildWatch()  # (no process of its own: the algorithm's, handed over with `watch_child`)

        async def stop_runners() -> None:
            await watch.stop()
            for r in runners:
                r.stop()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            watch.start()
            yield _Session(store, type(store).__name__, check, stop_runners, watch)
        except (asyncio.CancelledError, Exception) as exc:
            watch.name_the_death(exc)
            raise
        finally:
            watch.close()
            await stop_runners()

    def _db_path(self, out_dir: Any = None) -> str:
        """The store the trainer's own server opens: ``out_dir/store.db`` (a fit's run folder: a resumed run finds
        its rollouts again), else a new SQLite file per run by default, or the URL or path given (a file's directory
        is created)."""
        if self.store is None and out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            return str(Path(out_dir) / "store.db")
        if self.store is None:
            run_dir = self.runs_dir / time.strftime("%Y%m%d-%H%M%S")
            while run_dir.exists():  # two runs in one second: keep both
                run_dir = run_dir.with_name(run_dir.name + "-" + secrets.token_hex(2))
            run_dir.mkdir(parents=True)
            return str(run_dir / "store.db")
        from lightrail.store import resolve_store, sqlite_path, store_kind

        db = resolve_store(str(self.store))  # a run folder means its store.db, as for every command
        if store_kind(db) == "sqlite":  # a URL lightrail does not serve is a one-line ValueError here
            sqlite_path(db)
        return db


def _default_loggers() -> list[str]:
    """TensorBoard when it is installed (``lightrail[train]``), else none: ``metrics.jsonl`` has everything."""
    import importlib.util

    return ["tensorboard"] if all(importlib.util.find_spec(m) for m in ("torch", "tensorboard")) else []


def _run_name(what: Any) -> str:
    """The run tag of a `dev` call or an algorithm's `fit`: the algorithm's ``out_dir`` when it has one (a resumed
    run keeps its name), else the command or the algorithm's class and the start time."""
    out_dir = getattr(what, "out_dir", None)
    if out_dir is not None:
        return str(out_dir)
    name = what if isinstance(what, str) else type(what).__name__.lower()
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _reachable(url: str) -> str:
    """A server's printed URL, with this machine's host name in place of a wildcard bind address (0.0.0.0, ::),
    which is no address a client can connect to."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host.strip("[]") in ("0.0.0.0", "::"):
        return parts._replace(netloc=f"{socket.gethostname()}:{parts.port}").geturl()
    return url


def _kill_runners(runner_sets: Sequence[Any]) -> None:
    for runners in runner_sets:
        if isinstance(runners, RunnerProcesses):  # (Ray's actors are Ray's to stop)
            for process in runners.alive():
                process.kill()


def _exitcode(process: Any) -> Callable[[], int | None]:
    return lambda: process.exitcode


def _runners_alive_check(runners: RunnerProcesses) -> Callable[[], None]:
    def check() -> None:
        if not runners.alive():
            codes = [p.exitcode for p in runners.processes]
            raise RuntimeError(f"every runner process exited (exit codes {codes}) before the rollouts finished")

    return check


def _run_sync(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running: the usual case
        pass
    else:
        coro.close()
        raise RuntimeError("called from a running event loop: use `await trainer.dev_async(...)` / `fit_async`")
    # outside the except block, so the run's own errors are not chained behind "no running event loop"
    return asyncio.run(coro)
