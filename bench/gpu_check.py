"""The same code on a GPU, in one prepared script: the embedded engine, GRPO with LoRA and with full fine-tuning,
FSDP2 on one rank and export, each figure beside `bench/gpu_plan.py`'s prediction for it.

    python bench/gpu_check.py          # one CUDA GPU with torch, transformers and peft (lightrail's other
                                       # dependencies as wheels: scripts/gpu_wheels.sh); ~8 minutes on an H200
    python bench/gpu_check.py --dry    # the same code paths on the CPU: tiny sizes, float32, gloo (--smoke too)

Models, built on the spot (nothing is downloaded): the `small` model (~6 M parameters, lightrail's random Llama and
its locally trained tokenizer) and a random-weight model of Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads, 2
KV heads, MLP 4864, tied embeddings, q/k/v biases) over the small model's tokenizer, so its vocabulary is that
tokenizer's, not Qwen's 151,936 (`QWEN2_05B`). ``--dry``: the tiny model and a 2-layer Qwen2 of hidden 64.

Parts, each a key of the JSON line. A figure named ``*_predicted`` beside a measured one comes from gpu_plan's model
(`gpu_plan.GPUS`: the published bfloat16 peak and bandwidth, MFU 0.4, 70 % of bandwidth for decoding); it is null on
the CPU and on a GPU that table does not know.

* ``engine``: `Engine` on the Qwen2-shaped model in bfloat16 (float32 on the CPU): tokens/s at batch 1, 8 and 64
  (concurrent chat requests of ``--tokens`` new tokens each), beside the decode bound: batch / ((weight bytes + the
  batch's KV bytes) / bandwidth).
* ``update``: one `PolicyUpdater` step of ``--update-tokens`` tokens on the Qwen2-shaped model, LoRA r16 and full
  fine-tuning in bfloat16 with a KL reference: seconds and the peak of allocated GPU memory (MB), beside the FLOPs
  time and `gpu_plan.rank_memory`.
* ``grpo``: `GRPO` through `Trainer` (a runner process, the gateway, the embedded engine on the device, a SQLite
  store) on the `small` model, 2 steps with LoRA and 2 with full fine-tuning: each step's seconds (rollouts,
  update) and the update's predicted seconds from the tokens it ran; the agent is `bench/_gpu_agents.py`'s.
* ``fsdp``: `DistributedPolicyUpdater` with ``sharding: fsdp`` (FSDP2) as the one rank of a ``torchrun``, over NCCL
  (gloo on the CPU), float32: a step's seconds, the parameters held as FSDP2 shards, and the largest difference between its served weights and a 1-rank
  `PolicyUpdater`'s after the same two steps.
* ``export``: the full-fine-tuning run's checkpoint exported (`lightrail.model.export.export_checkpoint`), loaded
  back by transformers' ``from_pretrained`` onto the device, and a greedy continuation generated from it.

Progress on stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._util import log  # noqa: E402
from bench.gpu_plan import (  # noqa: E402
    BW_SHARE,
    GPUS,
    MFU,
    Arch,
    Update,
    measure_step,
    rank_memory,
    step_row,
    update_flops_per_token,
)

KEYS = ("device", "engine", "update", "grpo", "fsdp", "export", "minutes")

QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864}  # fmt: skip
"""Qwen2-0.5B's published shape (its config.json), but for the vocabulary."""
QWEN2_DRY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128}  # fmt: skip


