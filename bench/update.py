"""How fast is the GRPO policy update compared with a plain forward+backward+AdamW pass over the same tokens?

    .venv/bin/python bench/update.py [--quick] [--reps N] [--rows N] [--budget TOKENS] [--shared-only]
    .venv/bin/python bench/update.py --smoke    # 4 rows, 1 repetition

Model: a random ~6 M-parameter Llama (hidden 256, 6 layers, 4 heads, ffn 1024, vocab 1024), full fine-tuning.
Rows: prompts of 60-120 tokens and responses of 20-40 tokens (loss mask on the response), advantages +-1, old
logprobs from the policy itself (on-policy, as right after a weight sync).

Four passes per repetition, interleaved A/B/C/D/A/B/C/D so background load on the shared machine hits them alike:

* ``update``: `PolicyUpdater.step` -- packing, the clipped loss, backward, gradient clipping, AdamW.
* ``fwd_bwd``: what a plain Hugging Face training step does on the same micro-batches: ``model(ids, labels=...)``
  (full ``[B, T, V]`` logits, cross-entropy on the response tokens), backward, gradient clipping, AdamW.
* ``fwd_bwd_sliced``: the same plain step but with the LM head applied only at response positions (the trick the
  update uses); the update's ratio to it is the pure cost of the GRPO bookkeeping.
* ``update_bf16``: `PolicyUpdater.step` with ``UpdateConfig(autocast="bfloat16")`` (mixed precision over float32
  weights); ``update_bf16_over_update`` is its speed-up, which needs bfloat16 matrix units (``cpu_capability``
  ``AVX512`` with AMX on Sapphire Rapids; a CPU without them is slower in bfloat16).

Shared prefixes (``UpdateConfig.share_prefixes``), on rows shaped like a multi-turn agent's: 4 tasks x 8 samples, each
task's prompt 250-350 tokens (system prompt, worked example, question) shared by its samples, then two turns of a
response (20-60 and 10-40 tokens, trained) around a tool result (10-30 tokens, not trained). ``update_shared`` and
``update_unshared`` (the same step with ``share_prefixes=False``, the baseline) are interleaved in the same run;
``shared_prefix_speedup`` is their ratio and ``shared_prefix_grad_diff`` the largest absolute difference of one
step's gradients between them (float32). ``--shared-only`` runs just these two.

Tokens = every input token run through the model (prompt and response; padding excluded). Medians are reported;
``update_over_fwd_bwd_cpu_time`` is the same ratio from the process's CPU seconds (steadier on a busy machine).
Progress goes to stderr; the LAST stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

from bench._util import SMOKE_HELP, cpu_amx, log, machine_facts  # noqa: E402
from lightrail.engine import configure_threads  # noqa: E402
from lightrail.model import PolicyUpdater, UpdateConfig, pack_micro_batches  # noqa: E402
from lightrail.types import TrainingRow  # noqa: E402

KEYS = ("update_tokens_per_s", "fwd_bwd_tokens_per_s", "update_over_fwd_bwd", "update_bf16_tokens_per_s",
        "shared_prefix_tokens_per_s", "shared_prefix_baseline_tokens_per_s", "shared_prefix_speedup",
        "shared_prefix_grad_diff", "rows", "tokens_per_step")  # fmt: skip


def build_model(vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def build_rows(n: int, vocab: int, seed: int = 0, rows_per_rollout: int = 1) -> list[TrainingRow]:
    """``n`` random rows of 80-160 tokens (20-40 trained), alternating advantages +1/-1, ``rows_per_rollout``
    consecutive rows per rollout (a rollout-mean loss then weighs them together), groups of 8."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt, response = rng.randint(60, 120), rng.randint(20, 40)
        mask = [0] * prompt + [1] * response
        ids = [rng.randrange(vocab) for _ in mask]
        rows.append(_row(ids, mask, 1.0 if i % 2 else -1.0, f"ro-{i // rows_per_rollout}", f"g-{i // 8}"))
    return rows


def _row(ids: list[int], mask: list[int], advantage: float, rollout_id: str, group_id: str) -> TrainingRow:
    """A row whose trained tokens all carry ``advantage``, old logprobs 0."""
    return TrainingRow(
        input_ids=ids, loss_mask=mask, old_logprobs=[0.0] * len(mask), advantages=[advantage * m for m in mask],
        rollout_id=rollout_id, group_id=group_id,
    )  # fmt: skip


