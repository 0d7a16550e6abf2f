"""Gateway overhead: an agent's calls made directly to a model server vs. through the gateway.

Set-up (three processes, started with spawn):

* upstream -- a fast fake model server: the gateway app, unrouted, over the `ScriptedBackend` fake;
* gateway  -- `create_gateway_app(OpenAIUpstream(upstream), MemoryStore())`, called on its routed path so
  every call is recorded as a span (with token ids and logprobs asked of the upstream);
* client   -- this process: the real `openai.AsyncOpenAI` client, the same for both arms.

Measured: sequential per-request latency (arms interleaved, p50 and mean) for chat completions and for the
Responses API (``client.responses.create``: answered by the upstream itself vs. through the gateway, which
translates it to chat for the upstream and records it), and chat throughput with 16 concurrent client tasks (arms
alternated, median of the repetitions). The reference proxy adds ~57 ms per request and
keeps 7 % of direct throughput (anchor-bench (f)). The throughput ratio is the median over adjacent
(direct, gateway) run pairs; CPU per request of the gateway and upstream processes comes from /proc.

Structured outputs (skip with ``--no-structured``):

* ``constrained_overhead_ratio``: tokens/s of the embedded engine (SmolLM2-135M, 8 chat requests at once, 48 new
  tokens each) with a ``json_schema`` response format vs without, same prompts and lengths (interleaved repeats;
  `bench._grammar_libs.engine_overhead`); ``constrained_overhead_pct`` is the slowdown in percent. Target: the
  ratio at least 0.8.
* ``schema_valid_fraction``: json_schema chat requests through a gateway serving the tiny random-weight model
  (which never writes JSON by itself), sampled at temperature 1 with ``n=4``: the fraction of answers that parse and
  validate against their schema (``jsonschema``). Target: 1.0.

    .venv/bin/python bench/gateway.py [--quick]
    .venv/bin/python bench/gateway.py --smoke   # 10 requests per arm, 1 throughput run, 4-token structured outputs

Progress goes to stderr; the last line of stdout is one JSON object with ``overhead_p50_ms`` and
``throughput_ratio_c16`` and the raw figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

SYSTEM = (
    "You are a careful assistant that solves arithmetic word problems step by step. Think about the quantities, "
    "write the equation, compute it, and finish with 'ANSWER: <number>'. Keep every step short and exact."
)
USER = "A baker made 48 muffins, sold 3/4 of them in the morning and half of the rest after lunch. How many are left?"
REPLY = "48 * 3/4 = 36 sold, 12 left; half of 12 is 6 sold after lunch, so 6 remain. ANSWER: 6"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
KEYS = ("overhead_p50_ms", "responses_overhead_p50_ms", "throughput_ratio_c16", "gateway_cpu_ms_per_request",
        "spans_expected", "constrained_overhead_ratio", "constrained_overhead_pct", "schema_valid_fraction")  # fmt: skip


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(app: Any, port: int, stop: Any, on_stopped: Any = None) -> None:
    """Run ``app`` under uvicorn (uvloop + httptools, no access log) until ``stop`` is set."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", access_log=False, log_level="warning"
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        async def watch() -> None:
            await asyncio.to_thread(stop.wait)
            server.should_exit = True

        watcher = asyncio.get_running_loop().create_task(watch())
        await server.serve()
        watcher.cancel()
        if on_stopped is not None:
            await on_stopped()

    import uvloop

    uvloop.run(main())


def upstream_process(port: int, stop: Any) -> None:
    from lightrail.gateway import ScriptedBackend, create_gateway_app
    from lightrail.store import MemoryStore

    _serve(create_gateway_app(ScriptedBackend([REPLY]), MemoryStore()), port, stop)


def gateway_process(port: int, upstream_url: str, stop: Any, results: Any) -> None:
    from lightrail.gateway import OpenAIUpstream, create_gateway_app
    from lightrail.store import MemoryStore
    from lightrail.types import RolloutSpec, Task

    store = MemoryStore()
    backend = OpenAIUpstream(upstream_url)

    async def lease() -> Any:
        await store.enqueue([RolloutSpec(task=Task(input="bench"))])
        return await store.lease("bench")

    the_lease = asyncio.run(lease())
    results.put((the_lease.rollout.rollout_id, the_lease.attempt.attempt_id))
    app = create_gateway_app(backend, store)

    async def report() -> None:
        spans = await store.query_spans(the_lease.rollout.rollout_id)
        ok = sum(1 for s in spans if s.status.code.value == "ok" and s.attributes.get("lightrail.token_ids_available"))
        results.put({"spans": len(spans), "spans_ok_with_ids": ok})
        await backend.aclose()

    _serve(app, port, stop, report)


async def _wait_healthy(url: str) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        for _ in range(600):
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy")


async def _one(client: Any, api: str = "chat") -> float:
    t0 = time.perf_counter()
    if api == "responses":
        answer = await client.responses.create(model="policy", instructions=SYSTEM, input=USER, max_output_tokens=256)
        elapsed = time.perf_counter() - t0
        assert answer.output_text == REPLY, answer
        return elapsed
    response = await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=256)
    elapsed = time.perf_counter() - t0
    assert response.choices[0].message.content == REPLY, response
    return elapsed