def build_qwen2(out: Path, tokenizer_dir: Path, dims: dict[str, int], seed: int = 0) -> Path:
    """A random-weight Qwen2 of shape ``dims`` over the tokenizer in ``tokenizer_dir``, saved to ``out``."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **dims,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


async def engine_part(path: Path, device: str, dtype: str, batches: list[int], tokens: int, gpu: Any) -> dict:
    """Tokens/s of the embedded engine at each batch size, beside the decode bound."""
    from lightrail.engine import Engine
    from lightrail.types import ChatRequest, SamplingParams

    engine = await asyncio.to_thread(Engine.from_pretrained, str(path), device=device, dtype=dtype)
    config = engine.model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    element = next(engine.model.parameters()).element_size()
    kv_per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * element
    )

    def request(i: int, max_tokens: int) -> ChatRequest:
        return ChatRequest(
            model="policy",
            messages=[{"role": "user", "content": f"Tell me about the number {i}."}],
            sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i),
        )

    out: dict[str, Any] = {"params_m": round(sum(p.numel() for p in engine.model.parameters()) / 1e6, 1)}
    try:
        await engine.chat(request(0, 4))  # warm-up: first-call allocations, kernels
        for batch in batches:
            t0 = time.perf_counter()
            done = await asyncio.gather(*(engine.chat(request(i, tokens)) for i in range(batch)))
            seconds = time.perf_counter() - t0
            generated = sum(len(g.choices[0].token_ids) for g in done)
            prompt = sum(len(g.prompt_ids or ()) for g in done) / batch
            step_s = None
            if gpu is not None:
                context = prompt + tokens / 2
                step_s = (weight_bytes + batch * context * kv_per_token) / (gpu.bandwidth * BW_SHARE)
            out[f"batch_{batch}_tokens_per_s"] = round(generated / seconds, 1)
            out[f"batch_{batch}_tokens_per_s_predicted"] = None if step_s is None else round(batch / step_s, 1)
            log(f"engine, batch {batch}: {generated} tokens in {seconds:.2f} s ({generated / seconds:.1f} tokens/s)")
    finally:
        await engine.close()
    return out


def update_part(path: Path, device: str, dtype: str, tokens: int, gpu: Any) -> dict:
    """One step of LoRA and of full fine-tuning on ``path``: seconds and peak memory beside the model's."""
    import torch

    from lightrail.model import LoraSettings, PolicyUpdater, UpdateConfig

    arch = Arch.from_config(path.name, json.loads((path / "config.json").read_text()))
    weight_bytes = 2 if dtype == "bfloat16" else 4
    row = step_row(tokens, arch.vocab)
    out: dict[str, Any] = {"tokens": tokens}
    for name, lora in (("lora16", LoraSettings(r=16, alpha=32)), ("full", None)):
        u = Update(weight_bytes=weight_bytes, lora_r=None if lora is None else 16, kl=True, micro_batch_tokens=tokens,
                   response_share=0.25)  # fmt: skip
        config = UpdateConfig(lr=1e-5, device=device, dtype=dtype, kl_coef=0.02, lora=lora, micro_batch_tokens=tokens,
                              share_prefixes=False)  # fmt: skip
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        updater = PolicyUpdater(str(path), config)
        try:
            measured = measure_step(updater, row, arch, u)
        finally:
            updater.close()
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        del updater  # its weights and optimizer state must not count in the next arm's peak
        gc.collect()
        flops = tokens * update_flops_per_token(arch, u, tokens // 2)
        out[f"{name}_step_s"] = round(measured["seconds"], 3)
        out[f"{name}_step_s_predicted"] = None if gpu is None else round(flops / (gpu.bf16_flops * MFU), 3)
        out[f"{name}_peak_mb"] = None if peak is None else round(peak / 1e6, 1)
        out[f"{name}_peak_mb_predicted"] = round(rank_memory(arch, u)["total"] / 1e6, 1)
        log(f"update, {name}: {measured['seconds']:.2f} s, peak {out[f'{name}_peak_mb']} MB "
            f"(predicted {out[f'{name}_step_s_predicted']} s, {out[f'{name}_peak_mb_predicted']} MB)")  # fmt: skip
    return out


def grpo_part(path: Path, out_dir: Path, device: str, dtype: str, steps: int, gpu: Any) -> dict:
    """`GRPO` through `Trainer`, LoRA then full fine-tuning: per-step seconds, and the update's predicted ones."""
    from bench._util import fit_arm
    from lightrail.algorithms import GRPO
    from lightrail.model import LoraSettings, UpdateConfig

    arch = Arch.from_config(path.name, json.loads((path / "config.json").read_text()))
    tasks = [{"prompt": f"Say something about the number {i}."} for i in range(16)]
    out: dict[str, Any] = {"steps": steps}
    for name, lora in (("lora16", LoraSettings(r=16, alpha=32)), ("full", None)):
        grpo = GRPO(
            str(path), steps=steps, tasks_per_step=2, n_samples=4, val_every=0, validate_before=False,
            checkpoint_every=0, out_dir=str(out_dir / name), sampling={"temperature": 1.0, "max_tokens": 32},
            engine_options={"device": device, "dtype": dtype}, mismatch_stop=0.5,
            config=UpdateConfig(lr=1e-4, device=device, dtype=dtype, lora=lora, micro_batch_tokens=2048),
        )  # fmt: skip
        lines = fit_arm(grpo, "bench._gpu_agents:parity_agent", tasks, [], store=out_dir / f"{name}.db", concurrency=8)
        u = Update(weight_bytes=2 if dtype == "bfloat16" else 4, lora_r=None if lora is None else 16, kl=False)
        predicted = [
            line["update_s"] * line["update_tokens_per_s"] * update_flops_per_token(arch, u, 64)
            / (gpu.bf16_flops * MFU) if gpu is not None else None
            for line in lines
        ]  # fmt: skip
        out[f"{name}_step_s"] = [round(line["step_s"], 2) for line in lines]
        out[f"{name}_rollout_s"] = [round(line["rollout_s"], 2) for line in lines]
        out[f"{name}_update_s"] = [round(line["update_s"], 3) for line in lines]
        out[f"{name}_update_s_predicted"] = [_round(p, 4) for p in predicted]
        out[f"{name}_mismatch_kl_mean"] = [line["mismatch_kl_mean"] for line in lines]
        out[f"{name}_trained"] = [line["transitions_trained"] for line in lines]
        log(f"grpo, {name}: steps {out[f'{name}_step_s']} s, updates {out[f'{name}_update_s']} s")
    return out


_FSDP_RANK = """
import json, sys, time
import torch
from bench.gpu_plan import step_row
from lightrail.model import PolicyUpdater, UpdateConfig
from lightrail.model.distributed import DistributedPolicyUpdater

model, out, device, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
vocab = json.load(open(f"{model}/config.json"))["vocab_size"]
torch.manual_seed(0)
row = step_row(tokens, vocab)
settings = dict(lr=1e-4, device=device, dtype="float32", micro_batch_tokens=tokens, share_prefixes=False)
sharded = DistributedPolicyUpdater(model, UpdateConfig(sharding="fsdp", **settings))
sharded.step([row])
t0 = time.perf_counter()
sharded.step([row])
seconds = time.perf_counter() - t0
served = {k: v.detach().float().cpu() for k, v in sharded.state_dict_for_serving().items()}
backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
dtensors = sum(hasattr(p, "full_tensor") for p in sharded.model.parameters())  # FSDP2 holds its shards as DTensors
sharded.close()
one = PolicyUpdater(model, UpdateConfig(**settings))
one.step([row])
one.step([row])
diff = max(float((served[k] - v.detach().float().cpu()).abs().max()) for k, v in one.state_dict_for_serving().items())
json.dump({"step_s": round(seconds, 3), "served_max_abs_diff": diff, "backend": backend, "sharded_params": dtensors},
          open(out, "w"))
"""


def fsdp_part(path: Path, out_dir: Path, device: str, tokens: int) -> dict:
    """FSDP2 as the one rank of a torchrun (NCCL on a GPU): a step's seconds and its served weights against 1 rank's."""
    script, result = out_dir / "fsdp_rank.py", out_dir / "fsdp.json"
    script.write_text(_FSDP_RANK)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun) if torchrun.exists() else sys.executable, *([] if torchrun.exists() else
               ["-m", "torch.distributed.run"]), "--standalone", "--nproc-per-node", "1", str(script), str(path),
               str(result), device, str(tokens)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the FSDP rank failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(result.read_text())
    log(f"fsdp: {figures}")
    return figures


