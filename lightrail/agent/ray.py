"""Runners as Ray actors: `start_ray_runners` places N runners on a Ray cluster and keeps N of them running.

Each actor is one runner process of the cluster: it opens the store by URL and token, loads the agent from its
import reference and runs one `Runner` with ``k`` concurrent rollouts (`lightrail.agent.processes.serve_runner`,
the same body as a local runner process) until it is told to stop. Losing work is safe by construction: a runner
whose node dies stops heartbeating, its attempts become ``lost`` when their leases expire and the store requeues
their rollouts (`RetryPolicy`), so a dead actor costs only its in-flight attempts' time. Capacity is what the
supervisor restores: it replaces every actor that dies (``RayActorError``/``ActorDiedError`` from its ``run``
call, e.g. when its node is lost) with a new one, placed wherever the cluster has room (``replaced`` counts them).

Concurrency model: in the caller's process, one supervisor thread blocks in ``ray.wait`` on the actors' ``run``
calls (no polling: a call ends only when its actor stops or dies) and is the only writer of the actor list, under
a lock shared with `RayRunners.stop`. In each actor, Ray's async-actor event loop runs the `Runner` (``run``) and
serves ``stop`` and ``ready`` calls between its awaits. Actors are owned by the caller's Ray job: if the caller
dies, Ray stops them (no lifeline needed).

The store token travels as an actor constructor argument (stored in the GCS with the actor's creation task, like
any argument), never on a command line, in an environment variable or a runtime_env, which Ray's dashboard and
state API show.

Ray is imported only here, only when called: ``pip install 'lightrail[ray]'``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from typing import Any

import msgspec

__all__ = ["RayRunners", "RaySettings", "start_ray_runners"]

log = logging.getLogger(__name__)

PLACEMENT_OPTIONS = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "memory",
        "resources",
        "accelerator_type",
        "scheduling_strategy",
        "label_selector",
        "fallback_strategy",
    }
)
"""The Ray actor options `RaySettings.resources` may set; lightrail sets the others (restarts, concurrency)."""
_AMOUNTS = ("num_cpus", "num_gpus", "memory")
_ADDRESS = re.compile(r"^(ray://)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


class RaySettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where and how many runner actors run on a Ray cluster (``trainer: {runners: {ray: {...}}}`` in a config).

    Example::

        RaySettings(address="auto", n=8, k=4, resources={"num_cpus": 1, "resources": {"agent_tools": 1}})
    """

    address: str | None = "auto"
    """``auto``: join the cluster this machine belongs to (``ray start`` ran here, or $RAY_ADDRESS); ``HOST:PORT``:
    the head node's GCS; ``ray://HOST:10001``: through Ray Client; None: start a local Ray instance."""
    n: int = 2
    """Runner actors to keep running (a dead one is replaced)."""
    k: int = 4
    """Rollouts each actor runs at once."""
    resources: dict[str, Any] = msgspec.field(default_factory=dict)
    """Ray actor options per runner: ``num_cpus`` (default 1), ``num_gpus``, ``memory`` (bytes), ``resources``
    (custom resources, ``{NAME: amount}``, e.g. to pin runners to nodes started with ``--resources``),
    ``accelerator_type``, ``scheduling_strategy`` (default ``SPREAD``: one lost node takes as few runners as
    possible), ``label_selector``, ``fallback_strategy``."""
    runtime_env: dict[str, Any] | None = None
    """Ray runtime environment of the actors (``working_dir``, ``py_modules``, ``pip``, ``env_vars``, ...): how the
    agent's code reaches nodes that do not have it installed."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.k < 1:
            raise ValueError(f"ray: n and k must be >= 1 (got n={self.n}, k={self.k})")
        if self.address not in (None, "auto", "local") and not _ADDRESS.match(self.address):
            raise ValueError(
                f"ray: address {self.address!r} is not 'auto', null (a local Ray), HOST:PORT (the head node) "
                "or ray://HOST:PORT (Ray Client)"
            )
        unknown = sorted(set(self.resources) - PLACEMENT_OPTIONS)
        if unknown:
            raise ValueError(
                f"ray: resources has unknown Ray actor option(s) {unknown}; known: {sorted(PLACEMENT_OPTIONS)} "
                "(custom resources go under resources: {resources: {NAME: amount}})"
            )
        for key in _AMOUNTS:
            value = self.resources.get(key)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
                raise ValueError(f"ray: resources.{key} must be a number >= 0, not {value!r}")
        custom = self.resources.get("resources") or {}
        if not isinstance(custom, dict) or any(
            not isinstance(v, int | float) or isinstance(v, bool) or v < 0 for v in custom.values()
        ):
            raise ValueError(f"ray: resources.resources must map resource names to amounts >= 0, not {custom!r}")
        if {"CPU", "GPU"} & set(custom):
            raise ValueError("ray: give CPUs and GPUs as resources.num_cpus / resources.num_gpus, not CPU/GPU")

    def actor_options(self) -> dict[str, Any]:
        """The options each runner actor is created with (placement from ``resources``, lightrail's defaults)."""
        options: dict[str, Any] = {"num_cpus": 1, "scheduling_strategy": "SPREAD", **self.resources}
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        # a dead actor is replaced by the supervisor, not restarted by Ray: its in-flight `run` call could not
        # survive a restart anyway, and a fresh actor may land on any node with room
        return {**options, "max_restarts": 0, "max_task_retries": 0}


class _RunnerActor:
    """One runner in a Ray worker process (wrapped by ``ray.remote`` in `_actor_class`)."""

    def __init__(
        self,
        store_url: str,
        agent: Any,
        k: int,
        token: str | None,
        runner_kwargs: dict[str, Any],
        log_level: int,
    ) -> None:
        from lightrail.agent.processes import RUNNER_ENV

        os.environ[RUNNER_ENV] = "1"
        logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._args = (store_url, agent, k, token, runner_kwargs)
        self._runner: Any = None
        self._stop_grace: float | None = None
        self._stop_requested = False

    def ready(self) -> dict[str, Any]:
        """Load the agent (an import error shows up here, at start); returns where this actor runs: its node id
        and process id (the ``pid`` in its runner's worker id ``host:pid:suffix``)."""
        import ray

        from lightrail.agent.agent import load_agent

        store_url, agent, k, token, runner_kwargs = self._args
        self._args = (store_url, load_agent(agent), k, token, runner_kwargs)
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    async def run(self) -> dict[str, Any]:
        """Run the runner until `stop`; returns what it did (`RunnerStats` as a dict)."""
        import asyncio

        from lightrail.agent.processes import serve_runner

        store_url, agent, k, token, runner_kwargs = self._args
        loop = asyncio.get_running_loop()

        def started(runner: Any) -> None:
            self._runner = runner
            if self._stop_requested:  # stop() came first: stop as soon as the runner's loop state exists
                loop.call_soon(self._stop_runner)

        runner = await serve_runner(store_url, agent, k, token, {**runner_kwargs, "handle_signals": False}, {}, started)
        return {"worker_id": runner.worker_id, "leased": runner.stats.leased, "ended": dict(runner.stats.ended)}

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop leasing; in-flight attempts get ``grace_s`` (default: the runner's own), then are handed back."""
        self._stop_requested, self._stop_grace = True, grace_s
        if self._runner is not None:
            self._stop_runner()

    def _stop_runner(self) -> None:
        if self._stop_grace is not None:
            self._runner.grace_s = self._stop_grace  # read when the runner starts draining, i.e. after this
        self._runner.stop()


_ACTOR_CLASS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(_RunnerActor)
    return _ACTOR_CLASS


class RayRunners:
    """Handle on the runner actors started by `start_ray_runners` (same interface as `RunnerProcesses`)."""

    def __init__(self, settings: RaySettings, actor_args: tuple[Any, ...], options: dict[str, Any], owns_ray: bool):
        self.settings = settings
        self.replaced = 0
        """Actors that died (their node was lost, their process crashed) and were replaced."""
        self.results: list[dict[str, Any]] = []
        """What each actor that stopped normally did (worker id, attempts leased, how they ended)."""
        self._actor_args = actor_args
        self._options = options
        self._owns_ray = owns_ray
        self._lock = threading.Lock()
        self._runs: dict[Any, Any] = {}  # run() ObjectRef -> actor handle; written by the supervisor and start only
        self._stopping = False
        self._supervisor: threading.Thread | None = None

    # -- start and supervise --------------------------------------------------------------------------------------

    def _new_actor(self) -> Any:
        return _actor_class().options(**self._options).remote(*self._actor_args)

    def _start(self, startup_timeout_s: float) -> None:
        import ray

        actors = [self._new_actor() for _ in range(self.settings.n)]
        ready = [actor.ready.remote() for actor in actors]
        with self._lock:  # an actor runs calls from one caller in order: run() starts once ready() has returned
            self._runs.update({actor.run.remote(): actor for actor in actors})
        done, pending = ray.wait(ready, num_returns=len(ready), timeout=startup_timeout_s)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise RuntimeError(f"a Ray runner actor failed to start: {_cause(exc)}") from exc
        if pending:
            raise TimeoutError(
                f"{len(pending)} of {len(ready)} Ray runner actors were not placed within {startup_timeout_s:.0f}s: "
                f"no node has free {_wanted(self._options)} (free now: {_free_resources()}); add nodes or ask for "
                "less in resources"
            )
        self._supervisor = threading.Thread(target=self._supervise, name="lightrail-ray-supervisor", daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        import ray

        while True:
            with self._lock:
                refs = list(self._runs)
            if not refs:
                return
            (ref,), _ = ray.wait(refs, num_returns=1)  # wakes when an actor stops or dies; nothing else to watch
            try:
                self.results.append(ray.get(ref))
                outcome = None
            except ray.exceptions.RayActorError as exc:  # ActorDiedError: its node or process is gone
                outcome = f"died ({_cause(exc)})"
            except ray.exceptions.RayError as exc:
                outcome = f"failed ({_cause(exc)})"
            with self._lock:
                self._runs.pop(ref, None)
                if self._stopping:
                    continue
                if outcome is None:
                    outcome = "stopped by itself"
                actor = self._new_actor()
                self._runs[actor.run.remote()] = actor
                self.replaced += 1
            log.warning("Ray runner actor %s; started a replacement (%d so far)", outcome, self.replaced)

    # -- the RunnerProcesses interface -------------------------------------------------------------------------

    @property
    def actors(self) -> list[Any]:
        """Handles of the actors currently serving (replacements included)."""
        with self._lock:
            return list(self._runs.values())

    def alive(self) -> bool:
        """True while actors are serving (a replacement waiting for a node counts)."""
        with self._lock:
            return not self._stopping and bool(self._runs)

    def stop(self, grace_s: float = 10.0, kill_after_s: float = 5.0) -> None:
        """Tell every actor to stop leasing and give in-flight rollouts ``grace_s`` (then they are handed back for
        a retry, see `Runner`), kill actors still running ``kill_after_s`` after that, and disconnect from Ray if
        `start_ray_runners` connected."""
        import ray

        with self._lock:
            self._stopping = True
            runs = dict(self._runs)
        for actor in runs.values():
            with contextlib.suppress(ray.exceptions.RayError):
                actor.stop.remote(grace_s)
        if runs:
            _, late = ray.wait(list(runs), num_returns=len(runs), timeout=grace_s + kill_after_s)
            for ref in late:
                log.warning("Ray runner actor did not stop within %.1fs: killing it", grace_s + kill_after_s)
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.kill(runs[ref], no_restart=True)
        if self._supervisor is not None:
            self._supervisor.join(kill_after_s)
        for actor in runs.values():  # a stopped actor idles in its worker process: free its resources now
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(actor, no_restart=True)
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayRunners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_ray_runners(
    store_url: str,
    agent_ref: Any,
    *,
    token: str | None = None,
    address: str | None = "auto",
    n: int = 2,
    k: int = 4,
    resources: dict[str, Any] | None = None,
    runtime_env: dict[str, Any] | None = None,
    settings: RaySettings | None = None,
    otel: bool | str = False,
    grace_s: float = 10.0,
    startup_timeout_s: float = 120.0,
    log_level: int = logging.WARNING,
    **runner_kwargs: Any,
) -> RayRunners:
    """Start ``n`` runner actors on the Ray cluster at ``address``, each running up to ``k`` rollouts of the
    agent at once against the store server at ``store_url``; returns once all are placed and have loaded the
    agent, with a handle that keeps ``n`` running until `RayRunners.stop`.

    ``settings`` (a `RaySettings`, as the trainer config holds it) replaces ``address``, ``n``, ``k``,
    ``resources`` and ``runtime_env``. ``resources`` are Ray actor options (see `RaySettings.resources`);
    ``runtime_env`` ships the agent's code or dependencies to the nodes. ``otel`` and extra keyword arguments
    (``lease_wait_s``, ...) go to each `Runner`, as in `run_runners`. Connects to Ray unless this process already
    is (then the existing connection is used, and left open by `RayRunners.stop`).

    Raises ValueError for bad settings or resources no node of the cluster offers, ConnectionError when the
    cluster cannot be reached, RuntimeError when an actor cannot start (e.g. the agent does not import there),
    TimeoutError when the actors cannot be placed within ``startup_timeout_s``.

    Example::

        with start_ray_runners("http://head:4747", "my_agents:solve", token=token, n=8, k=4) as runners:
            ...  # enqueue and wait on the store
    """
    from lightrail.agent.agent import LitAgent, agent_reference
    from lightrail.agent.processes import otel_option

    if settings is None:
        settings = RaySettings(
            address=address, n=n, k=k, resources=dict(resources or {}), runtime_env=runtime_env
        )  # validates
    if isinstance(agent_ref, LitAgent) and not isinstance(agent_ref, str):
        with contextlib.suppress(ValueError):  # a reference is cheaper and safer to ship than a pickled object
            agent_ref = agent_reference(agent_ref)
    if otel:
        runner_kwargs["otel"] = otel_option(otel, check_installed=False)  # checked where the runner runs
    runner_kwargs["grace_s"] = grace_s
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray runners need Ray: pip install 'lightrail[ray]'") from exc

    owns_ray = _connect(settings.address)
    try:
        options = settings.actor_options()
        _check_options(options, settings.address)
        runners = RayRunners(
            settings, (store_url, agent_ref, settings.k, token, runner_kwargs, log_level), options, owns_ray
        )
        try:
            runners._start(startup_timeout_s)
        except BaseException:
            runners.stop(grace_s=0, kill_after_s=0)
            raise
    except BaseException:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
        raise
    return runners


def _connect(address: str | None) -> bool:
    """Connect this process to Ray; True if it did (and so should disconnect), False if it already was."""
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConnectionError(
            f"cannot connect to the Ray cluster at {address!r}: {first} -- start one with `ray start --head` (and "
            "`ray start --address HEAD:PORT` on the other nodes), or set address to null for a local Ray"
        ) from exc
    return True


def _check_options(options: dict[str, Any], address: str | None) -> None:
    """Ray's own validation of the actor options, then: some live node must offer what one actor asks for."""
    import ray

    try:
        _actor_class().options(**options)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"ray: bad resources {options}: {exc}") from exc
    wanted = _wanted(options)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if not any(all(node["Resources"].get(name, 0) >= amount for name, amount in wanted.items()) for node in nodes):
        offered = [{k: v for k, v in node["Resources"].items() if not k.startswith("node:")} for node in nodes]
        raise ValueError(
            f"ray: no node of the cluster at {address!r} offers {wanted} for one runner actor (nodes offer "
            f"{offered}); start a node with `ray start --address HEAD:PORT --resources '{{...}}'` or ask for less"
        )


def _wanted(options: dict[str, Any]) -> dict[str, float]:
    wanted = {"CPU": options.get("num_cpus"), "GPU": options.get("num_gpus"), "memory": options.get("memory")}
    wanted.update(options.get("resources") or {})
    return {name: float(amount) for name, amount in wanted.items() if amount}


def _free_resources() -> dict[str, float]:
    import ray

    with contextlib.suppress(Exception):
        return {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
    return {}


def _cause(exc: BaseException) -> str:
    """One line: what went wrong inside Ray (the actor's own exception when there is one)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(exc)):
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}"
    text = str(exc).strip().splitlines()
    for line in text:
        if "died because" in line or "Error" in line:
            return line.strip()
    return text[0] if text else type(exc).__name__
