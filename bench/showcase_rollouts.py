"""Rollouts per minute of a framework showcase on SmolLM2-135M-Instruct (CPU): which engine samples faster.

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/showcase_rollouts.py [--questions 16] [--samples 2] [--no-vllm]

The LangGraph SQL agent of the SmolLM2 recipe (`examples.sql_agent.train:sql_agent_basic`: write, check, one rewrite,
check; every prompt carries the schema and a worked example) runs the same training questions (the basic tier's
first ``--questions``, ``--samples`` tries each, temperature 0.7, 64 tokens per call, ``--concurrency`` at once)
against three arms, one after the other, each served behind an OpenAI-compatible URL:

* ``engine``: the embedded engine with prefix caching off (the baseline);
* ``engine_prefix``: the embedded engine as it ships (prompt-prefix caching on);
* ``vllm``: vLLM's CPU build (``.venv-vllm``, ``--enable-prefix-caching``, eager), when its venv exists.

Each arm first runs one warm-up rollout, untimed. Printed (last line of stdout, one JSON object):
``<arm>_rollouts_per_min``, ``<arm>_calls``, ``<arm>_reward_mean``, ``prefix_cache_speedup`` (engine_prefix over
engine), ``rollout_engine_speedup`` (the faster of engine_prefix and vllm over the other) and ``faster_engine``;
``python_loop_ms`` (the machine's speed) and the 1-minute load at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import REPO, SMOKE_HELP, free_port, log, served_engine  # noqa: E402

KEYS = ()
NEEDS = {
    "langgraph": ("engine_rollouts_per_min", "engine_calls", "engine_reward_mean", "engine_prefix_rollouts_per_min",
                  "prefix_cache_speedup", "python_loop_ms"),
    "vllm": ("vllm_rollouts_per_min", "faster_engine", "rollout_engine_speedup"),
}  # fmt: skip
"""The agent is LangGraph's: every figure needs it; the vLLM arm also needs vLLM's venv."""


def python_loop_ms() -> float:
    t0 = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    return round((time.perf_counter() - t0) * 1000, 1)


def run_rollouts(url: str, tasks: list[dict], samples: int, concurrency: int) -> dict:
    """The SQL agent on every task ``samples`` times against ``url``: rollouts per minute, calls, mean reward."""
    from examples.sql_agent.agent import ONE_SHOT_BASIC, answer
    from examples.sql_agent.database import connect, database_path
    from examples.sql_agent.reward import execution_match

    def one(task: dict) -> float:
        conn = connect(database_path())
        state = answer(
            task["question"], base_url=url, model="policy", api_key="none", max_turns=2, examples=ONE_SHOT_BASIC,
            conn=conn, temperature=0.7, max_tokens=64,
        )  # fmt: skip
        return execution_match(conn, state.get("sql"), task["sql"])

    one(tasks[0])  # warm-up: weights paged in, first prefix cached, kernels compiled
    work = [task for task in tasks for _ in range(samples)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        rewards = list(pool.map(one, work))
    minutes = (time.perf_counter() - t0) / 60
    return {"rollouts_per_min": round(len(work) / minutes, 2), "reward_mean": round(sum(rewards) / len(work), 3)}


async def engine_arm(model: str, prefix_cache: bool, tasks: list[dict], args: argparse.Namespace) -> dict:
    async with served_engine(model, prefix_cache=prefix_cache) as (url, engine):
        result = await asyncio.to_thread(run_rollouts, url, tasks, args.samples, args.concurrency)
    result["calls"] = engine.stats["requests"]
    result["cached_prompt_share"] = round(
        engine.stats["cached_prompt_tokens"]
        / max(1, engine.stats["cached_prompt_tokens"] + engine.stats["prompt_tokens"]),
        3,
    )
    return result


def vllm_arm(python: Path, model: str, tasks: list[dict], args: argparse.Namespace) -> dict:
    import httpx

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if (threads := os.environ.get("LIGHTRAIL_TORCH_THREADS")) and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{int(threads) - 1}"
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "policy",
        "--enforce-eager", "--enable-prefix-caching", "--max-model-len", "2048", "--gpu-memory-utilization", "0.3",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile(prefix="lightrail-bench-vllm-", suffix=".log", delete=False) as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        t0 = time.perf_counter()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode}; log: {log_file.name}")
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"vLLM not healthy after 600 s; log: {log_file.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        log(f"vLLM healthy after {time.perf_counter() - t0:.0f} s")
        return run_rollouts(f"http://127.0.0.1:{port}/v1", tasks, args.samples, args.concurrency)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def main_async(args: argparse.Namespace) -> dict:
    from examples.sql_agent.data import splits
    from lightrail.engine.models import prepare_model

    figures: dict = {"python_loop_ms": python_loop_ms(), "load_1min": os.getloadavg()[0]}
    model = str(prepare_model("tiny" if args.smoke else "smollm2"))
    train, _ = splits(seed=0, n_train=400, n_val=48, tier="basic")
    tasks = train[: args.questions]
    figures.update(questions=len(tasks), samples=args.samples, concurrency=args.concurrency)
    for arm, prefix in (("engine", False), ("engine_prefix", True)):
        log(f"-- {arm}: {len(tasks)} questions x {args.samples}")
        for key, value in (await engine_arm(model, prefix, tasks, args)).items():
            figures[f"{arm}_{key}"] = value
        log(f"   {arm}: {figures[f'{arm}_rollouts_per_min']} rollouts/min")
    figures["prefix_cache_speedup"] = round(
        figures["engine_prefix_rollouts_per_min"] / figures["engine_rollouts_per_min"], 2
    )
    python = Path(args.vllm_python)
    if not args.no_vllm and python.exists():
        log(f"-- vllm: {len(tasks)} questions x {args.samples}")
        for key, value in vllm_arm(python, model, tasks, args).items():
            figures[f"vllm_{key}"] = value
        ours, theirs = figures["engine_prefix_rollouts_per_min"], figures["vllm_rollouts_per_min"]
        figures["faster_engine"] = "embedded" if ours >= theirs else "vllm"
        figures["rollout_engine_speedup"] = round(max(ours, theirs) / min(ours, theirs), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=16, help="training questions of the basic tier (default 16)")
    parser.add_argument("--samples", type=int, default=2, help="tries per question (default 2)")
    parser.add_argument("--concurrency", type=int, default=16, help="rollouts at once (default 16)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM arm")
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the tiny random model, 1 question)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.samples, args.concurrency = 1, 1, 2
        args.vllm_python = os.environ.get("LIGHTRAIL_VLLM_PYTHON") or args.vllm_python
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
