"""Engine throughput, decode step against the weight-read bound, and weight-swap latency on SmolLM2-135M-Instruct
(CPU).

    .venv/bin/python bench/engine.py [--quick] [--tokens N] [--requests N] [--rounds N] [--profile]
    .venv/bin/python bench/engine.py --smoke    # the tiny random model, 2 requests of 4 tokens (vLLM when present)

1. the same 8 chat requests (sampling, ``--tokens`` new tokens each) one by one, then all at once (batched);
2. ``swap_s``: wall time of `Engine.update_weights` with a full state dict while 8 requests are in flight
   (``--swap-tokens`` each, default 16), split into drain (the in-flight requests finish on the old weights
   first; one batched decode step per remaining token) and load (in-place copy of the weights);
3. decode steps against the weight-read bound, three arms in the same run, alternating round by round (``--rounds``,
   default 3; the median of each arm): ``baseline`` (the engine before issue 56: the concatenating `DynamicCache`,
   torch's stock ``F.linear``, float32), ``float32`` and ``bfloat16`` (the slot cache and packed weights, as the
   engine ships; float32 is its default on a CPU). Each round runs the 8 requests (``--decode-tokens`` each, default
   32) on every arm and reads the engine's own ``decode_us / decode_steps`` (forward pass and sampling of one step);
   between arms the machine's read bandwidth is measured (a torch sum over 1 GiB, best of 3). The weight-read bound's
   step time is the model's weight bytes / that bandwidth; ``decode_bound_fraction`` = bound step time / measured
   step time (1.0: decoding as fast as the weights can be read). ``decode_rows_mean`` is the mean batch size of the
   steps (rows that end on EOS leave the batch). With ``--profile``, a decode step of each arm is also profiled and
   ``decode_breakdown_ms`` splits it into matmuls, attention, KV-cache writes and copies, sampling, other torch ops
   and Python (the rest).

On a shared 2-core box, set ``LIGHTRAIL_TORCH_THREADS=1``: OpenMP spin-waiting with 2 threads collapses when
the other core is busy.

Progress goes to stderr; the last line of stdout is one JSON object with ``tokens_per_s_batched``,
``tokens_per_s_sequential``, ``batched_over_sequential``, ``swap_s``, ``decode_bound_fraction`` (the engine's
default precision) with ``decode_step_ms``, ``bound_step_ms`` and ``read_gb_per_s`` per arm (plus details).

Optional vLLM arm: when a vLLM venv exists (``$LIGHTRAIL_VLLM_PYTHON``, default ``.venv-vllm/bin/python``; see
tests/gateway/test_gateway_vllm.py for how to create it), the same concurrent chat requests go straight to
``vllm serve`` on the same checkpoint (``--enforce-eager``, started after the engine is closed) and the JSON
gains ``vllm_tokens_per_s_batched`` and ``engine_over_vllm`` (our batched tok/s / vLLM's); both are null when
the venv is absent or ``--no-vllm`` is given. With ``LIGHTRAIL_TORCH_THREADS=N``, vLLM's OpenMP pool is bound
to the same number of cores (``VLLM_CPU_OMP_THREADS_BIND=0-{N-1}``). vLLM runs the checkpoint's dtype
(bfloat16, its tuned CPU path) whatever ``--dtype`` the engine uses; its server log is kept only on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

from bench._util import SMOKE_HELP  # noqa: E402

KEYS = ("tokens_per_s_batched", "tokens_per_s_sequential", "batched_over_sequential", "swap_s", "swap_drain_s",
        "swap_load_s", "vllm_tokens_per_s_batched", "engine_over_vllm")  # fmt: skip
NEEDS = {"vllm": ("vllm_tokens_batched", "vllm_startup_s")}
PROMPTS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle works to a ten year old.",
    "Describe your ideal weekend in the mountains.",
    "Write a poem about the sea at night.",
    "Give me a recipe for a simple tomato soup.",
    "Tell me about the history of the printing press.",
    "Why is the sky blue? Explain in detail.",
    "Write a letter to a friend about learning to cook.",
]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def vllm_python() -> Path | None:
    """The interpreter of the vLLM venv, or None when it does not exist."""
    env = os.environ.get("LIGHTRAIL_VLLM_PYTHON")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


def read_bandwidth() -> float:
    """The machine's memory read bandwidth now, GB/s: a torch sum over 1 GiB of float32, best of 3."""
    import torch

    x = torch.ones(2**28)
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return best


