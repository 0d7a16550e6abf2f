"""Per-row token sampling for the engine's decode loop: temperature, top-p, per-row generators, logprobs.

Pure tensor functions (no engine state), called from the engine's worker thread.

The logprob reported for a token is ``log_softmax(logits / temperature)[token]``: the temperature-scaled
distribution before top-p truncation (temperature 1 for greedy rows). Top-p keeps the most likely tokens until
their mass reaches ``top_p`` (the most likely one always) and samples among them, renormalised.
"""

from __future__ import annotations

import torch

__all__ = ["inverse_cdf", "nucleus", "sample"]


def sample(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns the tokens and their logprobs under ``softmax(logits / temperature)``
    (temperature 1 for greedy rows), i.e. before top-p truncation."""
    greedy = temps <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = logits.argmax(dim=-1)
    sampled = (~greedy).nonzero().flatten().tolist()
    full = [i for i in sampled if float(top_ps[i]) >= 1.0]
    truncated = [i for i in sampled if float(top_ps[i]) < 1.0]
    if full:
        probs = logp[full].exp()
        tokens[full] = inverse_cdf(probs, [generators[i] for i in full]).flatten()
    if truncated:
        probs, order = nucleus(logp[truncated].exp(), top_ps[truncated])
        picked = inverse_cdf(probs, [generators[i] for i in truncated])
        tokens[truncated] = order.gather(1, picked).flatten()
    return tokens, logp.gather(1, tokens[:, None]).flatten()


def nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely tokens of each row until their mass reaches top_p (the first always kept), as
    (probabilities with the rest zeroed, vocabulary ids), most likely first.

    A full sort of a 50 k vocabulary costs tens of ms per step on CPU; the nucleus almost always lies in the top
    few hundred tokens, so take a top-k that is widened only when some row's nucleus does not fit."""
    vocab = probs.shape[-1]
    k = min(256, vocab)
    while True:
        values, order = probs.topk(k, dim=-1)
        cum = values.cumsum(dim=-1)
        if k == vocab or bool((cum[:, -1] >= top_p).all()):
            break
        k = min(vocab, k * 8)
    return values.masked_fill(cum - values >= top_p[:, None], 0.0), order


def inverse_cdf(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Index drawn from each row of (unnormalised) ``probs`` with one uniform from that row's own generator."""
    cum = probs.cumsum(dim=-1)
    u = torch.stack([torch.rand((), generator=g) for g in generators]).to(cum.device)
    # `right=True` never lands on a zero-probability entry.
    return torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True).clamp(max=cum.shape[1] - 1)
