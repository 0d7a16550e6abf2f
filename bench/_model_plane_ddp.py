"""Data-parallel policy update: 2 gloo ranks against 1 process on the same rows, same weights after the step.

    .venv/bin/python bench/_model_plane_ddp.py [--quick]

Quick: the random ~6 M-parameter ``small`` model, 33 rows. Full: SmolLM2-135M (``prepare_model("smollm2")``, fp32,
full fine-tuning, lr 1e-5), 17 rows. Rows: prompts of 60-120 tokens and responses of 20-40 (odd count, uneven lengths,
so the shards differ), advantages +-1, old logprobs 0 (every token clips the same way in both runs).

Each updater takes two steps on the same rows; the throughput figure is the second (warm) step's
``tokens_per_s`` as rank 0 reports it (sharding, scatter, compute, the gradient all-reduce and AdamW included).
Both runs use every core: the 1-rank update with all of them, each of the 2 ranks with half. So on this 2-core box
the figure shows what data parallelism costs and returns when it adds no hardware; on N GPUs each rank brings its
own device. ``ddp_max_abs_diff`` is the largest difference of any trainable weight after the two steps (the
acceptance bound is 1e-5). Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import log  # noqa: E402
from bench.update import build_rows  # noqa: E402


def measure(quick: bool, smoke: bool = False) -> dict:
    import torch
    from transformers import AutoConfig

    from lightrail.engine.models import build_tiny_model, prepare_model
    from lightrail.model import PolicyUpdater, UpdateConfig
    from lightrail.model.distributed import DistributedPolicyUpdater

    if quick or smoke:
        import tempfile

        size = "tiny" if smoke else "small"
        model = build_tiny_model(Path(tempfile.mkdtemp(prefix="ddp-bench-")) / size, size=size, seed=0)
        n_rows, lr = (5 if smoke else 33), 5e-4
    else:
        model = prepare_model("smollm2")
        n_rows, lr = 17, 1e-5
    vocab = AutoConfig.from_pretrained(model).vocab_size
    rows = build_rows(n_rows, vocab, rows_per_rollout=2)  # rollouts of 2 rows: the loss norm spans ranks
    config = UpdateConfig(lr=lr, micro_batch_tokens=2048, compute_entropy=False)
    cores = os.cpu_count() or 1
    threads_before = torch.get_num_threads()

    log(f"1 rank, {cores} threads: {model.name}, {n_rows} rows")
    torch.set_num_threads(cores)
    one = PolicyUpdater(str(model), config)
    one.step(rows)
    single = one.step(rows)
    reference = {n: p.detach().clone() for n, p in one._trainable.items()}
    del one

    log(f"2 ranks, {max(1, cores // 2)} threads each")
    torch.set_num_threads(max(1, cores // 2))
    t0 = time.perf_counter()
    with DistributedPolicyUpdater(str(model), UpdateConfig(**{**vars(config), "ranks": 2})) as two:
        start_s = time.perf_counter() - t0
        two.step(rows)
        double = two.step(rows)
        diff = max(float((p.detach() - reference[n]).abs().max()) for n, p in two._trainable.items())
    torch.set_num_threads(threads_before)
    result = {
        "ddp_ranks": 2,
        "ddp_model": "tiny" if smoke else "small" if quick else "smollm2-135m",
        "ddp_rows": n_rows,
        "ddp_step_tokens": int(single["tokens"]),
        "ddp_max_abs_diff": diff,
        "ddp_update_tokens_per_s_2": double["tokens_per_s"],
        "ddp_update_tokens_per_s_1": single["tokens_per_s"],
        "ddp_step_s_2": double["seconds"],
        "ddp_step_s_1": single["seconds"],
        "ddp_start_s": start_s,
        "ddp_cores": cores,
        "ddp_loadavg_1m": os.getloadavg()[0],
    }
    if diff > 1e-5:
        raise AssertionError(f"2-rank weights differ from 1-rank by {diff:.3g} > 1e-5")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the ~6 M-parameter model instead of SmolLM2-135M")
    print(json.dumps(measure(parser.parse_args().quick)), flush=True)


if __name__ == "__main__":
    main()
