"""Continuous learning from served traffic: the demo of ``examples/continuous`` measured, plus what recording costs.

    python bench/continuous.py              # the full demo run (~25 min on 2 cores)
    python bench/continuous.py --quick      # the short one (under 15 min)
    python bench/continuous.py --only overhead
    python bench/continuous.py --smoke      # 20 calls each way; a 15-second demo of 2 users (2 SFT steps)

Figures (the last stdout line is one JSON object; progress on stderr):

- ``served_success_first`` / ``served_success_last``: success of the served sessions in the first and the last
  window (the answered sessions in order of their start, cut into windows of equal size: 8, or 4 with ``--quick``;
  target: last − first ≥ 0.10);
- ``swaps``: promoted policies the serving gateway swapped in (target ≥ 2); ``failed_requests``: user requests that
  raised (target 0);
- ``misversioned_calls``: recorded served calls whose policy version is not a promoted one, or is older than the
  version of a call that had already been answered when this one was sent (once a gateway answers with a new
  policy, it never answers with an older one; target 0);
- ``record_overhead_p50_ms``: median latency of a served chat call through a gateway that records it into sessions
  minus the median through a gateway without recording, both ``lightrail gateway serve --fake`` processes (the
  scripted backend: no model time to hide it) over one SQLite store, the real ``openai`` client, calls interleaved
  in the same run (target ≤ 1 ms). ``serve_p50_ms`` is the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("serve_p50_ms", "serve_recording_p50_ms", "record_overhead_p50_ms", "served_success_first",
        "served_success_last", "swaps", "failed_requests", "served_sessions", "misversioned_calls", "served_calls",
        "rounds", "bench_minutes", "targets_met")  # fmt: skip


async def _latencies(urls: dict[str, str], n: int, warmup: int = 100) -> dict[str, list[float]]:
    import openai

    from lightrail.gateway.recording import SESSION_HEADER

    clients = {name: openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) for name, url in urls.items()}
    messages = [{"role": "user", "content": "What is 17 * 23? Use the calculator."}]
    latency: dict[str, list[float]] = {name: [] for name in urls}
    for i in range(n + warmup):  # the first calls of each warm up connections and code paths
        order = list(clients.items())
        for name, client in order if i % 2 else order[::-1]:  # interleaved, alternating who goes first
            t0 = time.perf_counter()
            await client.chat.completions.create(
                model="m",
                messages=messages,
                extra_headers={SESSION_HEADER: f"bench-{i // 4}"},  # 4-call sessions
            )
            if i >= warmup:
                latency[name].append(time.perf_counter() - t0)
    for client in clients.values():
        await client.close()
    return latency


def _overhead(n: int, warmup: int = 100) -> dict:
    """Two ``lightrail gateway serve --fake`` processes over one SQLite store, one with ``--record``."""
    from examples.continuous.demo import free_port, spawn

    with tempfile.TemporaryDirectory() as tmp:
        ports = {"plain": free_port(), "recording": free_port()}
        base = [sys.executable, "-m", "lightrail.cli", "gateway", "serve", "--fake", "--store", f"{tmp}/served.db"]
        with (
            spawn([*base, "--port", str(ports["plain"])], Path(tmp) / "plain.log", health=_health(ports["plain"])),
            spawn(
                [*base, "--record", "--port", str(ports["recording"])],
                Path(tmp) / "recording.log",
                health=_health(ports["recording"]),
            ),
        ):
            urls = {name: f"http://127.0.0.1:{port}/v1" for name, port in ports.items()}
            latency = asyncio.run(_latencies(urls, n, warmup))
    p50 = {k: statistics.median(v) * 1000 for k, v in latency.items()}
    return {
        "serve_p50_ms": round(p50["plain"], 3),
        "serve_recording_p50_ms": round(p50["recording"], 3),
        "record_overhead_p50_ms": round(p50["recording"] - p50["plain"], 3),
        "overhead_calls": n,
    }


def _health(port: int) -> str:
    return f"http://127.0.0.1:{port}/health"


def misversioned(db: Path, promoted: set[int]) -> tuple[int, int]:
    """``(misversioned, calls)`` over the served calls recorded in ``db`` (see the module docstring)."""
    from lightrail.store import SQLiteStore
    from lightrail.types import Attr

    async def calls() -> list[tuple[float, float, int]]:
        store = SQLiteStore(db)
        try:
            spans = [s for r in await store.query_rollouts() for s in await store.query_spans(r.rollout_id)]
        finally:
            await store.close()
        return [
            (s.start_time, s.end_time or s.start_time, int(s.attributes[Attr.POLICY_VERSION]))
            for s in spans
            if s.name == Attr.SPAN_LLM_CALL
        ]

    recorded = sorted(asyncio.run(calls()))
    by_end = sorted(recorded, key=lambda c: c[1])
    bad, newest, j = 0, -1, 0
    for start, _, version in recorded:
        while j < len(by_end) and by_end[j][1] < start:
            newest = max(newest, by_end[j][2])
            j += 1
        bad += version < newest or version not in promoted
    return bad, len(recorded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short demo (under 15 minutes)")
    parser.add_argument("--only", choices=["overhead", "demo"], help="run one part")
    parser.add_argument("--overhead-calls", type=int, default=None, help="default: 2000 (1000 with --quick)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    out: dict = {"quick": args.quick, **machine_facts()}
    log(f"machine: {out}")
    started = time.monotonic()
    args.overhead_calls = args.overhead_calls or (20 if args.smoke else 1000 if args.quick else 2000)
    if args.only in (None, "overhead"):
        log(f"-- recording overhead: {args.overhead_calls} calls each way, interleaved")
        out.update(_overhead(args.overhead_calls, 4 if args.smoke else 100))
        log(json.dumps({k: v for k, v in out.items() if "p50" in k}))
    if args.only in (None, "demo"):
        from examples.continuous.demo import ContinuousSettings, run
        from lightrail.engine.promotions import PolicyRegistry

        overrides = {"out": args.out} if args.out else {}
        if args.smoke:
            smoke = dict(minutes=0.25, users=2, think_s=0.1, feedback_delay_s=0.2, windows=2, min_sessions=4, updates=1,
                         n_val=2, sft_steps=2)  # fmt: skip
            settings = ContinuousSettings(**{**smoke, **overrides})
        else:
            settings = ContinuousSettings.quick(**overrides) if args.quick else ContinuousSettings(**overrides)
        from rich.console import Console

        report = run(settings, console=Console(stderr=True))  # stdout's last line is the JSON
        promoted = {p.version for p in PolicyRegistry(settings.out / "policies").history()}
        bad, calls = misversioned(settings.out / "served.db", promoted)
        keys = ("served_success_first", "served_success_last", "swaps", "failed_requests", "served_sessions")
        out.update({k: report[k] for k in keys})
        out.update(
            {
                "served_success_gain": round(report["served_success_last"] - report["served_success_first"], 3),
                "misversioned_calls": bad,
                "served_calls": calls,
                "rounds": report["rounds"],
                "windows": [round(w["success"], 3) for w in report["windows"]],
                "plot": report["plot"],
                "demo_minutes": round(report["wall_minutes"], 1),
            }
        )
    out["bench_minutes"] = round((time.monotonic() - started) / 60, 1)
    targets = {}
    if "record_overhead_p50_ms" in out:
        targets["record_overhead_p50_ms<=1"] = out["record_overhead_p50_ms"] <= 1.0
    if "swaps" in out:
        targets.update(
            {
                "served_success_gain>=0.10": out["served_success_gain"] >= 0.10,
                "swaps>=2": out["swaps"] >= 2,
                "failed_requests==0": out["failed_requests"] == 0,
                "misversioned_calls==0": out["misversioned_calls"] == 0,
            }
        )
    if args.quick and "demo_minutes" in out:
        targets["quick<15min"] = out["bench_minutes"] < 15
    out["targets_met"] = targets
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
