"""Sharded policy update (FSDP2, ``UpdateConfig(sharding="fsdp")``): 2 sharded gloo ranks against 1 process on the
same rows and weights, in one run: the same weights after the step, and about half the training state per rank.

    .venv/bin/python bench/sharded.py [--size tiny|small] [--rows N] [--lora]
    .venv/bin/python bench/sharded.py --smoke    # tiny, 5 rows

The model is a random Llama from `build_tiny_model` (``small``: ~6 M parameters, the default; ``tiny`` for a quick
look), full fine-tuning unless ``--lora``, fp32, one AdamW step over ``--rows`` rows of `bench.update.build_rows`
(prompts of 60-120 tokens, responses of 20-40, rollouts of 2 rows so the loss norm spans ranks), no KL term (its
frozen reference copy is not sharded, see docs/gpus.md).

* ``sharded_max_abs_diff``: the largest difference of any trainable weight after the step, 2 sharded ranks (gathered
  whole through `DistributedPolicyUpdater.trainable_weights`) against 1 process (target <= 1e-5).
* ``sharded_state_bytes_per_rank`` / ``unsharded_state_bytes``: the bytes a rank holds right after the step for the
  policy's parameters (all of them, trainable or frozen), their gradients and AdamW's state, counted from the
  tensors themselves (a sharded tensor's local shard). Measured on rank 0, whose shards are the largest (FSDP cuts
  dim 0 in ``ceil(n / ranks)`` chunks, rank 0 first). Their ratio (``sharded_state_bytes_per_rank_ratio``, target
  <= 0.6) approaches 1/ranks; the ``_params`` / ``_grads`` / ``_optim`` keys split it.
* ``sharded_gather_unit_bytes``: what a sharded rank holds on top, transiently: the parameters of the largest FSDP
  unit (a decoder layer, or the root: embeddings, final norm, LM head) gathered whole around its forward and
  backward (FSDP2 also prefetches the next unit, so up to about two of these at a time).
* ``sharded_step_s`` / ``unsharded_step_s``: the step's wall time (2 cores: the sharded step runs the same compute
  plus its gathers over gloo, so this is the cost of sharding without added hardware, not a speed-up claim).

Progress goes to stderr; the last stdout line is one JSON object, with the machine's speed (`machine_facts`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402
from bench.update import build_rows  # noqa: E402

KEYS = ("sharded_max_abs_diff", "sharded_loss_diff", "sharded_state_bytes_per_rank", "unsharded_state_bytes",
        "sharded_state_bytes_per_rank_ratio", "sharded_gather_unit_bytes", "sharded_step_s", "unsharded_step_s")  # fmt: skip


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(upd: Any) -> dict[str, int]:
    """Bytes this process holds for the policy's parameters, their gradients and the optimizer's state."""
    params = list(upd.model.parameters())
    out = {
        "params": sum(_local(p).nbytes for p in params),
        "grads": sum(_local(p.grad).nbytes for p in params if p.grad is not None),
        "optim": sum(_local(v).nbytes for s in upd.optimizer.state.values() for v in s.values() if v.ndim),
    }
    return {**out, "total": sum(out.values())}


def largest_unit_bytes(upd: Any) -> int:
    """The parameters of the largest FSDP unit, whole: each decoder layer, and the root (everything else)."""
    base = upd.model.get_base_model() if upd.is_lora else upd.model
    layers = [sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in base.get_decoder().layers]
    total = sum(p.numel() * p.element_size() for p in upd.model.parameters())
    return max([*layers, total - sum(layers)])


def measure(size: str, n_rows: int, lora: bool) -> dict:
    from transformers import AutoConfig

    from lightrail.engine.models import build_tiny_model
    from lightrail.model import LoraSettings, PolicyUpdater, UpdateConfig
    from lightrail.model.distributed import DistributedPolicyUpdater

    model = build_tiny_model(Path(tempfile.mkdtemp(prefix="sharded-bench-")) / size, size=size, seed=0)
    rows = build_rows(n_rows, AutoConfig.from_pretrained(model).vocab_size, rows_per_rollout=2)
    config = UpdateConfig(
        lr=5e-4, micro_batch_tokens=1024, compute_entropy=False, lora=LoraSettings(r=8, alpha=16) if lora else None
    )

    log(f"1 process: {size}, {n_rows} rows, {'LoRA' if lora else 'full'}")
    one = PolicyUpdater(str(model), config)
    t0 = time.perf_counter()
    single = one.step(rows)
    unsharded_s = time.perf_counter() - t0
    reference = one.trainable_weights()
    whole = state_bytes(one)
    del one

    log("2 sharded ranks")
    sharded = UpdateConfig(**{**vars(config), "ranks": 2, "sharding": "fsdp"})
    with DistributedPolicyUpdater(str(model), sharded, timeout_s=600) as two:
        t0 = time.perf_counter()
        double = two.step(rows)
        sharded_s = time.perf_counter() - t0
        mine = state_bytes(two)  # rank 0's shards, the largest
        unit = largest_unit_bytes(two)
        weights = two.trainable_weights()
    diff = max(float((weights[n] - reference[n]).abs().max()) for n in reference)
    result = {
        "sharded_ranks": 2,
        "sharded_model": size,
        "sharded_lora": lora,
        "sharded_rows": n_rows,
        "sharded_step_tokens": int(single["tokens"]),
        "sharded_max_abs_diff": diff,
        "sharded_loss_diff": abs(double["loss"] - single["loss"]),
        "sharded_state_bytes_per_rank": mine["total"],
        "unsharded_state_bytes": whole["total"],
        "sharded_state_bytes_per_rank_ratio": round(mine["total"] / whole["total"], 4),
        **{f"sharded_{k}_bytes_per_rank": mine[k] for k in ("params", "grads", "optim")},
        **{f"unsharded_{k}_bytes": whole[k] for k in ("params", "grads", "optim")},
        "sharded_gather_unit_bytes": unit,
        "sharded_step_s": round(sharded_s, 2),
        "unsharded_step_s": round(unsharded_s, 2),
    }
    result["targets_met"] = {
        "sharded_max_abs_diff": diff <= 1e-5,
        "sharded_state_bytes_per_rank_ratio": result["sharded_state_bytes_per_rank_ratio"] <= 0.6,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "small"], default="small", help="the random Llama's size")
    parser.add_argument("--rows", type=int, default=17, help="rows in the step (odd: the ranks' shares differ)")
    parser.add_argument("--lora", action="store_true", help="a LoRA adapter instead of full fine-tuning")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.size, args.rows = "tiny", 5
    facts = machine_facts()
    log(f"machine: {facts}")
    print(json.dumps({**facts, **measure(args.size, args.rows, args.lora)}), flush=True)


if __name__ == "__main__":
    main()
