"""Per-row token sampling for the engine's decode loop: penalties, logit biases, temperature, top-p, per-row
generators, logprobs and top logprobs.

Pure tensor functions and one small per-batch state object (`LogitProcessors`), no engine state; called from the
engine's worker thread.

Order of one step, per row: the model's logits, minus the presence/frequency penalties, plus the logit bias, then
the engine's grammar masks (structured outputs), then temperature and top-p. The logprob reported for a token is
``log_softmax(processed_logits / temperature)[token]``: the distribution actually sampled from (penalties, bias
and masks included -- the engine lists them in ``Generation.logprobs_processed``), temperature-scaled, before
top-p truncation (temperature 1 for greedy rows). Top logprobs are the most likely entries of that same
distribution. Top-p keeps the most likely tokens until their mass reaches ``top_p`` (the most likely one always)
and samples among them, renormalised.

Penalties follow OpenAI: ``logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty`` where
``count`` counts the tokens this row (choice) has generated so far, prompt excluded. A batch keeps a ``[B, V]``
count matrix only while one of its rows has a penalty, and a logit bias as a sparse list of (row, token, value)
entries only while one of its rows has a bias: rows without these options cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

__all__ = [
    "LogitProcessors",
    "draw",
    "inverse_cdf",
    "nucleus",
    "sample",
    "tempered_logprobs",
    "top_logprobs",
]


def sample(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns the tokens and their logprobs under ``softmax(logits / temperature)``
    (temperature 1 for greedy rows), i.e. before top-p truncation."""
    logp = tempered_logprobs(logits, temps)
    tokens = draw(logits, logp, temps, top_ps, generators)
    return tokens, logp.gather(1, tokens[:, None]).flatten()


