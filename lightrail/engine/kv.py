"""The running batch's KV cache: one preallocated slot per row, written in place (`SlotCache`).

Why: with transformers' `DynamicCache` every decode step concatenates each layer's keys and values with the new
token's (a copy of the whole cache, every layer, every step: ~30 % of a decode step of SmolLM2-135M at batch 8), and
every request joining the batch concatenates the caches again (`engine._merge`). vLLM and SGLang keep the cache in
preallocated blocks and write each new token in place; this is the same idea sized for one process:

* Layout: per decoder layer, ``keys`` and ``values`` of shape ``[slots, kv_heads, columns, head_dim]``; the rows of
  the running batch occupy slots ``0 .. rows-1`` in batch order, so the attention reads a view of them (no gather).
  ``valid[slot, column]`` says which columns hold a real token of that row (a row keeps its prefill layout: cached
  prefix, left padding, prompt); ``ends[slot]`` is the column its next token is written to.
* A decode step writes each row's new key and value at its own column ``ends[row]`` (one indexed write per layer)
  and attends over columns ``0 .. max(ends)`` with an additive mask built from ``valid``: no copy of the cache.
* A prefill group's keys and values (computed in a `DynamicCache`, as before) are copied into the next free slots
  once: the rows already decoding are not touched.
* Rows that finish free their slots; the rows after them move down (a copy of those rows only, once per finish).
* Capacity grows by doubling (slots up to the batch's row limit, columns up to the longest row) and is kept for
  the next batches: slots are reused, never reallocated per request.

Only for models whose every layer is plain full attention (`lightrail.engine.prefix_cache.supported`); the engine
keeps the concatenating cache for the others (sliding windows, linear attention).

Threading: used only from the engine's worker thread, like the model.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotCache"]

_MIN_COLUMNS = 128


class _SlotLayer(CacheLayerMixin):
    """One decoder layer's slots; `SlotCache` says where the step's keys and values go (`update`)."""

    is_sliding = False

    def __init__(self, owner: SlotCache) -> None:
        super().__init__()
        self.owner = owner
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("SlotCache layers are allocated by SlotCache.add")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        owner = self.owner
        assert self.keys is not None and self.values is not None
        if key_states.shape[2] != 1:
            raise ValueError("SlotCache decodes one token per row per forward pass")
        rows, cols = owner.write_index
        self.keys[rows, :, cols] = key_states[:, :, 0]
        self.values[rows, :, cols] = value_states[:, :, 0]
        n, width = key_states.shape[0], owner.width
        return self.keys[:n, :, :width], self.values[:n, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return self.owner.width

    def get_max_length(self) -> int:
        return -1


class SlotCache(Cache):
    """Preallocated KV slots for the rows of the engine's running batch (see the module docstring).

    Use per decode step: `begin_decode` (the additive attention mask ``[rows, 1, 1, width]``), the model's forward
    with this cache, then `end_decode`. ``rows`` rows are live, in slots ``0 .. rows-1``.
    """

    def __init__(self, num_layers: int, *, max_slots: int) -> None:
        self._layers = [_SlotLayer(self) for _ in range(num_layers)]
        super().__init__(layers=list(self._layers))
        self.max_slots = max_slots
        self.rows = 0
        self.ends: list[int] = []
        """Per live row: the column its next token is written to."""
        self.valid = torch.zeros((0, 0), dtype=torch.bool)
        self.write_index: tuple[torch.Tensor, torch.Tensor] = (torch.zeros(0, dtype=torch.long),) * 2
        self.width = 0
        """Columns the step attends over: ``max(ends) + 1`` during a decode step."""

    @property
    def capacity(self) -> tuple[int, int]:
        """(slots, columns) allocated."""
        keys = self._layers[0].keys
        return (0, 0) if keys is None else (int(keys.shape[0]), int(keys.shape[2]))

    def clear(self) -> None:
        """No live rows (the allocation is kept for the next batch)."""
        self.rows = 0
        self.ends = []

    def add(self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Append ``n`` rows after the live ones: each layer's ``(keys, values)`` of shape ``[n, kv_heads, w,
        head_dim]`` and their ``[n, w]`` mask of real columns (the prefill's layout); their next token goes to
        column ``w``."""
        if len(layers) != len(self._layers):
            raise ValueError(f"expected {len(self._layers)} layers of keys and values, got {len(layers)}")
        n, w = mask.shape
        self._reserve(self.rows + n, w + 1, [keys for keys, _ in layers])
        end = self.rows + n
        for layer, (keys, values) in zip(self._layers, layers, strict=True):
            assert layer.keys is not None and layer.values is not None
            layer.keys[self.rows : end, :, :w] = keys
            layer.values[self.rows : end, :, :w] = values
        self.valid[self.rows : end] = False
        self.valid[self.rows : end, :w] = mask.to(device=self.valid.device, dtype=torch.bool)
        self.rows = end
        self.ends += [w] * n

    def select(self, keep: list[int]) -> None:
        """Keep the live rows ``keep`` (increasing), moved down to slots ``0 .. len(keep)-1`` in that order."""
        moved = [(dst, src) for dst, src in enumerate(keep) if dst != src]
        if moved:
            dst = torch.tensor([d for d, _ in moved], dtype=torch.long, device=self.valid.device)
            src = torch.tensor([s for _, s in moved], dtype=torch.long, device=self.valid.device)
            width = max(self.ends[s] for _, s in moved)
            for layer in self._layers:
                assert layer.keys is not None and layer.values is not None
                layer.keys[dst, :, :width] = layer.keys[src, :, :width]
                layer.values[dst, :, :width] = layer.values[src, :, :width]
            self.valid[dst] = self.valid[src]
        self.ends = [self.ends[i] for i in keep]
        self.rows = len(keep)

    def begin_decode(self, dtype: torch.dtype) -> torch.Tensor:
        """Prepare a decode step of the live rows: where each row's new key and value go, and the additive attention
        mask ``[rows, 1, 1, width]`` (0 on the row's real columns and the new one, the dtype's minimum elsewhere)."""
        rows = self.rows
        self._reserve(rows, max(self.ends) + 1, None)
        cols = torch.tensor(self.ends, dtype=torch.long, device=self.valid.device)
        index = torch.arange(rows, device=self.valid.device)
        self.write_index = (index, cols)
        self.valid[index, cols] = True
        self.width = max(self.ends) + 1
        allowed = self.valid[:rows, : self.width]
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None, None, :]

    def end_decode(self) -> None:
        self.ends = [e + 1 for e in self.ends]

    def _reserve(self, slots: int, columns: int, like: list[torch.Tensor] | None) -> None:
        """Grow the allocation (doubling) to hold ``slots`` rows of ``columns`` columns, keeping the live rows."""
        have_slots, have_cols = self.capacity
        if slots <= have_slots and columns <= have_cols:
            return
        if slots > self.max_slots:
            raise ValueError(f"{slots} rows exceed the cache's {self.max_slots} slots")
        new_slots = min(self.max_slots, max(slots, 2 * have_slots, 1))
        new_cols = max(columns, 2 * have_cols if columns > have_cols else have_cols, _MIN_COLUMNS)
        width = max(self.ends, default=0)
        for i, layer in enumerate(self._layers):
            ref = layer.keys if layer.keys is not None else (like[i] if like is not None else None)
            assert ref is not None, "the first allocation needs a prefill's keys"
            heads, dim = int(ref.shape[1]), int(ref.shape[3])
            keys = ref.new_zeros((new_slots, heads, new_cols, dim))
            values = ref.new_zeros((new_slots, heads, new_cols, dim))
            if layer.keys is not None and layer.values is not None and self.rows:
                keys[: self.rows, :, :width] = layer.keys[: self.rows, :, :width]
                values[: self.rows, :, :width] = layer.values[: self.rows, :, :width]
            layer.keys, layer.values = keys, values
        valid = torch.zeros((new_slots, new_cols), dtype=torch.bool, device=keys.device)
        if self.rows:
            valid[: self.rows, :width] = self.valid[: self.rows, :width]
        self.valid = valid
