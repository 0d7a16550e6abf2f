"""Memory per GPU and step time of the seed GPU configurations, from a written model of the computation, checked on
this CPU where the two overlap.

    .venv/bin/python bench/gpu_plan.py            # the tables of docs/gpus.md, then the CPU check (~2 min)
    .venv/bin/python bench/gpu_plan.py --no-check # the tables only
    .venv/bin/python bench/gpu_plan.py --smoke    # the tables, then the CPU check on the tiny model, 64 tokens

The model (each term is a function below, in bytes or FLOPs):

* **State per update rank**: the weights (``P`` x their dtype), and for the trained parameters their gradients and
  AdamW's two moments in the trained parameters' dtype (`torch.optim.AdamW` keeps them in the parameter's dtype; full
  fine-tuning in bfloat16 keeps no float32 master copy, `UpdateConfig.dtype`). LoRA adapters are float32 (peft's
  default) with their gradients and moments; the KL reference is the base with the adapter switched off (no copy).
  Full fine-tuning with ``kl_coef > 0`` keeps a frozen copy of the start. Data-parallel ranks each hold all of it.
* **Activations of one micro-batch** (the update keeps them: no gradient checkpointing): ``micro_batch_tokens`` x
  the bytes autograd saves per token and decoder layer, plus the float32 logits of the response tokens (the LM head
  runs on response rows only) held three times at the peak of the backward (saved logits, the softmax, their
  gradient). The bytes per token and layer are read off what Hugging Face's Llama block saves (SDPA attention, which
  keeps no ``T x T`` matrix): for weights of ``b`` bytes, ``(8h + 2kv + 4i) b`` plus the RMS norms' float32
  statistics and one float per head; LoRA's frozen projections do not save their inputs but peft's float32 adapters
  save float32 copies of them, plus ``r`` floats per adapted projection (`_layer_bytes`).
* **Update FLOPs per token**: a forward is ``2 P_decoder`` plus attention ``2 L d_attn S`` (causal, mean context
  ``S``) plus the LM head ``2 h V`` on response tokens; the backward is twice the forward for full fine-tuning and
  once for LoRA (gradients flow through frozen weights, their own gradients are not formed); the KL reference adds
  one forward without gradient. Step time = tokens x FLOPs per token / (ranks x peak x MFU).
* **Rollouts on one vLLM GPU**: each decode step reads the weights and every running sequence's KV cache (memory
  bound at agent batch sizes: ``(2P + B S kv_bytes) / bandwidth``); prompts are prefilled at compute speed
  (prefix caching skips what an earlier call of the rollout already computed).

The CPU check runs lightrail's own `PolicyUpdater` on SmolLM2-135M-Instruct (a Llama, 30 layers, a shape none of the
small random models the coefficients were read from has) in the three update precisions the configs use (float32
full, bfloat16 full, bfloat16 + float32 LoRA): the bytes autograd saved during one step (`saved_tensors_hooks`, the
activations the model predicts) and the parameter + gradient + optimizer + reference bytes held after it, each
against the model's prediction. It also times the step against a float32 matrix-multiply measured in the same run.
The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("plan", "cpu_gemm_gflops", "memory_model_max_error")

GB = 1e9


@dataclass(frozen=True)
class Arch:
    """The shape of a Llama-style decoder (Llama, Qwen2, SmolLM2), from its ``config.json``."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False

    @classmethod
    def from_config(cls, name: str, c: dict) -> Arch:
        heads = c["num_attention_heads"]
        return cls(
            name=name,
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads", heads),
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate=c["intermediate_size"],
            vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=c.get("model_type") == "qwen2",
        )

    @property
    def attn(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear projection of one layer."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.attn),
            "k_proj": (h, self.kv),
            "v_proj": (h, self.kv),
            "o_proj": (self.attn, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def decoder_params(self) -> int:
        layer = sum(a * b for a, b in self.projections().values()) + 2 * self.hidden
        if self.qkv_bias:
            layer += self.attn + 2 * self.kv
        return self.layers * layer + self.hidden

    def params(self) -> int:
        return self.decoder_params() + self.vocab * self.hidden * (1 if self.tied else 2)

    def lora_params(self, r: int) -> int:
        return self.layers * sum(r * (a + b) for a, b in self.projections().values())


# Published config.json values (huggingface.co/<repo>/blob/main/config.json); lightrail never downloads at run time.
LLAMA_3B = Arch("Llama-3.2-3B-Instruct", 3072, 28, 24, 8, 128, 8192, 128256, tied=True)
QWEN_15B = Arch("Qwen2.5-Coder-1.5B-Instruct", 1536, 28, 12, 2, 128, 8960, 151936, tied=True, qkv_bias=True)


@dataclass(frozen=True)
class Update:
    """What the update of one rank holds and computes (the `grpo.config` of a GPU config)."""

    weight_bytes: int = 2  # bfloat16
    lora_r: int | None = None  # None: full fine-tuning
    kl: bool = True
    micro_batch_tokens: int = 16384
    response_share: float = 0.1  # response tokens / all tokens of a micro-batch


def _layer_bytes(arch: Arch, u: Update) -> float:
    """Bytes autograd saves per token in one decoder layer (HF Llama block, SDPA attention, no checkpointing)."""
    h, kv, i, b = arch.hidden, arch.kv, arch.intermediate, u.weight_bytes
    norms = 0 if b == 4 else 4 * h  # RMSNorm computes in float32: the two norms keep a float32 copy of their input
    per = (8 * h + 2 * kv + 4 * i) * b + norms + 4 * arch.heads + 8  # one logsumexp per head; the norms' rstd
    if u.lora_r is None:
        return per
    # Frozen projections save no input for a weight gradient (-2h: q/k/v and gate/up share theirs with the norm's
    # output, which stays saved); float32 adapters: peft casts each adapted projection's input to float32 and saves it
    # (5 of hidden width, one of the MLP's width: measured as 5h x 4 + i x 2 over the bfloat16 base), and r floats out
    # of each A.
    per -= 2 * h * b
    if b != 4:
        per += 20 * h + 2 * i
    return per + 7 * u.lora_r * 4


def activation_bytes(arch: Arch, u: Update, tokens: int | None = None) -> float:
    t = u.micro_batch_tokens if tokens is None else tokens
    # Outside the layers: the final norm keeps its input (float32 too under bfloat16) when its gain trains (not LoRA).
    outside = (
        0
        if u.lora_r is not None
        else 2 * arch.hidden * u.weight_bytes + (4 * arch.hidden if u.weight_bytes != 4 else 0)
    )
    per_token = arch.layers * _layer_bytes(arch, u) + outside
    return t * per_token + logits_bytes(arch, u, tokens, copies=1)


def logits_bytes(arch: Arch, u: Update, tokens: int | None = None, *, copies: int = 3) -> float:
    t = u.micro_batch_tokens if tokens is None else tokens
    return copies * t * u.response_share * arch.vocab * 4


def state_bytes(arch: Arch, u: Update) -> dict[str, float]:
    """Weights, gradients, optimizer moments and the KL reference of one rank."""
    p, b = arch.params(), u.weight_bytes
    if u.lora_r is not None:
        lp = arch.lora_params(u.lora_r)
        return {"weights": p * b + lp * 4, "grads": lp * 4, "adam": 2 * lp * 4, "reference": 0.0}
    return {"weights": p * b, "grads": p * b, "adam": 2 * p * b, "reference": p * b if u.kl else 0.0}


def rank_memory(arch: Arch, u: Update) -> dict[str, float]:
    out = state_bytes(arch, u)
    out["activations"] = activation_bytes(arch, u)
    out["logits_peak_extra"] = logits_bytes(arch, u, copies=2)
    out["total"] = sum(out.values())
    return out


def fitting_micro_batch(arch: Arch, u: Update, budget_bytes: float) -> int:
    """The largest ``micro_batch_tokens`` (a multiple of 512) whose rank memory fits ``budget_bytes``."""
    fixed = sum(state_bytes(arch, u).values())
    per_token = activation_bytes(arch, u, 1) + logits_bytes(arch, u, 1, copies=2)
    return max(0, int((budget_bytes - fixed) / per_token) // 512 * 512)


def update_flops_per_token(arch: Arch, u: Update, context: int) -> float:
    forward = (
        2 * arch.decoder_params()
        + 2 * arch.layers * arch.attn * context
        + 2 * arch.hidden * arch.vocab * (u.response_share)
    )
    backward = forward * (1 if u.lora_r is not None else 2)
    return forward + backward + (forward if u.kl else 0)


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops: float  # dense peak
    bandwidth: float  # bytes/s
    memory: float


A100 = GPU("A100-80GB", 312e12, 2.0e12, 80 * GB)
H100 = GPU("H100-SXM-80GB", 989e12, 3.35e12, 80 * GB)
H200 = GPU("H200-141GB", 989e12, 4.8e12, 141 * GB)
GPUS = {"A100": A100, "H100": H100, "H200": H200}
"""Published dense bfloat16 peaks and memory bandwidths (NVIDIA's data sheets), by the name
``torch.cuda.get_device_name`` contains (`bench/gpu_check.py` predicts with them)."""
MFU = 0.4  # share of peak an update's large matmuls reach (stated, not measured here: no GPU)
BW_SHARE = 0.7  # share of the memory bandwidth a decode step reaches


@dataclass(frozen=True)
class Workload:
    """One GRPO step of a GPU config: ``tasks x samples`` rollouts of ``calls`` LLM calls each."""

    rollouts: int
    calls: int
    prompt_tokens: int  # per call, the whole prompt
    new_prompt_tokens: int  # per call, what prefix caching does not cover
    response_tokens: int  # per call
    concurrency: int  # sequences vLLM runs at once
    trained_calls: int  # calls per rollout that become training rows


def rollout_seconds(arch: Arch, w: Workload, gpu: GPU) -> float:
    kv_bytes = 2 * arch.layers * arch.kv * 2  # keys and values, bfloat16, per token
    context = w.prompt_tokens + w.response_tokens / 2
    step = (2 * arch.params() + w.concurrency * context * kv_bytes) / (gpu.bandwidth * BW_SHARE)
    decode = w.rollouts * w.calls * w.response_tokens / w.concurrency * step
    prefill = w.rollouts * w.calls * w.new_prompt_tokens * 2 * arch.params() / (gpu.bf16_flops * MFU)
    return decode + prefill


def update_seconds(arch: Arch, u: Update, w: Workload, gpu: GPU, ranks: int) -> float:
    tokens = w.rollouts * w.trained_calls * (w.prompt_tokens + w.response_tokens)
    flops = tokens * update_flops_per_token(arch, u, (w.prompt_tokens + w.response_tokens) // 2)
    return flops / (ranks * gpu.bf16_flops * MFU)


# The three seed configurations (examples/*/config.gpu.yaml). Token counts per call are those the SmolLM2 runs of the
# same agents recorded (`lightrail show`: calculator ~350 prompt / ~30 generated per solver call; SQL ~250-330 /
# ~20-45), with the GPU configs' larger max_tokens allowing longer answers: stated assumptions, not measurements.
CALC = Workload(rollouts=256, calls=3, prompt_tokens=400, new_prompt_tokens=150, response_tokens=60, concurrency=128,
                trained_calls=2)  # fmt: skip
SQL = Workload(rollouts=256, calls=4, prompt_tokens=300, new_prompt_tokens=150, response_tokens=40, concurrency=128,
               trained_calls=2)  # fmt: skip
SEEDS = {
    "3B LoRA r32 (calc_agent; rag_agent alike)": ("examples/calc_agent/config.gpu.yaml", [], LLAMA_3B, CALC),
    "3B full (calc_agent, lora=null)": (
        "examples/calc_agent/config.gpu.yaml",
        ["grpo.config.lora=null"],
        LLAMA_3B,
        CALC,
    ),
    "1.5B full (sql_agent)": ("examples/sql_agent/config.gpu.yaml", [], QWEN_15B, SQL),
}
ROOT = Path(__file__).resolve().parents[1]


def seed_update(path: str, overrides: list[str]) -> tuple[Update, int]:
    """The `Update` a GPU config's ``grpo.config`` describes, and its ranks."""
    from lightrail.trainer.config import _grpo_kwargs, load_config

    c = _grpo_kwargs(load_config(ROOT / path, overrides))["config"]
    bytes_ = {"bfloat16": 2, "float16": 2, "float32": 4}[c.dtype or "bfloat16"]
    u = Update(weight_bytes=bytes_, lora_r=c.lora.r if c.lora else None, kl=c.kl_coef > 0,
               micro_batch_tokens=c.micro_batch_tokens)  # fmt: skip
    return u, c.ranks


def plan() -> dict:
    out: dict = {}
    for label, (path, overrides, arch, w) in SEEDS.items():
        u, ranks = seed_update(path, overrides)
        mem = rank_memory(arch, u)
        row = {k: round(v / GB, 1) for k, v in mem.items()}
        row["params_b"] = round(arch.params() / 1e9, 3)
        row["micro_batch_tokens"] = u.micro_batch_tokens
        for budget in (80, 40, 24):
            row[f"micro_batch_tokens_fit_{budget}gb"] = fitting_micro_batch(arch, u, (budget - 2) * GB)
        for gpu in (A100, H100):
            row[f"rollout_s_{gpu.name}"] = round(rollout_seconds(arch, w, gpu), 1)
            row[f"update_s_{gpu.name}"] = round(update_seconds(arch, u, w, gpu, ranks), 1)
        out[label] = row
    return out


def table(rows: dict) -> str:
    head = (
        "| configuration | params | weights | grads | Adam | KL ref | micro_batch_tokens | activations | logits peak | total "
        "| micro_batch_tokens that fit 80 / 40 / 24 GB | rollouts s (A100 / H100) | update s, 3 ranks (A100 / H100) |"
    )
    lines = [head, "|" + "---|" * 13]
    for label, r in rows.items():
        lines.append(
            f"| {label} | {r['params_b']} B | {r['weights']} | {r['grads']} | {r['adam']} | {r['reference']} "
            f"| {r['micro_batch_tokens']} | {r['activations']} | {r['logits_peak_extra']} | **{r['total']}** "
            f"| {r['micro_batch_tokens_fit_80gb']} / {r['micro_batch_tokens_fit_40gb']} / "
            f"{r['micro_batch_tokens_fit_24gb']} | {r[f'rollout_s_{A100.name}']} / {r[f'rollout_s_{H100.name}']} "
            f"| {r[f'update_s_{A100.name}']} / {r[f'update_s_{H100.name}']} |"
        )
    return "\n".join(lines)


def measure_step(updater, row, arch: Arch, u: Update) -> dict[str, float]:
    """One `PolicyUpdater.step` after a warm-up step: the bytes autograd saved (activations and logits), the bytes
    held (parameters, gradients, optimizer moments, the KL reference) and the seconds, next to the model's figures."""
    import torch

    updater.step([row])  # the optimizer's moments exist after the first step
    params = {p.untyped_storage().data_ptr() for p in updater.model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        updater.step([row])
    seconds = time.perf_counter() - t0
    trained = [p for p in updater.model.parameters() if p.requires_grad]
    moments = [t for st in updater.optimizer.state.values() for t in st.values() if torch.is_tensor(t) and t.dim()]
    held = sum(t.numel() * t.element_size() for t in [*updater.model.parameters(), *trained, *moments])
    if updater.reference is not None:
        held += sum(p.numel() * p.element_size() for p in updater.reference.parameters())
    return {
        "activations": sum(saved.values()),
        "activations_model": activation_bytes(arch, u),
        "state": held,
        "state_model": sum(state_bytes(arch, u).values()),
        "seconds": seconds,
    }


def step_row(tokens: int, vocab: int, response_share: float = 0.25):
    """A row of random tokens whose last ``response_share`` are the response."""
    import torch

    from lightrail.types import TrainingRow

    response = int(tokens * response_share)
    mask = [0] * (tokens - response) + [1] * response
    return TrainingRow(
        input_ids=torch.randint(3, vocab, (tokens,)).tolist(),
        loss_mask=mask,
        old_logprobs=[-1.0 * m for m in mask],
        advantages=[0.5 * m for m in mask],
    )


PRECISIONS = {  # name: (the model's Update, the UpdateConfig fields the configs use)
    "fp32_full": (Update(weight_bytes=4, kl=False), {"dtype": "float32"}),
    "bf16_full": (Update(weight_bytes=2, kl=True), {"dtype": "bfloat16", "kl_coef": 0.02}),
    "bf16_lora16": (Update(weight_bytes=2, lora_r=16, kl=True), {"dtype": "bfloat16", "kl_coef": 0.02, "lora": 16}),
}


def updater_for(model, name: str, tokens: int, response_share: float = 0.25):
    """A `PolicyUpdater` in precision ``name`` with one micro-batch of ``tokens``, and the model's `Update` for it."""
    from lightrail.model.updater import LoraSettings, PolicyUpdater, UpdateConfig

    u, fields = PRECISIONS[name]
    fields = {**fields, "micro_batch_tokens": tokens, "share_prefixes": False, "lr": 1e-5}
    if "lora" in fields:
        fields["lora"] = LoraSettings(r=fields["lora"], alpha=2 * fields["lora"])
    u = replace(u, micro_batch_tokens=tokens, response_share=response_share)
    return PolicyUpdater(model, UpdateConfig(**fields)), u


def cpu_check(tokens: int = 1024, model: str = "smollm2") -> dict:
    """lightrail's updater on ``model`` (SmolLM2; ``--smoke``: the tiny random Llama) in the configs' three
    precisions: measured bytes and time against the model."""
    import torch

    from lightrail.engine.models import prepare_model

    torch.manual_seed(0)
    path = prepare_model(model)
    arch = Arch.from_config(path.name, json.loads((path / "config.json").read_text()))
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    gemm_flops = 20 * 2 * 1024**3 / (time.perf_counter() - t0)
    out: dict = {"cpu_gemm_gflops": round(gemm_flops / 1e9, 1)}
    row = step_row(tokens, arch.vocab)
    for name in PRECISIONS:
        updater, u = updater_for(str(path), name, tokens)
        m = measure_step(updater, row, arch, u)
        updater.close()
        flops = tokens * update_flops_per_token(arch, u, tokens // 2)
        out[f"{name}_activations_mb"] = round(m["activations"] / 1e6, 1)
        out[f"{name}_activations_ratio"] = round(m["activations"] / m["activations_model"], 3)
        out[f"{name}_state_mb"] = round(m["state"] / 1e6, 1)
        out[f"{name}_state_ratio"] = round(m["state"] / m["state_model"], 3)
        out[f"{name}_step_s"] = round(m["seconds"], 2)
        out[f"{name}_flops_share_of_gemm"] = round(flops / m["seconds"] / gemm_flops, 2)
        log(f"{name}: activations {m['activations'] / 1e6:.1f} MB (x{out[f'{name}_activations_ratio']} the model), "
            f"state {m['state'] / 1e6:.1f} MB (x{out[f'{name}_state_ratio']}), step {m['seconds']:.2f} s")  # fmt: skip
    ratios = [v for k, v in out.items() if k.endswith("_ratio")]
    out["memory_model_max_error"] = round(max(abs(r - 1) for r in ratios), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-check", action="store_true", help="print the tables only (no CPU measurement)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    out: dict = {**machine_facts()}
    rows = plan()
    print(table(rows))
    out["plan"] = rows
    if not args.no_check:
        out.update(cpu_check(64, "tiny") if args.smoke else cpu_check())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