def build_agent_rows(vocab: int, *, tasks: int = 4, samples: int = 8, seed: int = 0) -> list[TrainingRow]:
    """Multi-turn agent rows: per task one prompt of 250-350 tokens shared by its ``samples`` rows, each row then a
    response (20-60 tokens, trained), a tool result (10-30, not trained) and a second response (10-40, trained);
    advantages +-1 within a group."""
    rng = random.Random(seed)
    rows = []
    for task in range(tasks):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(250, 350))]
        for k in range(samples):
            ids, mask = list(prompt), [0] * len(prompt)
            for n, trained in ((rng.randint(20, 60), 1), (rng.randint(10, 30), 0), (rng.randint(10, 40), 1)):
                ids += [rng.randrange(vocab) for _ in range(n)]
                mask += [trained] * n
            rows.append(_row(ids, mask, 1.0 if k % 2 else -1.0, f"ro-{task}-{k}", f"g-{task}"))
    return rows


def on_policy(updater: PolicyUpdater, rows: list[TrainingRow]) -> None:
    """Set the rows' old logprobs to ``updater``'s: ratios start at 1, as right after a weight sync."""
    for r, lp in zip(rows, updater.token_logprobs(rows), strict=True):
        it = iter(lp)
        r.old_logprobs = [next(it) if m else 0.0 for m in r.loss_mask]


def shared_prefix_grad_diff(base: LlamaForCausalLM, config: UpdateConfig, rows: list[TrainingRow]) -> float:
    """Largest absolute difference between one step's gradients with and without shared prefixes."""
    grads = []
    for share in (True, False):
        updater = PolicyUpdater(copy.deepcopy(base), dataclasses.replace(config, share_prefixes=share))
        updater.step(rows)
        grads.append({n: p.grad for n, p in updater._trainable.items() if p.grad is not None})
    return max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[1])