def tempered_logprobs(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` per row; temperature 1 for greedy rows (temperature 0)."""
    greedy = temps <= 0
    return torch.log_softmax(logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None], dim=-1)


def draw(
    logits: torch.Tensor,
    logp: torch.Tensor,
    temps: torch.Tensor,
    top_ps: torch.Tensor,
    generators: list[torch.Generator],
) -> torch.Tensor:
    """One token per row: the argmax for greedy rows, else a draw from ``exp(logp)`` (top-p truncated) with one
    uniform from the row's own generator (so a row's draws do not depend on the other rows of the batch)."""
    greedy = temps <= 0
    tokens = logits.argmax(dim=-1)
    sampled = (~greedy).nonzero().flatten().tolist()
    if not sampled:
        return tokens
    below = (top_ps < 1.0).tolist()
    full = [i for i in sampled if not below[i]]
    truncated = [i for i in sampled if below[i]]
    if full:
        probs = logp[full].exp()
        tokens[full] = inverse_cdf(probs, [generators[i] for i in full]).flatten()
    if truncated:
        probs, order = nucleus(logp[truncated].exp(), top_ps[truncated])
        picked = inverse_cdf(probs, [generators[i] for i in truncated])
        tokens[truncated] = order.gather(1, picked).flatten()
    return tokens


def top_logprobs(logp: torch.Tensor, ks: list[int]) -> list[list[tuple[int, float]]]:
    """The ``ks[i]`` most likely ``(token id, logprob)`` pairs of each row of ``logp``, most likely first (an empty
    list for rows with k = 0). One top-k over the rows that ask, with the largest k."""
    rows = [i for i, k in enumerate(ks) if k > 0]
    out: list[list[tuple[int, float]]] = [[] for _ in ks]
    if not rows:
        return out
    k = min(max(ks), logp.shape[-1])
    sub = logp if len(rows) == len(ks) else logp[rows]
    values, ids = sub.topk(k, dim=-1)
    for i, vals, toks in zip(rows, values.tolist(), ids.tolist(), strict=True):
        out[i] = list(zip(toks[: ks[i]], vals[: ks[i]], strict=True))
    return out


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


class Penalties(NamedTuple):
    """Presence/frequency penalties ``[B, 2]`` and the tokens each row generated so far ``[B, V]``."""

    weights: torch.Tensor
    counts: torch.Tensor


class Bias(NamedTuple):
    """A sparse logit bias: one entry per (row, token)."""

    rows: torch.Tensor
    ids: torch.Tensor
    values: torch.Tensor


@dataclass
class LogitProcessors:
    """Presence/frequency penalties and logit biases of the rows of one batch, and the token counts the penalties
    need. A batch holds one only while some row has such an option (`build`, `select` and `merge` return None
    otherwise); its tensors follow the batch's rows through `select` (rows leaving) and `merge` (rows joining).

    ``penalties`` is None when no row has a penalty, ``bias`` None when no row has one.
    """

    rows: int
    vocab: int
    penalties: Penalties | None = None
    bias: Bias | None = None

    @classmethod
    def build(
        cls, options: list[tuple[float, float, dict[int, float]]], vocab: int, device: torch.device | str = "cpu"
    ) -> LogitProcessors | None:
        """From each row's ``(presence_penalty, frequency_penalty, logit_bias)``; None when no row uses any."""
        penalized = any(p or f for p, f, _ in options)
        entries = [(i, int(t), float(v)) for i, (_, _, bias) in enumerate(options) for t, v in bias.items() if v]
        if not penalized and not entries:
            return None
        out = cls(rows=len(options), vocab=vocab)
        if penalized:
            out.penalties = Penalties(
                torch.tensor([[float(p), float(f)] for p, f, _ in options], device=device),
                torch.zeros((len(options), vocab), device=device),
            )
        if entries:
            rows, ids, values = zip(*entries, strict=True)
            out.bias = Bias(
                torch.tensor(rows, dtype=torch.long, device=device),
                torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(values, device=device),
            )
        return out

    def apply(self, logits: torch.Tensor) -> None:
        """Subtract the penalties and add the biases, in place (``logits`` is ``[B, V]`` float)."""
        if self.penalties is not None:
            (weights, counts), dtype = self.penalties, logits.dtype
            logits -= counts * weights[:, 1:2] + (counts > 0).to(dtype) * weights[:, 0:1]
        if self.bias is not None:
            logits.index_put_((self.bias.rows, self.bias.ids), self.bias.values, accumulate=True)

    def observe(self, tokens: torch.Tensor) -> None:
        """Count each row's newly sampled token (``tokens`` is ``[B]``)."""
        if self.penalties is not None:
            counts = self.penalties.counts
            counts.scatter_add_(1, tokens[:, None], torch.ones_like(counts[:, :1]))

    def select(self, keep: list[int]) -> LogitProcessors | None:
        """The processors of rows ``keep`` (in that order); None when none of them has an option left."""
        out = LogitProcessors(rows=len(keep), vocab=self.vocab)
        if self.penalties is not None:
            index = torch.tensor(keep, dtype=torch.long, device=self.penalties.counts.device)
            weights = self.penalties.weights.index_select(0, index)
            if bool((weights != 0).any()):
                out.penalties = Penalties(weights, self.penalties.counts.index_select(0, index))
        if self.bias is not None:
            device = self.bias.rows.device
            remap = torch.full((self.rows,), -1, dtype=torch.long, device=device)
            remap[torch.tensor(keep, dtype=torch.long, device=device)] = torch.arange(len(keep), device=device)
            rows = remap[self.bias.rows]
            kept = rows >= 0
            if bool(kept.any()):
                out.bias = Bias(rows[kept], self.bias.ids[kept], self.bias.values[kept])
        return out if out.penalties is not None or out.bias is not None else None

    @staticmethod
    def merge(
        old: LogitProcessors | None, old_rows: int, new: LogitProcessors | None, new_rows: int
    ) -> LogitProcessors | None:
        """The processors of the rows of ``old`` followed by those of ``new`` (either may be None: no options)."""
        either = old or new
        if either is None:
            return None
        out = LogitProcessors(rows=old_rows + new_rows, vocab=either.vocab)
        parts = [(old, old_rows, 0), (new, new_rows, old_rows)]
        penalized = [p.penalties for p, _, _ in parts if p is not None and p.penalties is not None]
        if penalized:
            ref, weights, counts = penalized[0].counts, [], []
            for p, n, _ in parts:
                if p is not None and p.penalties is not None:
                    weights.append(p.penalties.weights)
                    counts.append(p.penalties.counts)
                else:  # rows without penalties join with neutral ones
                    weights.append(ref.new_zeros((n, 2)))
                    counts.append(ref.new_zeros((n, either.vocab)))
            out.penalties = Penalties(torch.cat(weights), torch.cat(counts))
        biased = [(p.bias, offset) for p, _, offset in parts if p is not None and p.bias is not None]
        if biased:
            out.bias = Bias(
                torch.cat([b.rows + offset for b, offset in biased]),
                torch.cat([b.ids for b, _ in biased]),
                torch.cat([b.values for b, _ in biased]),
            )
        return out
