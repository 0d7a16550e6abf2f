"""Prompt-prefix caching for the embedded engine: the keys and values of a prompt prefix that many requests share
(an agent's system prompt and worked examples, the tools it offers) are computed once and reused.

Agents send the same long preamble with every call: the SQL showcase's prompts are ~270 tokens of which ~250 are
its system prompt and worked example. On a CPU the prefill of those tokens is about a third of a rollout's time, and
it is the same work on every call. vLLM and SGLang cache such prefixes (block hashes, a radix tree); this is the
same idea sized for one process and a handful of agents:

* Which prefixes: the longest common prefix of a new prompt with a recently seen one, when it is at least
  ``min_tokens`` long (so a cache entry is made only once two prompts proved to share it; nothing needs to be
  declared). The prompt itself is then remembered for the next ones.
* What is cached: each layer's keys and values of the prefix alone (batch 1), computed by one forward pass over
  it. Attention is causal, so they equal the prefix part of a full prompt's (to float rounding: the same kernels on
  a different shape).
* Use: the rows whose prompts start with a cached prefix are prefilled over their remainder only, on top of the
  prefix's keys and values (expanded to the rows). Each row keeps at least one token to prefill: the last
  prompt token's logits give the first sampled token.
* Lifetime: entries are keyed by token ids and valid for one set of weights: `clear` on every weight update. At
  most ``entries`` prefixes are kept, least recently used evicted first.

Not for models whose cache layers are not plain full attention (sliding windows, linear attention): the engine
turns the cache off for them (`supported`).

Threading: used only from the engine's worker thread, like the model.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PrefixCache", "PrefixEntry", "common_length", "supported"]


@dataclass
class PrefixEntry:
    """One cached prefix: its token ids and each layer's ``(keys, values)`` of shape ``[1, heads, len, dim]``."""

    ids: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


class PrefixCache:
    """Longest-prefix lookup over cached prompt prefixes (see the module docstring)."""

    def __init__(self, *, min_tokens: int = 64, entries: int = 8, recent: int = 64) -> None:
        if min_tokens < 1 or entries < 1 or recent < 1:
            raise ValueError("min_tokens, entries and recent must be >= 1")
        self.min_tokens = min_tokens
        self.entries = entries
        self._cached: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._recent: deque[tuple[int, ...]] = deque(maxlen=recent)
        self.stats = {"hits": 0, "misses": 0, "entries_made": 0}

    def lookup(self, prompt: list[int]) -> PrefixEntry | None:
        """The longest cached prefix of ``prompt`` that leaves it at least one token, or None."""
        best: PrefixEntry | None = None
        for key, entry in self._cached.items():
            if len(key) < len(prompt) and (best is None or len(key) > len(best.ids)) and _starts(prompt, key):
                best = entry
        if best is not None:
            self._cached.move_to_end(best.ids)
        self.stats["hits" if best is not None else "misses"] += 1
        return best

    def to_make(self, prompt: list[int]) -> tuple[int, ...] | None:
        """A prefix worth caching for ``prompt``: its longest common prefix with a recent prompt (at most all but
        its last token), if at least ``min_tokens`` long and not cached yet. Remembers ``prompt`` either way (but
        one too short to share ``min_tokens`` with any other, which is skipped)."""
        if len(prompt) <= self.min_tokens:
            return None
        best = 0
        for seen in self._recent:
            best = max(best, common_length(prompt, seen))
        self._recent.append(tuple(prompt))
        best = min(best, len(prompt) - 1)
        if best < self.min_tokens:
            return None
        key = tuple(prompt[:best])
        return None if key in self._cached else key

    def add(self, entry: PrefixEntry) -> None:
        self._cached[entry.ids] = entry
        self.stats["entries_made"] += 1
        while len(self._cached) > self.entries:
            self._cached.popitem(last=False)

    def clear(self) -> None:
        """Forget every prefix (their keys and values belong to the weights that computed them)."""
        self._cached.clear()

    def __len__(self) -> int:
        return len(self._cached)


def supported(model: Any) -> bool:
    """Whether ``model``'s cache is plain full attention on every layer (what a prefix can be copied into)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - a config the cache cannot be built from: no prefix caching
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _starts(prompt: list[int], prefix: tuple[int, ...]) -> bool:
    return tuple(prompt[: len(prefix)]) == prefix


def common_length(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """How many leading tokens ``a`` and ``b`` share (at most ``limit``)."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
