"""Tiny randomly initialised Llama models and synthetic training rows for the policy-update tests.

The models are built here from a `LlamaConfig` (no dependency on the engine's model registry) and are small enough
that a step takes milliseconds on one CPU thread.
"""

from __future__ import annotations

import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lightrail.types import TrainingRow

VOCAB = 64


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, *, hidden: int = 32, layers: int = 2):
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).to(dtype)


def make_rows(n: int = 8, seed: int = 0, *, zero_adv_rows: int = 0, rollouts: int | None = None) -> list[TrainingRow]:
    """Rows of varied length: a prompt (mask 0), a response (mask 1), a tool result (mask 0), a second response.

    Old logprobs are plausible random values so ratios differ from 1 and some tokens clip.
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt, resp1, tool, resp2 = rng.randint(3, 12), rng.randint(2, 8), rng.randint(0, 4), rng.randint(0, 5)
        length = prompt + resp1 + tool + resp2
        mask = [0] * prompt + [1] * resp1 + [0] * tool + [1] * resp2
        adv = 0.0 if i < zero_adv_rows else rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5)
        rows.append(
            TrainingRow(
                input_ids=[rng.randrange(VOCAB) for _ in range(length)],
                loss_mask=mask,
                old_logprobs=[-rng.uniform(3.0, 5.0) if m else 0.0 for m in mask],
                advantages=[adv if m else 0.0 for m in mask],
                rollout_id=f"ro-{i // 2 if rollouts is None else i % rollouts}",
                group_id="g-0",
                policy_version=i % 3,
            )
        )
    return rows


def tiny_grpo(model, out_dir, **overrides):
    """A `GRPO` of one short step for loop tests: 2 tasks x 4 samples, 8 new tokens, no checkpoints or mid-run
    validations; ``overrides`` are `GRPO` keyword arguments (``config`` defaults to lr 1e-3)."""
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO

    options = dict(
        config=UpdateConfig(lr=1e-3), steps=1, tasks_per_step=2, n_samples=4,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        val_every=0, checkpoint_every=0, out_dir=out_dir,
    )  # fmt: skip
    return GRPO(model, **{**options, **overrides})
