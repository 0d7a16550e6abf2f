"""Continuous learning from production traffic, on a CPU: simulated users ask the served calculator agent, a checker
rewards each session some seconds later, ``lightrail learn`` rounds turn rewarded sessions into promoted policies,
and the serving gateway swaps each one in while users keep asking.

What runs (each a real process or server, as in production):

- ``lightrail store serve``: the store (SQLite file) that sessions and feedback go to;
- ``lightrail gateway serve --policies POLICIES --record``: serves the current policy with the embedded engine,
  records every call under its session (the ``x-lightrail-session`` header), swaps in each promotion;
- users: threads running the unmodified calculator agent (`lightrail.demos.calculator.agent.solve`) against the
  gateway, each asking again after a seeded random pause;
- the checker: posts each session's reward (1 for the right answer) with `lightrail.feedback` after a random delay;
- learning: `learn_round` (what ``lightrail learn`` runs) whenever enough rewarded sessions are new: off-policy
  update, gate on held-out problems through real runners, promote or refuse.

The model is the demo's ~6 M-parameter Llama after its supervised warm start on an imperfect teacher (as in
``lightrail demo``). Output under ``--out``: ``served_success.png`` (served success per window, promotions
marked), ``report.json``, ``learn.yaml`` (the same rounds as a ``lightrail learn`` config), ``policies/``.

    python -m examples.continuous.demo --quick         # ~13 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT = "lightrail.demos.calculator.train:calculator_agent"
DATA = "lightrail.demos.calculator.data:make_splits"


@dataclass
class ContinuousSettings:
    """Budgets of one run; `quick` is what ``bench/continuous.py --quick`` runs."""

    minutes: float = 20.0
    """How long users keep arriving."""
    users: int = 8
    """Simulated users, each asking again after its answer and a pause (so at most this many sessions in flight)."""
    think_s: float = 0.5
    """Mean pause of a user between sessions (exponential, seeded per user)."""
    feedback_delay_s: float = 5.0
    """The checker rewards a session after a uniform random delay up to this."""
    windows: int = 8
    """Served success is reported per window: the answered sessions in order of their start, cut into this many
    windows of equal size (serving slows while a round learns, so windows of equal time would hold few sessions)."""
    temperature: float = 1.0
    max_tokens: int = 48
    min_sessions: int = 96
    lr: float = 2e-4
    updates: int = 2
    n_val: int = 64
    tolerance: float = 0.03
    sft_steps: int = 300
    seed: int = 0
    out: Path = field(default_factory=lambda: Path("runs") / time.strftime("continuous-%Y%m%d-%H%M%S"))

    @classmethod
    def quick(cls, **overrides: Any) -> ContinuousSettings:
        # the warm start keeps its 300 steps: at 200 the model calls the tool but does not copy its result yet
        return cls(**{**dict(minutes=5.5, n_val=48, min_sessions=64, windows=4), **overrides})


class _Checker(threading.Thread):
    """Posts each session's reward to the store after its delay (a heap of due times), counting what it sent."""

    def __init__(self, store_url: str) -> None:
        super().__init__(daemon=True, name="checker")
        self.store_url = store_url
        self._due: list[tuple[float, str, float]] = []
        self._cv = threading.Condition()
        self._closing = False
        self.sent = 0
        self.errors: list[str] = []

    def later(self, delay_s: float, session: str, reward: float) -> None:
        with self._cv:
            heapq.heappush(self._due, (time.monotonic() + delay_s, session, reward))
            self._cv.notify()

    def run(self) -> None:
        import lightrail

        while True:
            with self._cv:
                while not self._due or self._due[0][0] > time.monotonic():
                    if self._closing and not self._due:
                        return
                    self._cv.wait(None if not self._due else max(0.0, self._due[0][0] - time.monotonic()))
                _, session, reward = heapq.heappop(self._due)
            try:
                lightrail.feedback(self.store_url, session_id=session, reward=reward, feedback_id=f"check-{session}")
                self.sent += 1
            except Exception as exc:  # counted and reported: the demo's numbers say if feedback was lost
                self.errors.append(f"{session}: {exc!r}")

    def finish(self) -> None:
        """Send everything still due (now, not after its delay) and stop."""
        with self._cv:
            self._due = [(0.0, s, r) for _, s, r in self._due]
            heapq.heapify(self._due)
            self._closing = True
            self._cv.notify()
        self.join()