def _api(arm: str) -> str:
    return "responses" if arm.endswith("_responses") else "chat"


async def _sequential(clients: dict[str, Any], k: int) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(k):  # interleaved, so drift (thermal, other load) hits all arms alike
        for name, client in clients.items():
            lat[name].append(await _one(client, _api(name)))
    return lat


async def _throughput(client: Any, total: int, concurrency: int) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await _one(client)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - t0)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


async def run_client(urls: dict[str, str], args: argparse.Namespace, pids: dict[str, int]) -> dict[str, Any]:
    import httpx
    import openai

    for url in urls.values():
        await _wait_healthy(url.split("/v1")[0].split("/rollouts/")[0])
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    clients = {
        name: openai.AsyncOpenAI(
            base_url=url, api_key="bench", max_retries=0, http_client=httpx.AsyncClient(limits=limits, timeout=60)
        )
        for name, url in urls.items()
    }
    log(f"warm-up ({args.warmup} requests per arm)")
    await _sequential(clients, args.warmup)
    log(f"sequential: {args.sequential} requests per arm, interleaved")
    lat = await _sequential(clients, args.sequential)
    # Throughput: the arms alternate in short runs and each gateway run is compared with the direct run next to
    # it, so the background load of a shared machine affects both sides of each ratio alike.
    chat_arms = {name: client for name, client in clients.items() if _api(name) == "chat"}
    rps: dict[str, list[float]] = {name: [] for name in chat_arms}
    cpu: dict[str, dict[str, float]] = {arm: dict.fromkeys([*pids, "client"], 0.0) for arm in chat_arms}
    for rep in range(args.reps):
        for name, client in chat_arms.items():
            before = {proc: _cpu_s(pid) for proc, pid in pids.items()}
            client_before = time.process_time()
            rps[name].append(await _throughput(client, args.concurrent_requests, args.concurrency))
            cpu[name]["client"] += time.process_time() - client_before
            for proc, pid in pids.items():
                cpu[name][proc] += _cpu_s(pid) - before[proc]
        log(f"throughput rep {rep + 1}/{args.reps}: " + ", ".join(f"{n} {v[-1]:.0f} req/s" for n, v in rps.items()))
    ratios = [g / d for g, d in zip(rps["gateway"], rps["direct"], strict=True)]
    n_requests = args.concurrent_requests * args.reps
    for client in clients.values():
        await client.close()

    def ms(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    direct, gateway = lat["direct"], lat["gateway"]
    rps_direct, rps_gateway = statistics.median(rps["direct"]), statistics.median(rps["gateway"])
    return {
        "overhead_p50_ms": round(ms(gateway, 0.5) - ms(direct, 0.5), 3),
        # the Responses API through the gateway (translated to chat for the upstream, recorded) vs. the same
        # Responses request answered by the upstream itself
        "responses_overhead_p50_ms": round(ms(lat["gateway_responses"], 0.5) - ms(lat["direct_responses"], 0.5), 3),
        "direct_responses_p50_ms": round(ms(lat["direct_responses"], 0.5), 3),
        "gateway_responses_p50_ms": round(ms(lat["gateway_responses"], 0.5), 3),
        "throughput_ratio_c16": round(statistics.median(ratios), 3),
        "throughput_ratio_c16_runs": [round(r, 3) for r in ratios],
        "gateway_cpu_ms_per_request": round(1000 * cpu["gateway"]["gateway"] / n_requests, 3),
        "upstream_cpu_ms_per_request_direct": round(1000 * cpu["direct"]["upstream"] / n_requests, 3),
        "upstream_cpu_ms_per_request_via_gateway": round(1000 * cpu["gateway"]["upstream"] / n_requests, 3),
        "client_cpu_ms_per_request_direct": round(1000 * cpu["direct"]["client"] / n_requests, 3),
        "client_cpu_ms_per_request_via_gateway": round(1000 * cpu["gateway"]["client"] / n_requests, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "overhead_mean_ms": round(1000 * (statistics.fmean(gateway) - statistics.fmean(direct)), 3),
        "direct_p50_ms": round(ms(direct, 0.5), 3),
        "gateway_p50_ms": round(ms(gateway, 0.5), 3),
        "direct_p99_ms": round(ms(direct, 0.99), 3),
        "gateway_p99_ms": round(ms(gateway, 0.99), 3),
        "direct_rps_c16": round(rps_direct, 1),
        "gateway_rps_c16": round(rps_gateway, 1),
        "direct_rps_c16_runs": [round(v, 1) for v in rps["direct"]],
        "gateway_rps_c16_runs": [round(v, 1) for v in rps["gateway"]],
        "sequential_requests_per_arm": args.sequential,
        "concurrent_requests_per_run": args.concurrent_requests,
        "concurrency": args.concurrency,
        "reps": args.reps,
    }


VALIDITY_SCHEMAS: dict[str, dict[str, Any]] = {
    "distance": {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": 0, "maximum": 999},
            "unit": {"enum": ["m", "km", "mi"]},
        },
        "required": ["answer", "unit"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    "verdict": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["ok", "score"],
        "additionalProperties": False,
    },
    "call": {
        "type": "object",
        "properties": {
            "tool": {"enum": ["search", "calculator"]},
            "args": {"anyOf": [{"type": "string", "maxLength": 20}, {"type": "null"}]},
        },
        "required": ["tool", "args"],
        "additionalProperties": False,
    },
}


async def schema_validity(requests_per_schema: int) -> dict[str, Any]:
    """json_schema requests through a gateway serving the tiny random model; the fraction of valid answers."""
    import tempfile

    import jsonschema
    import openai

    from lightrail.engine import Engine, build_tiny_model
    from lightrail.gateway import GatewayServer
    from lightrail.store import MemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.from_pretrained(build_tiny_model(Path(tmp) / "tiny", size="tiny", seed=0), device="cpu")
        valid, total, finishes = 0, 0, {}
        async with GatewayServer(engine, MemoryStore()) as gateway:
            client = openai.AsyncOpenAI(base_url=gateway.url, api_key="-", max_retries=0)

            async def ask(name: str, schema: dict[str, Any], seed: int) -> list[Any]:
                fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
                answer = await client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"Answer as {name}."}],
                    response_format=fmt,
                    n=4,
                    max_tokens=96,
                    temperature=1.0,
                    seed=seed,
                )
                return [(schema, c) for c in answer.choices]

            jobs = [ask(n, s, k) for n, s in VALIDITY_SCHEMAS.items() for k in range(requests_per_schema)]
            for schema, choice in [pair for pairs in await asyncio.gather(*jobs) for pair in pairs]:
                total += 1
                finishes[choice.finish_reason] = finishes.get(choice.finish_reason, 0) + 1
                try:
                    jsonschema.validate(json.loads(choice.message.content), schema)
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    log(f"  invalid: {choice.message.content[:120]!r}")
            await client.close()
        await engine.close()
    return {"schema_valid_fraction": round(valid / total, 4), "schema_answers": total, "schema_finishes": finishes}