class PlainStep:
    """A plain training step over the same micro-batches: forward, cross-entropy on response tokens, backward,
    gradient clipping, AdamW. ``sliced`` applies the LM head only where a response token is predicted."""

    def __init__(self, model: LlamaForCausalLM, config: UpdateConfig, *, sliced: bool) -> None:
        self.model, self.config, self.sliced = model, config, sliced
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=config.betas)

    def step(self, rows: list[TrainingRow]) -> dict[str, float]:
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = 0
        for group in pack_micro_batches([len(r.input_ids) for r in rows], self.config.micro_batch_tokens):
            width = len(rows[group[0]].input_ids)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            labels = torch.full((len(group), width), -100, dtype=torch.long)
            for b, i in enumerate(group):
                r = rows[i]
                row_ids = torch.tensor(r.input_ids)
                ids[b, : len(row_ids)] = row_ids
                labels[b, : len(row_ids)] = torch.where(torch.tensor(r.loss_mask, dtype=torch.bool), row_ids, -100)
                tokens += len(row_ids)
            if self.sliced:
                hidden = self.model.model(input_ids=ids, use_cache=False).last_hidden_state
                targets = labels[:, 1:]
                keep = targets != -100
                logits = self.model.lm_head(hidden[:, :-1][keep])
                loss = torch.nn.functional.cross_entropy(logits.float(), targets[keep])
            else:
                # Right padding needs no attention mask (causal); same choice as the update, so SDPA runs alike.
                loss = self.model(input_ids=ids, labels=labels, use_cache=False).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm or float("inf"))
        self.optimizer.step()
        seconds = time.perf_counter() - t0
        return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 rows, 2 repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--budget", type=int, default=4096, help="micro-batch token budget")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--shared-only", action="store_true", help="only the shared-prefix passes")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.reps, args.rows = 1, 4
    reps = args.reps or (2 if args.quick else 5)
    n_rows = args.rows or (16 if args.quick else 64)

    threads = configure_threads()
    config = UpdateConfig(lr=1e-5, micro_batch_tokens=args.budget)
    base = build_model(args.vocab)
    params = sum(p.numel() for p in base.parameters())
    rows = build_rows(n_rows, args.vocab)
    updater = PolicyUpdater(copy.deepcopy(base), config)
    # On-policy old logprobs: ratios start at 1, as right after a weight sync (lr is small so they stay near it).
    on_policy(updater, rows)
    agent_rows = build_agent_rows(args.vocab)
    on_policy(updater, agent_rows)
    plain = PlainStep(copy.deepcopy(base), config, sliced=False)
    sliced = PlainStep(copy.deepcopy(base), config, sliced=True)
    n_tokens = sum(len(r.input_ids) for r in rows)
    n_agent = sum(len(r.input_ids) for r in agent_rows)
    log(
        f"model {params / 1e6:.1f} M params, {n_rows} rows, {n_tokens} tokens "
        f"({sum(sum(r.loss_mask) for r in rows)} response), budget {args.budget}, threads {threads}, reps {reps}; "
        f"agent rows {len(agent_rows)}, {n_agent} tokens ({sum(sum(r.loss_mask) for r in agent_rows)} response)"
    )

    unshared = PolicyUpdater(copy.deepcopy(base), dataclasses.replace(config, share_prefixes=False))
    shared = PolicyUpdater(copy.deepcopy(base), config)
    passes = {
        "update_shared": lambda _: shared.step(agent_rows),
        "update_unshared": lambda _: unshared.step(agent_rows),
    }
    if not args.shared_only:
        mixed = PolicyUpdater(copy.deepcopy(base), dataclasses.replace(config, autocast="bfloat16"))
        passes.update(update=updater.step, fwd_bwd=plain.step, fwd_bwd_sliced=sliced.step, update_bf16=mixed.step)
    for name, fn in passes.items():  # warm-up: allocator, SDPA kernels, lazy init
        fn(rows)
        log(f"warm-up {name} done")
    speeds: dict[str, list[float]] = {name: [] for name in passes}
    cpu: dict[str, list[float]] = {name: [] for name in passes}
    for rep in range(reps):
        for name, fn in passes.items():
            c0 = time.process_time()
            m = fn(rows)
            # CPU seconds of this process: less sensitive than wall time to other jobs on the shared machine.
            cpu[name].append(time.process_time() - c0)
            speeds[name].append(m["tokens_per_s"])
            log(
                f"rep {rep + 1}/{reps} {name:15s} {m['tokens_per_s']:8.0f} tok/s "
                f"({m['seconds']:.2f} s wall, {cpu[name][-1]:.2f} s cpu)"
            )

    med = {name: statistics.median(v) for name, v in speeds.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    result: dict[str, object] = {}
    if not args.shared_only:
        result.update(
            update_tokens_per_s=round(med["update"], 1),
            fwd_bwd_tokens_per_s=round(med["fwd_bwd"], 1),
            update_over_fwd_bwd=round(med["update"] / med["fwd_bwd"], 3),
            fwd_bwd_sliced_tokens_per_s=round(med["fwd_bwd_sliced"], 1),
            update_over_fwd_bwd_sliced=round(med["update"] / med["fwd_bwd_sliced"], 3),
            update_over_fwd_bwd_cpu_time=round(med_cpu["fwd_bwd"] / med_cpu["update"], 3),
            update_bf16_tokens_per_s=round(med["update_bf16"], 1),
            update_bf16_over_update=round(med["update_bf16"] / med["update"], 3),
        )
    result |= {
        "shared_prefix_tokens_per_s": round(med["update_shared"], 1),
        "shared_prefix_baseline_tokens_per_s": round(med["update_unshared"], 1),
        "shared_prefix_speedup": round(med["update_shared"] / med["update_unshared"], 3),
        "shared_prefix_speedup_cpu_time": round(med_cpu["update_unshared"] / med_cpu["update_shared"], 3),
        "shared_prefix_grad_diff": float(f"{shared_prefix_grad_diff(base, config, agent_rows):.3g}"),
        "agent_rows": len(agent_rows),
        "agent_tokens_per_step": n_agent,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_amx": cpu_amx(),
        "rows": n_rows,
        "tokens_per_step": n_tokens,
        "params": params,
        "threads": threads,
        "reps": reps,
        "micro_batch_tokens": args.budget,
        **machine_facts(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