def run(settings: ContinuousSettings, console: Any = None) -> dict[str, Any]:
    """The whole story; returns the report (also written to ``<out>/report.json``)."""
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from lightrail.continuous.learn import GateSettings, LearnConfig
    from lightrail.demos.calculator.agent import solve
    from lightrail.demos.calculator.data import make_splits
    from lightrail.demos.calculator.demo import DemoSettings, build_model, warm_start
    from lightrail.engine.promotions import PolicyRegistry, read_history
    from lightrail.gateway.recording import SESSION_HEADER

    console = console or Console()
    hf_logging.disable_progress_bar()
    out = settings.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started, wall_started = time.monotonic(), time.time()
    train, _ = make_splits(2000, 0, seed=settings.seed)
    demo = DemoSettings(out=out, sft_steps=settings.sft_steps, seed=settings.seed)
    model = warm_start(demo, build_model(demo, train, console), train, console)

    registry = PolicyRegistry(out / "policies")
    registry.init(model)
    store_port, gateway_port = free_port(), free_port()
    store_url = f"http://127.0.0.1:{store_port}"
    config = LearnConfig(
        store=store_url,
        policies=str(registry.root),
        agent=AGENT,
        data=DATA,
        data_args={"n_train": 0, "n_val": settings.n_val, "seed": settings.seed + 1},
        min_sessions=settings.min_sessions,
        updates=settings.updates,
        temperature=settings.temperature,
        config={"lr": settings.lr, "seed": settings.seed},
        gate=GateSettings(
            tolerance=settings.tolerance, sampling={"temperature": 0.0, "max_tokens": settings.max_tokens}
        ),
        every_s=5.0,
    )
    _write_yaml(out / "learn.yaml", config)
    lightrail = [sys.executable, "-m", "lightrail.cli"]
    store_cmd = [*lightrail, "store", "serve", "--db", str(out / "served.db"), "--port", str(store_port)]
    gateway_cmd = [*lightrail, "gateway", "serve", "--store", store_url, "--policies", str(registry.root)]
    gateway_cmd += ["--record", "--poll-s", "1", "--port", str(gateway_port)]
    learn_cmd = [*lightrail, "learn", str(out / "learn.yaml")]
    # serving, learning and the gate's runners share the cores: one torch thread each unless the user says otherwise
    one_thread = {"LIGHTRAIL_TORCH_THREADS": os.environ.get("LIGHTRAIL_TORCH_THREADS", "1")}

    sessions: list[dict[str, Any]] = []  # one per served session: start, end, success, failure
    problems = train[:]
    random.Random(settings.seed).shuffle(problems)
    with (
        spawn(store_cmd, out / "store.log", health=f"{store_url}/health"),
        spawn(gateway_cmd, out / "gateway.log", health=f"http://127.0.0.1:{gateway_port}/health", env=one_thread),
        spawn(learn_cmd, out / "learn.log", env=one_thread),
    ):
        gateway_url = f"http://127.0.0.1:{gateway_port}/v1"
        checker = _Checker(store_url)
        checker.start()
        sampling = {"temperature": settings.temperature, "max_tokens": settings.max_tokens}

        stop_at = time.monotonic() + settings.minutes * 60

        def user(u: int) -> None:
            """One user: ask, wait a moment, ask again, until the run ends (a closed loop: load stays bounded)."""
            rng = random.Random(settings.seed * 1000 + u)
            n = 0
            while time.monotonic() < stop_at:
                problem = problems[(u + n * settings.users) % len(problems)]
                session = f"user{u:02d}-task{n:04d}"
                n += 1
                record: dict[str, Any] = {"session": session, "start": time.monotonic() - started}
                try:
                    answer = solve(
                        problem["question"],
                        base_url=gateway_url,
                        model="policy",
                        extra_headers={SESSION_HEADER: session},
                        **sampling,
                    )
                    record["success"] = answer == problem["answer"]
                    delay = rng.uniform(0, settings.feedback_delay_s)
                    checker.later(delay, session, 1.0 if record["success"] else 0.0)
                except Exception as exc:  # a failed request: counted, the demo's promise is that there are none
                    record["error"] = repr(exc)
                record["end"] = time.monotonic() - started
                sessions.append(record)
                time.sleep(rng.expovariate(1 / settings.think_s))

        console.print(
            f"[bold]serving[/bold] {settings.minutes:g} min of {settings.users} users "
            f"(gateway {gateway_url}, store {store_url}); `lightrail learn {out / 'learn.yaml'}` learns every "
            f"{settings.min_sessions} rewarded sessions (log: {out / 'learn.log'})"
        )
        users = [threading.Thread(target=user, args=(u,), name=f"user{u}") for u in range(settings.users)]
        for thread in users:
            thread.start()
        for thread in users:
            thread.join()
        checker.finish()
    rounds = read_history(registry.root / "metrics.jsonl")
    for r in rounds:
        r["at"] = r["finished_at"] - wall_started
    report = _report(settings, sessions, rounds, registry, checker, started)
    report["plot"] = str(_plot(out / "served_success.png", report, rounds))
    (out / "report.json").write_text(json.dumps(report, indent=2))
    console.print(
        f"\n[bold]served success[/bold] ({settings.windows} windows of equal sessions): "
        + " ".join(f"{w['success']:.0%}" for w in report["windows"])
        + f"\nfirst window {report['served_success_first']:.1%} → last {report['served_success_last']:.1%}; "
        f"{report['swaps']} promotions served, {report['failed_requests']} failed requests, "
        f"{report['rounds']} learn rounds\nplot: {report['plot']}"
    )
    return report