def structured(args: argparse.Namespace) -> dict[str, Any]:
    from bench._grammar_libs import engine_overhead

    log("structured outputs: constrained overhead on smollm2 (batch 8, 48 tokens) ...")
    if args.smoke:  # the same grammar path on the tiny random model
        overhead = asyncio.run(engine_overhead(4, 1, model="tiny"))
    else:
        overhead = asyncio.run(engine_overhead(48, 2 if args.quick else 4))
    log(f"  {overhead}")
    log("structured outputs: json_schema answers of the tiny random model through the gateway ...")
    validity = asyncio.run(schema_validity(1 if args.smoke else 4 if args.quick else 16))
    log(f"  {validity}")
    return {
        "constrained_overhead_ratio": overhead["ratio"],
        "constrained_overhead_pct": round(100 * (1 - overhead["ratio"]), 1),
        "constrained_tokens_per_s": overhead["tokens_per_s_json_schema"],
        "free_tokens_per_s": overhead["tokens_per_s_free"],
        **validity,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run, noisier figures)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--no-structured", action="store_true", help="skip the structured-output figures")
    parser.add_argument("--only-structured", action="store_true", help="only the structured-output figures")
    from bench._util import SMOKE_HELP, machine_facts

    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()

    facts = machine_facts()
    if args.only_structured:
        figures = {**facts, **structured(args)}
        print(json.dumps(figures))
        return 0
    args.warmup, args.sequential, args.concurrent_requests, args.reps = (
        (5, 10, 32, 1) if args.smoke else (50, 300, 400, 3) if args.quick else (200, 1500, 1000, 7)
    )

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    results = ctx.Queue()
    up_port, gw_port = _free_port(), _free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    procs = [
        ctx.Process(target=upstream_process, args=(up_port, stop), daemon=True),
        ctx.Process(target=gateway_process, args=(gw_port, upstream_url, stop, results), daemon=True),
    ]
    for p in procs:
        p.start()
    try:
        rollout_id, attempt_id = results.get(timeout=60)
        routed = f"http://127.0.0.1:{gw_port}/rollouts/{rollout_id}/attempts/{attempt_id}/v1"
        urls = {
            "direct": upstream_url + "/v1",
            "gateway": routed,
            "direct_responses": upstream_url + "/v1",
            "gateway_responses": routed,
        }
        log(f"upstream pid {procs[0].pid}, gateway pid {procs[1].pid}, cpus {os.cpu_count()}")
        pids = {"upstream": procs[0].pid, "gateway": procs[1].pid}
        figures = asyncio.run(run_client(urls, args, pids))
        stop.set()
        figures.update(results.get(timeout=60))
        expected = 2 * (args.warmup + args.sequential) + args.concurrent_requests * args.reps
        figures["spans_expected"] = expected
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    log(
        f"overhead p50 {figures['overhead_p50_ms']} ms, responses overhead p50 "
        f"{figures['responses_overhead_p50_ms']} ms, throughput ratio {figures['throughput_ratio_c16']}"
    )
    if not args.no_structured:
        figures.update(structured(args))
    print(json.dumps({**facts, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