def weight_bytes(model) -> int:
    """Bytes a decode step must read: every parameter once (tied ones counted once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


async def profile_step(engine, requests: list) -> dict:
    """Where one decode step's time goes (ms, mean over 4 profiled steps of ``requests`` decoding together): matmuls
    (self time of the matmul ops), attention (the SDPA ops), KV-cache writes and copies (the cache layers' updates,
    the slot cache's mask), sampling (`Engine._sample_into`), other torch ops (their self time) and Python (the rest
    of the step's wall time: module calls, argument handling, the profiler's own cost)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers.cache_utils import DynamicLayer

    from lightrail.engine import kv

    patched = []

    def wrap(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*a, **k):
            with record_function(label):
                return original(*a, **k)

        setattr(owner, name, wrapper)
        patched.append((owner, name, original))

    wrap(DynamicLayer, "update", "kv_cache")
    wrap(kv._SlotLayer, "update", "kv_cache")
    wrap(kv.SlotCache, "begin_decode", "kv_cache")
    wrap(engine, "_sample_into", "sampling")
    wrap(engine, "_decode_step", "decode_step")
    try:
        tasks = [asyncio.ensure_future(engine.chat(r)) for r in requests]
        steps = engine.stats["decode_steps"]
        while engine.stats["decode_steps"] < steps + 2:  # steady decoding, not the prefill
            await asyncio.sleep(0.001)
        # The profiler records the thread it is started on: start and stop it on the engine's worker thread.
        loop, prof = asyncio.get_running_loop(), profile(activities=[ProfilerActivity.CPU])
        await loop.run_in_executor(engine._worker, prof.__enter__)
        target = engine.stats["decode_steps"] + 4
        while engine.stats["decode_steps"] < target:
            await asyncio.sleep(0.001)
        await loop.run_in_executor(engine._worker, prof.__exit__, None, None, None)
        await asyncio.gather(*tasks)
    finally:
        for owner, name, original in patched:
            if isinstance(owner, type):
                setattr(owner, name, original)
            else:
                owner.__dict__.pop(name, None)
    events = list(prof.events())
    spans = {label: [e for e in prof.events() if e.name == label] for label in ("decode_step", "kv_cache", "sampling")}
    n = max(len(spans["decode_step"]), 1)
    total = sum(e.cpu_time_total for e in spans["decode_step"]) / n / 1e3
    kv_ms = sum(e.cpu_time_total for e in spans["kv_cache"]) / n / 1e3
    sampling = sum(e.cpu_time_total for e in spans["sampling"]) / n / 1e3
    inside = {id(c) for label in ("kv_cache", "sampling") for e in spans[label] for c in _descendants(e)}
    matmul = attention = other = 0.0
    for e in events:
        if e.name.startswith(("aten::", "mkldnn::")) and id(e) not in inside:
            self_ms = e.self_cpu_time_total / n / 1e3
            if e.name in ("aten::mm", "aten::addmm", "aten::bmm", "mkldnn::_linear_pointwise"):
                matmul += self_ms
            elif "scaled_dot_product" in e.name:
                attention += self_ms
            else:
                other += self_ms
    python = total - matmul - attention - kv_ms - sampling - other
    parts = {"step": total, "matmuls": matmul, "attention": attention, "kv_cache": kv_ms, "sampling": sampling,
             "other_ops": other, "python": python}  # fmt: skip
    return {k: round(v, 2) for k, v in parts.items()}


def _descendants(event) -> list:
    out, todo = [], list(event.cpu_children)
    while todo:
        e = todo.pop()
        out.append(e)
        todo.extend(e.cpu_children)
    return out


async def run_vllm(python: Path, model_dir: str, args: argparse.Namespace) -> dict:
    """Serve ``model_dir`` with vLLM (eager) and time the same n concurrent chat requests against it."""
    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    threads = os.environ.get("LIGHTRAIL_TORCH_THREADS")
    if threads and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{int(threads) - 1}"
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "smollm2",
        "--enforce-eager", "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log_file = tempfile.NamedTemporaryFile(prefix="lightrail-bench-vllm-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    t0 = time.perf_counter()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False) as client:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"vLLM exited with {proc.returncode}; log: {log_file.name}")
                if time.perf_counter() - t0 > 300:
                    raise RuntimeError(f"vLLM not healthy after 300 s; log: {log_file.name}")
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(1.0)
            startup_s = time.perf_counter() - t0
            log(f"vLLM healthy after {startup_s:.0f} s (log {log_file.name})")

            async def chat(i: int, tokens: int) -> int:
                body = {
                    "model": "smollm2",
                    "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    "temperature": 0.8,
                    "top_p": 0.95,
                    "max_tokens": tokens,
                    "seed": i,
                }
                r = await client.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                return r.json()["usage"]["completion_tokens"]

            await chat(0, 4)  # warm-up
            start = time.perf_counter()
            counts = await asyncio.gather(*(chat(i, args.tokens) for i in range(args.requests)))
            bat_s = time.perf_counter() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log_file.close()
    os.unlink(log_file.name)
    tokens = sum(counts)
    log(f"vLLM batched: {tokens} tokens in {bat_s:.2f} s = {tokens / bat_s:.1f} tok/s")
    return {
        "vllm_tokens_batched": tokens,
        "vllm_tokens_per_s_batched": round(tokens / bat_s, 2),
        "vllm_startup_s": round(startup_s, 1),
        "vllm_omp_threads_bind": env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
    }