def _report(settings, sessions, rounds, registry, checker, started) -> dict[str, Any]:
    done = [s for s in sessions if "success" in s]
    done.sort(key=lambda s: s["start"])
    n = min(settings.windows, len(done))
    bounds = [round(i * len(done) / n) for i in range(n + 1)] if n else []
    windows = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        inside = done[lo:hi]
        success = sum(s["success"] for s in inside) / len(inside)
        windows.append(
            {"start": inside[0]["start"], "end": inside[-1]["start"], "sessions": len(inside), "success": success}
        )
    promoted = [p for p in registry.history() if p.kind != "initial"]
    return {
        "served_sessions": len(sessions),
        "failed_requests": sum(1 for s in sessions if "error" in s),
        "errors": [s["error"] for s in sessions if "error" in s][:5],
        "feedback_sent": checker.sent,
        "feedback_errors": checker.errors[:5],
        "windows": windows,
        "served_success_first": windows[0]["success"] if windows else 0.0,
        "served_success_last": windows[-1]["success"] if windows else 0.0,
        "rounds": len(rounds),
        "promoted": sum(1 for r in rounds if r["outcome"] == "promoted"),
        "swaps": len(promoted),
        "policy_version": registry.current().version,
        "wall_minutes": (time.monotonic() - started) / 60,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(settings).items()},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def spawn(
    cmd: list[str], log: Path, *, health: str | None = None, timeout_s: float = 120.0, env: dict[str, str] | None = None
) -> Iterator[None]:
    """Run ``cmd`` in its own process group (output to ``log``), wait for ``health`` to answer, stop it after."""
    import urllib.request

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        try:
            deadline = time.monotonic() + timeout_s
            while health is not None:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd[3]} did not start: see {log}")
                try:
                    with urllib.request.urlopen(health, timeout=2):
                        break
                except OSError:
                    time.sleep(0.2)
            yield
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def _plot(path: Path, report: dict[str, Any], rounds: list[dict[str, Any]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    windows = report["windows"]
    middle = [(w["start"] + w["end"]) / 120 for w in windows]
    ax.plot(middle, [w["success"] for w in windows], marker="o", label="served success (window of sessions)")
    for r in rounds:
        if r["outcome"] == "promoted":
            ax.axvline(r["at"] / 60, color="tab:green", alpha=0.5, linestyle="--")
    ax.plot([], [], color="tab:green", alpha=0.5, linestyle="--", label="policy promoted")
    ax.set_xlabel("minutes (middle of the window)")
    ax.set_ylabel("success of served sessions")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Calculator agent in service, learning from its own rewarded sessions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _write_yaml(path: Path, config: Any) -> None:
    import msgspec
    import yaml

    path.write_text(yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short variant (~13 min on 2 cores)")
    parser.add_argument("--minutes", type=float, help="how long users arrive")
    parser.add_argument("--users", type=int, help="simulated users (sessions in flight)")
    parser.add_argument("--min-sessions", type=int, help="rewarded sessions a learn round waits for")
    parser.add_argument("--sft-steps", type=int, help="supervised warm-start steps")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "quick" and v is not None}
    settings = ContinuousSettings.quick(**overrides) if args.quick else ContinuousSettings(**overrides)
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