def export_part(run_dir: Path, out_dir: Path, device: str) -> dict:
    """The run's newest checkpoint exported, loaded back by transformers onto ``device``, and 8 greedy tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightrail.model.export import export_checkpoint

    t0 = time.perf_counter()
    folder = export_checkpoint(run_dir, out_dir / "exported")
    export_s = time.perf_counter() - t0
    model = AutoModelForCausalLM.from_pretrained(folder).to(device)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("Tell me about the number 7.", return_tensors="pt").input_ids.to(device)
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    figures = {"export_s": round(export_s, 2), "generated_tokens": int(generated.shape[1] - ids.shape[1]),
               "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1)}  # fmt: skip
    log(f"export: {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry", action="store_true", help="the same code paths on the CPU at tiny sizes")
    parser.add_argument("--smoke", action="store_true", help="the same as --dry (the suite's name for it)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per engine request (default 64)")
    parser.add_argument("--update-tokens", type=int, default=2048, help="tokens of the update step (default 2048)")
    parser.add_argument("--out", type=Path, default=None, help="where models and runs go (default: a temporary one)")
    args = parser.parse_args()
    import torch

    from lightrail.engine.models import build_tiny_model

    dry = args.dry or args.smoke
    started = time.perf_counter()
    if not dry and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); --dry runs it on the CPU")
    device, dtype = ("cpu", "float32") if dry else ("cuda", "bfloat16")
    name = "cpu" if dry else torch.cuda.get_device_name(0)
    gpu = None if dry else next((spec for key, spec in GPUS.items() if key in name), None)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="lightrail-gpu-check-"))
    log(f"{name}: torch {torch.__version__}, models and runs in {out_dir}")
    small = build_tiny_model(out_dir / "small", size="tiny" if dry else "small")
    qwen = build_qwen2(out_dir / "qwen2", small, QWEN2_DRY if dry else QWEN2_05B)
    result: dict[str, Any] = {"device": name, "torch": torch.__version__, "dry": dry,
                              "gpu_spec": None if gpu is None else gpu.name}  # fmt: skip
    batches = [1, 2] if dry else [1, 8, 64]
    result["engine"] = asyncio.run(engine_part(qwen, device, dtype, batches, 8 if dry else args.tokens, gpu))
    result["update"] = update_part(qwen, device, dtype, 64 if dry else args.update_tokens, gpu)
    result["grpo"] = grpo_part(small, out_dir / "grpo", device, dtype, 1 if dry else 2, gpu)
    result["fsdp"] = fsdp_part(small, out_dir, device, 64 if dry else 1024)
    result["export"] = export_part(out_dir / "grpo" / "full", out_dir, device)
    result["minutes"] = round((time.perf_counter() - started) / 60, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
