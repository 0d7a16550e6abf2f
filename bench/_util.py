"""Helpers shared by benchmarks: progress on stderr, store server processes, realistic span payloads.

Benchmarks print progress to stderr and exactly one JSON object as the last line of stdout.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx

from lightrail.types import Attr, Span

# the model library's per-file weight bars, as the `lightrail` command hides them (read when transformers is first
# imported, which every bench does after this module; inherited by the processes a bench starts)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parents[1]

SMOKE_HELP = (
    "tiny sizes, seconds: every code path of the bench runs and its JSON line carries the keys it declares (KEYS); "
    "tests/test_bench_smoke.py runs it so the bench cannot rot. Its figures mean nothing"
)
"""Help of every bench's ``--smoke`` flag. A bench declares ``KEYS`` (the keys its JSON line always has) and, when
a part needs a component that may be absent here (a framework's venv, vLLM, PostgreSQL, Chromium), ``NEEDS``
(component -> the keys that part adds; ``--smoke`` leaves the part out when the component is missing)."""


def log(*parts: object) -> None:
    """Progress line on stderr (stdout is reserved for the final JSON line)."""
    print(*parts, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A ``lightrail store serve`` child process (the real CLI path) on 127.0.0.1.

    ``start_s`` is the time from spawn to the first 200 on ``/health``.
    """

    def __init__(self, db: str | os.PathLike[str], *, token: str, port: int | None = None):
        self.db = str(db)
        self.token = token
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_s = float("nan")

    def start(self, timeout_s: float = 20.0) -> ServerProcess:
        cmd = [sys.executable, "-m", "lightrail.cli", "store", "serve", "--db", self.db, "--port", str(self.port)]
        env = dict(os.environ, LIGHTRAIL_TOKEN=self.token, PYTHONPATH=str(REPO))
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, cwd=REPO)
        deadline = t0 + timeout_s
        with httpx.Client(timeout=1.0) as http:
            while True:
                try:
                    if http.get(f"{self.url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"store server exited with {self.proc.returncode}")
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"store server not healthy after {timeout_s} s")
                time.sleep(0.002)
        self.start_s = time.perf_counter() - t0
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (the crash the store must survive)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def cpu_s(self) -> float | None:
        """User+system CPU seconds the server process has used so far (Linux /proc)."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def served_engine(model: str, **engine_options: object) -> AsyncIterator[tuple[str, object]]:
    """``(gateway URL, engine)``: the embedded `Engine` on ``model`` (a model name `prepare_model` knows, or a folder)
    behind a lightrail gateway on 127.0.0.1 with an in-memory store; both stopped on exit. What the probes and the
    rollout benches run their agents against."""
    import asyncio

    from lightrail.engine import Engine
    from lightrail.engine.models import prepare_model
    from lightrail.gateway.server import GatewayServer
    from lightrail.store.memory import MemoryStore

    engine = await asyncio.to_thread(Engine.from_pretrained, str(prepare_model(model)), **engine_options)
    try:
        gateway = await GatewayServer(engine, MemoryStore(), port=free_port()).start()
        try:
            yield gateway.url, engine
        finally:
            await gateway.stop()
    finally:
        await engine.close()


def python_loop_ms() -> float:
    """The machine's speed as a fixed pure-Python loop's time (ms, best of 5): machines here differ up to ~3x from
    one session to the next, so recorded figures carry it."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def cpu_amx() -> bool:
    """Whether the CPU has AMX bfloat16 tiles (Xeon Sapphire Rapids and later), where `UpdateConfig.autocast`
    pays: `bench/update.py` measured the update 1.5x faster there."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return False
    return "amx_bf16" in flags


def machine_facts() -> dict:
    """What a reader on another machine needs next to a figure: cores, the 1-minute load, the loop's speed."""
    return {"cores": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2), "python_loop_ms": python_loop_ms()}


