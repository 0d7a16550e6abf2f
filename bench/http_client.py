"""The gateway's upstream hop: the lean HTTP client (`lightrail._http.HTTPPool`) against httpx, same requests.

Both arms send the same chat-completions body (a ~400-byte JSON request, a ~600-byte answer) to the same fast
upstream (the gateway app, unrouted, over the scripted fake backend, under uvicorn in another process) from this
process, in the same event loop (uvloop, as ``lightrail gateway serve`` runs):

* ``p50_ms`` / ``cpu_ms_per_request``: sequential requests, arms interleaved (drift hits both alike); CPU is this
  process's, so it is the client's cost, not the server's;
* ``rps_c16``: 16 concurrent senders, arms alternated, median of the repetitions.

``lean_vs_httpx_cpu_ratio`` (httpx CPU per request over the lean client's) is why the gateway keeps the lean client
on its upstream hop: each routed call crosses it once. What httpx would add there (environment proxies, redirects)
an upstream of the gateway does not use; long generations are covered by the lean client's timeouts.

    .venv/bin/python bench/http_client.py [--quick]
    .venv/bin/python bench/http_client.py --smoke   # 20 sequential, 32 concurrent requests per arm, 1 repetition

Progress goes to stderr; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

from bench._util import SMOKE_HELP, machine_facts  # noqa: E402
from bench.gateway import MESSAGES, REPLY, _free_port, _wait_healthy, log, upstream_process  # noqa: E402

KEYS = ("lean_p50_ms", "httpx_p50_ms", "lean_cpu_ms_per_request", "httpx_cpu_ms_per_request", "lean_rps_c16",
        "httpx_rps_c16", "lean_vs_httpx_cpu_ratio", "lean_vs_httpx_p50_ratio", "lean_vs_httpx_rps_ratio",
        "targets_met")  # fmt: skip

BODY = json.dumps({"model": "policy", "messages": MESSAGES, "max_tokens": 256}).encode()


def _check(status: int, body: bytes) -> None:
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == REPLY, (status, body[:200])


async def run(url: str, sequential: int, concurrent: int, reps: int) -> dict[str, Any]:
    import httpx

    from lightrail._http import HTTPPool

    await _wait_healthy(url.removesuffix("/v1"))
    lean = HTTPPool(url, max_connections=64)
    client = httpx.AsyncClient(
        base_url=url, timeout=60, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64)
    )
    headers = {"content-type": "application/json"}

    async def via_lean() -> None:
        _check(*await lean.request("POST", "/chat/completions", BODY))

    async def via_httpx() -> None:
        response = await client.post("/chat/completions", content=BODY, headers=headers)
        _check(response.status_code, response.content)

    arms = {"lean": via_lean, "httpx": via_httpx}
    for send in arms.values():  # warm: connections open, code paths hot
        for _ in range(50):
            await send()
    latency: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, float] = dict.fromkeys(arms, 0.0)
    for _ in range(sequential):
        for name, send in arms.items():
            c0, t0 = time.process_time(), time.perf_counter()
            await send()
            latency[name].append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
    rps: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(reps):
        for name, send in arms.items():
            remaining = concurrent

            async def worker(send: Any = send) -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    await send()

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(16)))
            rps[name].append(concurrent / (time.perf_counter() - t0))
    await lean.aclose()
    await client.aclose()
    out: dict[str, Any] = {}
    for name in arms:
        out[f"{name}_p50_ms"] = round(statistics.median(latency[name]) * 1000, 3)
        out[f"{name}_cpu_ms_per_request"] = round(cpu[name] / sequential * 1000, 3)
        out[f"{name}_rps_c16"] = round(statistics.median(rps[name]), 1)
    out["lean_vs_httpx_cpu_ratio"] = round(out["httpx_cpu_ms_per_request"] / out["lean_cpu_ms_per_request"], 2)
    out["lean_vs_httpx_p50_ratio"] = round(out["httpx_p50_ms"] / out["lean_p50_ms"], 2)
    out["lean_vs_httpx_rps_ratio"] = round(out["lean_rps_c16"] / out["httpx_rps_c16"], 2)
    out.update({"sequential_requests_per_arm": sequential, "concurrent_requests_per_run": concurrent, "reps": reps})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (~10 s)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    sequential, concurrent, reps = (20, 32, 1) if args.smoke else (300, 400, 3) if args.quick else (2000, 2000, 5)
    facts = machine_facts()
    log(f"machine: {facts}")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    port = _free_port()
    upstream = ctx.Process(target=upstream_process, args=(port, stop), daemon=True)
    upstream.start()
    try:
        import uvloop

        result = uvloop.run(run(f"http://127.0.0.1:{port}/v1", sequential, concurrent, reps))
    finally:
        stop.set()
        upstream.join(10)
    out = {**facts, **result}
    out["targets_met"] = {"lean_cpu_below_httpx": out["lean_vs_httpx_cpu_ratio"] > 1.0}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
