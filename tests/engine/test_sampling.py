"""Per-row sampling: distributions, top-p, seeds, greedy rows and the reported logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from lightrail.engine.sampling import nucleus, sample

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def draw(n: int, temperature: float, top_p: float, seed: int = 0) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    logits = PROBS.log()[None, :]
    return [int(sample(logits, torch.tensor([temperature]), torch.tensor([top_p]), [gen])[0][0]) for _ in range(n)]


def test_frequencies_follow_the_distribution():
    counts = torch.bincount(torch.tensor(draw(4000, 1.0, 1.0)), minlength=4).float() / 4000
    assert torch.allclose(counts, PROBS, atol=0.03)


def test_top_p_excludes_the_tail():
    drawn = set(draw(500, 1.0, 0.75))  # 0.5 + 0.3 reaches 0.75: only the first two survive
    assert drawn == {0, 1}


def test_rows_are_independent_and_reported_logprobs_are_tempered():
    logits = torch.stack([PROBS.log(), PROBS.log(), PROBS.log()])
    temps, top_ps = torch.tensor([0.0, 0.5, 2.0]), torch.tensor([1.0, 0.9, 1.0])
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    tokens, logprobs = sample(logits, temps, top_ps, gens)
    assert int(tokens[0]) == 0 and logprobs[0].item() == pytest.approx(math.log(0.5), abs=1e-6)  # greedy: T=1
    for row, t in ((1, 0.5), (2, 2.0)):
        expected = torch.log_softmax(PROBS.log() / t, dim=-1)[tokens[row]]
        assert logprobs[row].item() == pytest.approx(expected.item(), abs=1e-6)


def test_same_seed_same_draws():
    assert draw(50, 1.0, 0.9, seed=3) == draw(50, 1.0, 0.9, seed=3)
    assert draw(50, 1.0, 0.9, seed=3) != draw(50, 1.0, 0.9, seed=4)


def test_nucleus_matches_a_full_sort_even_when_it_is_wide():
    torch.manual_seed(0)
    flat = torch.full((1, 6000), 1.0 / 6000)  # the nucleus of 0.9 needs 5400 tokens: the top-k must widen
    peaked = torch.softmax(torch.randn(1, 6000) * 4, dim=-1)
    probs, top_p = torch.cat([flat, peaked]), torch.tensor([0.9, 0.7])
    values, order = nucleus(probs, top_p)
    for row in range(2):
        ref_values, ref_order = probs[row].sort(descending=True)
        keep = (ref_values.cumsum(0) - ref_values) < top_p[row]
        kept = set(order[row][values[row] > 0].tolist())
        assert len(kept) == int(keep.sum())
        assert float(probs[row][list(kept)].sum()) == pytest.approx(float(ref_values[keep].sum()), abs=1e-5)