def missing_component(name: str) -> str | None:
    """Why the component ``name`` a bench part needs (``vllm``, ``postgres``, ``ray``) is not here, or None when it
    is (found as the tests find it: ``$LIGHTRAIL_VLLM_PYTHON``, ``tests/_postgres.py``'s binaries, the package)."""
    import glob
    import importlib.util
    import shutil

    if name == "vllm":
        python = os.environ.get("LIGHTRAIL_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
        return None if Path(python).is_file() else f"no vLLM venv at {python} (set LIGHTRAIL_VLLM_PYTHON)"
    if name == "postgres":
        found = shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb")
        return None if found else "no PostgreSQL (initdb) on PATH or under /usr/lib/postgresql/*/bin"
    if name == "ray":
        return None if importlib.util.find_spec("ray") else "ray is not installed"
    raise ValueError(f"unknown component {name!r}: expected vllm, postgres or ray")


def run_parts(
    doc: str, parts: dict[str, str], targets: Callable[[dict], dict[str, bool]], needs: dict[str, str] | None = None
) -> None:
    """The main of a benchmark made of parts (modules with ``measure(quick, smoke) -> dict``): ``--quick``,
    ``--smoke`` (parts whose component, ``needs[part]``, is missing are left out), ``--only NAME``; progress on
    stderr, one JSON object last on stdout with the machine's facts, each part's time and the targets."""
    import argparse
    import importlib
    import json

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    parser.add_argument("--only", choices=sorted(parts), action="append", help="run only this part (repeatable)")
    args = parser.parse_args()
    out: dict = {"quick": args.quick, **machine_facts()}
    log(f"machine: {out}")
    started = time.monotonic()
    for name in args.only or parts:
        if args.smoke and name in (needs or {}) and (why := missing_component(needs[name])):  # type: ignore[index]
            log(f"-- {name} left out: {why}")
            continue
        t0 = time.monotonic()
        log(f"-- {name}")
        out.update(importlib.import_module(parts[name]).measure(args.quick, smoke=args.smoke))
        out[f"{name}_bench_s"] = round(time.monotonic() - t0, 1)
    out["bench_s"] = round(time.monotonic() - started, 1)
    out["targets_met"] = targets(out)
    print(json.dumps(out))


def machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot (Linux /proc/stat, non-idle time)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


_SYSTEM = (
    "You are a careful assistant that solves grade-school math word problems. Think step by step, show your "
    "work briefly, and end with a line of the form 'Answer: <number>'. Never guess; if the problem is ambiguous, "
    "state the assumption you make before solving it."
)
_USER = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
    "clips did Natalia sell altogether in April and May? Please explain each step of the calculation."
)
_ANSWER = (
    "In April Natalia sold 48 clips. In May she sold half as many, which is 48 / 2 = 24 clips. Altogether she "
    "sold 48 + 24 = 72 clips in April and May.\nAnswer: 72"
)


def llm_call_span(rollout_id: str, attempt_id: str, seq: int, i: int) -> Span:
    """An LLM-call span like the gateway writes: prompt/response text, token ids, logprobs (~2 KB JSON of
    attributes, like the reference benchmark's ``openai.chat.completion`` span)."""
    prompt_ids = [(i * 7919 + k * 104729) % 151000 for k in range(61)]
    response_ids = [(i * 31 + k * 7) % 151000 for k in range(20)]
    logprobs = [-((i + k) % 97) / 37.0 for k in range(20)]
    response_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    attributes = {
        Attr.ENDPOINT: "chat.completions",
        Attr.MODEL: "Qwen2.5-0.5B-Instruct",
        Attr.RESPONSE_MODEL: "Qwen2.5-0.5B-Instruct",
        Attr.REQUEST: {
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}],
            "temperature": 1.0,
            "max_tokens": 256,
        },
        Attr.RESPONSE: {
            "id": response_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": _ANSWER}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 61, "completion_tokens": 20, "total_tokens": 81},
        },
        Attr.PROMPT_IDS: prompt_ids,
        Attr.CHOICES: [{"token_ids": response_ids, "logprobs": logprobs, "finish_reason": "stop"}],
        Attr.TOKEN_IDS_AVAILABLE: True,
        Attr.POLICY_VERSION: 3,
        Attr.RESPONSE_ID: response_id,
        Attr.LATENCY_MS: 41.7,
    }
    now = time.time()
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        seq=seq,
        name=Attr.SPAN_LLM_CALL,
        start_time=now,
        end_time=now + 0.0417,
        attributes=attributes,
    )


def fit_arm(algorithm, agent: str, train: list, val: list, *, store: Path, concurrency: int) -> list[dict]:
    """Train one arm of a comparison: ``algorithm`` (its ``out_dir`` set) run by a `Trainer` with one runner on a
    SQLite ``store`` of its own, rollouts retried on a lost lease; returns the run's ``train`` metric lines."""
    import json

    from rich.console import Console

    from lightrail import Trainer
    from lightrail.types import RetryPolicy

    trainer = Trainer(
        n_runners=1,
        concurrency=concurrency,
        store=str(store),
        algorithm=algorithm,
        retry=RetryPolicy(lease_s=120, max_attempts=3),
        console=Console(stderr=True),
    )
    trainer.fit(agent, train, val)
    lines = (Path(algorithm.out_dir) / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["kind"] == "train"]


def spread(values: list[float], digits: int = 4) -> dict[str, float]:
    """``mean``, ``min`` and ``max`` of per-seed figures: a learning claim is a spread over seeds, not one run."""
    return {
        "mean": round(sum(values) / len(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }
