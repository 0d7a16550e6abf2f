"""Engine throughput and weight-swap latency on SmolLM2-135M-Instruct (CPU).

    .venv/bin/python bench/engine.py [--quick] [--tokens N] [--requests N]
    .venv/bin/python bench/engine.py --smoke    # the tiny random model, 2 requests of 4 tokens (vLLM when present)

1. the same 8 chat requests (sampling, ``--tokens`` new tokens each) one by one, then all at once (batched);
2. ``swap_s``: wall time of `Engine.update_weights` with a full state dict while 8 requests are in flight
   (``--swap-tokens`` each, default 16), split into drain (the in-flight requests finish on the old weights
   first; one batched decode step per remaining token) and load (in-place copy of the weights).

On a shared 2-core box, set ``LIGHTRAIL_TORCH_THREADS=1``: OpenMP spin-waiting with 2 threads collapses when
the other core is busy.

Progress goes to stderr; the last line of stdout is one JSON object with ``tokens_per_s_batched``,
``tokens_per_s_sequential``, ``batched_over_sequential`` and ``swap_s`` (plus details).

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