ARMS = {
    # name: (kv_cache, packed_weights, dtype)
    "baseline": ("concat", False, "float32"),
    "float32": ("slots", True, "float32"),
    "bfloat16": ("slots", True, "bfloat16"),
}


async def decode_arms(path: Path, args: argparse.Namespace, request) -> dict:
    """Decode step time of each arm against the weight-read bound (module docstring, 3.), same run, alternating."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightrail.engine import Engine
    from lightrail.engine.engine import CPU_DTYPE

    tokenizer = AutoTokenizer.from_pretrained(path)
    models = {dtype: AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)) for dtype in
              ("float32", "bfloat16")}  # fmt: skip
    engines = {
        name: Engine(
            models[dtype],
            tokenizer,
            name="smollm2",
            kv_cache=cache,
            packed_weights=packed,
            fused_decode=cache == "slots",
        )
        for name, (cache, packed, dtype) in ARMS.items()
    }
    requests = [request(i, args.decode_tokens) for i in range(args.requests)]
    steps: dict[str, list[float]] = {name: [] for name in ARMS}
    rows: dict[str, list[float]] = {name: [] for name in ARMS}
    bandwidth: list[float] = []
    breakdown: dict[str, dict] = {}
    try:
        for engine in engines.values():
            await engine.chat(request(0, 4))  # warm-up
        for r in range(args.rounds):
            for name, engine in engines.items():
                bandwidth.append(read_bandwidth())
                n0, us0, tok0 = (
                    engine.stats["decode_steps"],
                    engine.stats["decode_us"],
                    engine.stats["generated_tokens"],
                )
                await asyncio.gather(*(engine.chat(q) for q in requests))
                n = engine.stats["decode_steps"] - n0
                steps[name].append((engine.stats["decode_us"] - us0) / n / 1e3)
                rows[name].append((engine.stats["generated_tokens"] - tok0 - len(requests)) / n)  # less prefill's
                log(f"round {r + 1} {name}: decode step {steps[name][-1]:.1f} ms, {rows[name][-1]:.1f} rows, "
                    f"read {bandwidth[-1]:.1f} GB/s")  # fmt: skip
        if args.profile:
            for name, engine in engines.items():
                breakdown[name] = await profile_step(engine, requests)
                log(f"profile {name}: {breakdown[name]}")
    finally:
        for engine in engines.values():
            await engine.close()
    gbs = statistics.median(bandwidth)
    out: dict = {"read_gb_per_s": round(gbs, 2), "read_gb_per_s_all": [round(b, 2) for b in bandwidth]}
    for name, (_, _, dtype) in ARMS.items():
        step = statistics.median(steps[name])
        bound = weight_bytes(models[dtype]) / (gbs * 1e9) * 1e3
        out[name] = {
            "decode_step_ms": round(step, 2),
            "decode_step_ms_all": [round(x, 2) for x in steps[name]],
            "decode_rows_mean": round(statistics.mean(rows[name]), 2),
            "bound_step_ms": round(bound, 2),
            "decode_bound_fraction": round(bound / step, 3),
            "tokens_per_s_decode": round(statistics.mean(rows[name]) / step * 1e3, 1),
        }
        if name in breakdown:
            out[name]["decode_breakdown_ms"] = breakdown[name]
    out["decode_bound_fraction"] = out[CPU_DTYPE]["decode_bound_fraction"]
    out["decode_default_precision"] = CPU_DTYPE
    out["float32_over_baseline"] = round(out["baseline"]["decode_step_ms"] / out["float32"]["decode_step_ms"], 2)
    out["bfloat16_over_baseline"] = round(out["baseline"]["decode_step_ms"] / out["bfloat16"]["decode_step_ms"], 2)
    return out


async def run(args: argparse.Namespace) -> dict:
    import torch

    from lightrail.engine import Engine, configure_threads, prepare_model
    from lightrail.types import ChatRequest, SamplingParams

    t0 = time.perf_counter()
    path = prepare_model("tiny" if args.smoke else "smollm2")
    engine = Engine.from_pretrained(path, dtype=args.dtype)
    log(f"loaded {path} in {time.perf_counter() - t0:.1f} s; torch threads {configure_threads()}")

    def request(i: int, tokens: int) -> ChatRequest:
        return ChatRequest(
            model="smollm2",
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            sampling=SamplingParams(temperature=0.8, top_p=0.95, max_tokens=tokens, seed=i),
        )

    await engine.chat(request(0, 4))  # warm-up: first-call allocations, chat-template probes

    n = args.requests
    start = time.perf_counter()
    sequential = [await engine.chat(request(i, args.tokens)) for i in range(n)]
    seq_s = time.perf_counter() - start
    seq_tokens = sum(len(g.choices[0].token_ids) for g in sequential)
    log(f"sequential: {seq_tokens} tokens in {seq_s:.2f} s = {seq_tokens / seq_s:.1f} tok/s")

    passes = engine.stats["forward_passes"]
    start = time.perf_counter()
    batched = await asyncio.gather(*(engine.chat(request(i, args.tokens)) for i in range(n)))
    bat_s = time.perf_counter() - start
    bat_tokens = sum(len(g.choices[0].token_ids) for g in batched)
    log(
        f"batched:    {bat_tokens} tokens in {bat_s:.2f} s = {bat_tokens / bat_s:.1f} tok/s "
        f"({engine.stats['forward_passes'] - passes} forward passes)"
    )

    # Weight swap: a full state dict (cloned, as a trainer would hand over) while n requests are in flight.
    state = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        state["model.norm.weight"].mul_(1.01)  # really different weights
    in_flight = [asyncio.ensure_future(engine.chat(request(i, args.swap_tokens))) for i in range(n)]
    passes = engine.stats["forward_passes"]
    while engine.stats["forward_passes"] < passes + 2:  # prefill done and decoding under way
        await asyncio.sleep(0.001)
    start = time.perf_counter()
    version = await engine.update_weights(state)
    swap_s = time.perf_counter() - start
    old = await asyncio.gather(*in_flight)
    assert all(g.policy_version == version - 1 for g in old)
    after = await engine.chat(request(0, 4))
    assert after.policy_version == version
    timing = engine.last_weight_update
    log(f"swap: {swap_s:.2f} s (drain {timing['drain_s']:.2f} s, load {timing['load_s']:.2f} s), version {version}")
    await engine.close()
    decode = await decode_arms(path, args, request) if args.rounds > 0 else {}

    result = {
        "model": f"{'tiny random Llama' if args.smoke else 'SmolLM2-135M-Instruct'} {args.dtype}",
        "requests": n,
        "max_tokens": args.tokens,
        "torch_threads": torch.get_num_threads(),
        "tokens_batched": bat_tokens,
        "tokens_sequential": seq_tokens,
        "tokens_per_s_batched": round(bat_tokens / bat_s, 2),
        "tokens_per_s_sequential": round(seq_tokens / seq_s, 2),
        "batched_over_sequential": round((bat_tokens / bat_s) / (seq_tokens / seq_s), 2),
        "swap_s": round(swap_s, 3),
        "swap_drain_s": round(timing["drain_s"], 3),
        "swap_load_s": round(timing["load_s"], 3),
        "swap_in_flight_max_tokens": args.swap_tokens,
        **decode,
    }
    vllm: dict = {"vllm_tokens_per_s_batched": None, "engine_over_vllm": None}
    python = None if args.no_vllm else vllm_python()
    if python is None:
        log("vLLM arm skipped: " + ("--no-vllm" if args.no_vllm else "no vLLM venv (set LIGHTRAIL_VLLM_PYTHON)"))
    else:
        del engine, state
        vllm.update(await run_vllm(python, str(path), args))
        vllm["engine_over_vllm"] = round(result["tokens_per_s_batched"] / vllm["vllm_tokens_per_s_batched"], 2)
    return {**result, **vllm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 new tokens per request instead of 64")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per request (default 64, quick 16)")
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests (default 8)")
    parser.add_argument(
        "--swap-tokens",
        type=int,
        default=16,
        help="max_tokens of the requests in flight during the swap (default 16); the drain part of swap_s grows "
        "with it, one decode step per remaining token",
    )
    parser.add_argument("--rounds", type=int, default=3, help="decode-step rounds per arm, alternating (0: skip)")
    parser.add_argument("--decode-tokens", type=int, default=32, help="new tokens per request in the decode rounds")
    parser.add_argument("--profile", action="store_true", help="profile a decode step of each arm (breakdown)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM arm even when its venv exists")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights dtype")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.requests, args.swap_tokens = 4, 2, 4
    if args.tokens is None:
        args.tokens = 16 if args.quick else 64
    result = asyncio.run(run(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
