"""`PolicyUpdater` with shared prefixes (``UpdateConfig.share_prefixes``): rows that start alike run their common
prefix once, and the logprobs, gradients and updated weights are those of running every row whole."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.model.updater import prefix_groups
from lightrail.types import TrainingRow
from tests.algorithms.grpo_helpers import VOCAB, tiny_llama


def agent_rows(seed: int = 0) -> list[TrainingRow]:
    """Three tasks of 3-4 samples sharing a 34-50 token prompt, each sample two trained responses around an untrained
    tool result (different lengths, so micro-batches are padded); in the last task the samples also share their
    first response, which the shared prefix must not cover; plus two rows that share nothing."""
    rng = random.Random(seed)
    rows = []
    for task in range(3):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(34, 50))]
        common_response = [rng.randrange(VOCAB) for _ in range(5)]
        for k in range(3 + task % 2):
            ids, mask = list(prompt), [0] * len(prompt)
            first = common_response if task == 2 else [rng.randrange(VOCAB) for _ in range(rng.randint(2, 8))]
            for part, trained in ((first, 1), ([rng.randrange(VOCAB) for _ in range(rng.randint(0, 4))], 0)):
                ids += part
                mask += [trained] * len(part)
            n = rng.randint(1, 6)
            ids += [rng.randrange(VOCAB) for _ in range(n)]
            mask += [1] * n
            rows.append(_row(ids, mask, rng, f"ro-{task}-{k}"))
    for k in range(2):
        n = rng.randint(20, 40)
        rows.append(_row([rng.randrange(VOCAB) for _ in range(n)], [0] * (n - 6) + [1] * 6, rng, f"ro-alone-{k}"))
    return rows


def _row(ids: list[int], mask: list[int], rng: random.Random, rollout: str) -> TrainingRow:
    adv = rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5)
    return TrainingRow(
        input_ids=ids,
        loss_mask=mask,
        old_logprobs=[-rng.uniform(3.0, 5.0) if m else 0.0 for m in mask],
        advantages=[adv if m else 0.0 for m in mask],
        rollout_id=rollout,
    )


def _shared_batches(updater: PolicyUpdater, rows: list[TrainingRow]) -> list:
    return [mb for mb in updater._prepare(rows, skip_zero_advantage=False) if mb.prefix is not None]


def test_prefix_groups_keep_rows_sharing_a_long_enough_prefix_together():
    a, b, c = [1, 2, 3, 4, 9], [1, 2, 3, 4, 8], [7, 7, 7]
    assert prefix_groups([a, c, b], [4, 2, 4], min_tokens=3) == [(4, [2, 0]), (0, [1])]
    # The prefix stops at each member's limit (before its first response token is predicted).
    assert prefix_groups([a, b], [4, 3], min_tokens=3) == [(3, [1, 0])]
    # Too short a common prefix: no group.
    assert prefix_groups([a, b], [4, 2], min_tokens=3) == [(0, [1]), (0, [0])]
    # A row that would shrink the saving joins no group: [a, b] save 4 tokens, [a, b, d] would save 2 x 1.
    d = [1, 5, 5, 5, 5]
    assert prefix_groups([a, b, d], [4, 4, 4], min_tokens=1) == [(4, [1, 0]), (0, [2])]


@pytest.mark.parametrize("lora, kl_coef", [(False, 0.0), (False, 0.1), (True, 0.0), (True, 0.1)])
def test_shared_prefixes_give_the_same_logprobs_and_gradients(lora, kl_coef):
    rows = agent_rows()
    base = tiny_llama(seed=5)
    logps, grads, losses = [], [], []
    for share in (False, True):
        cfg = UpdateConfig(
            lr=1e-3,
            kl_coef=kl_coef,
            share_prefixes=share,
            lora=LoraSettings(r=4) if lora else None,
            micro_batch_tokens=160,
        )
        upd = PolicyUpdater(copy.deepcopy(base), cfg)
        if lora:  # B starts at 0: move it so the adapter changes the logprobs the test compares
            with torch.no_grad():
                for name, p in upd._trainable.items():
                    if "lora_B" in name:
                        p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        shared = _shared_batches(upd, rows)
        if share:
            # Each task's samples share their prompt; the prefix ends before any row's first response token.
            assert len(shared) >= 3
            for mb in shared:
                p = mb.prefix.shape[1]
                assert p >= 32 and all(p < rows[i].loss_mask.index(1) for i in mb.rows)
        else:
            assert shared == []
        logps.append(upd.token_logprobs(rows))
        losses.append(upd.step(rows)["loss"])
        grads.append({n: p.grad.clone() for n, p in upd._trainable.items() if p.grad is not None})
    assert len(logps[0]) == len(rows)
    for a, b in zip(*logps, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=0, msg=f"grad of {name}")


def test_a_step_with_shared_prefixes_gives_the_same_weights():
    rows = agent_rows(seed=1)
    base = tiny_llama(seed=6, dtype=torch.float64)
    weights = []
    for share in (False, True):
        upd = PolicyUpdater(copy.deepcopy(base), UpdateConfig(lr=1e-3, dtype="float64", share_prefixes=share))
        metrics = upd.step(rows)
        assert metrics["tokens"] == sum(len(r.input_ids) for r in rows)
        weights.append({n: p.detach().clone() for n, p in upd._trainable.items()})
    # The attention runs other kernels (a cache and a mask instead of the fused causal path), so the float64
    # gradients differ by ~1e-11; Adam's first step (lr x g / (|g| + 1e-8)) magnifies that for gradients near its eps
    # to ~1e-7, against a step of 1e-3.
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], atol=1e-6, rtol=0, msg=f"weight {name}")


def test_the_micro_batch_budget_counts_a_shared_prefix_once():
    prompt = list(range(40))
    rows = [_row(prompt + [k, k + 1, k + 2], [0] * 40 + [1] * 3, random.Random(k), f"ro-{k}") for k in range(4)]
    # 4 rows x 43 tokens would overflow 100 tokens; the prefix (39) + 4 x 4 remainders does not.
    upd = PolicyUpdater(tiny_llama(seed=1), UpdateConfig(micro_batch_tokens=100))
    batches = upd._prepare(rows, skip_zero_advantage=False)
    assert len(batches) == 1 and batches[0].prefix is not None and batches[0].prefix.shape[1] == 39
    assert batches[0].input_ids.shape == (4, 4)


def test_gradient_checkpointing_runs_rows_whole():
    # Checkpointed layers drop the cache in training, so the remainders could not attend to the prefix.
    model = tiny_llama(seed=1)
    model.gradient_checkpointing_enable()
    upd = PolicyUpdater(model, UpdateConfig())
    assert _shared_batches(upd, agent_rows()) == []
