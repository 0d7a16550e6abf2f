"""A lean decode step for Llama-family models over the slot cache (`FusedDecode`).

Why: at batch 8 a decode step of SmolLM2-135M is a few dozen milliseconds of weight reads, and transformers' module
machinery (module calls, argument plumbing, per-layer mask and cache bookkeeping, seven separate matrix products per
layer) adds a third again on a CPU (bench/RESULTS.md, "Where a decode step's time goes"). This step runs the same
computation with the model's own modules and functions, in fewer calls:

* the query, key and value projections as one matrix product (their weights stacked), the gate and up projections
  as one, each packed for oneDNN on the CPU (`lightrail.engine.kernels`); the output and down projections and the LM
  head are the modules themselves (packed by the engine's `kernels.PackedLinears` while it decodes);
* the model's own RMSNorm, rotary embedding, ``apply_rotary_pos_emb``, activation and attention function (the one
  transformers would call, e.g. SDPA), so the arithmetic is the same up to float rounding of the stacked products;
* keys and values written in place into the `SlotCache`; logits of the one new position only.

For the plain decoder families whose layers are exactly that (`supports`: ``llama``, ``mistral`` and ``qwen2``
without sliding windows); any other model decodes through its own forward. The stacked weights are copies: `refresh`
rebuilds them after the weights change in place (the engine's weight updates).

Threading: used only from the engine's worker thread, like the model.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightrail.engine import kernels
from lightrail.engine.kv import SlotCache

__all__ = ["FusedDecode"]

FAMILIES = ("llama", "mistral", "qwen2")

_LAYER = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
_MLP = {"gate_proj", "up_proj", "down_proj", "act_fn"}
_MODEL = {"embed_tokens", "layers", "norm", "rotary_emb"}
_EXTRAS = ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale", "sliding_window", "layer_types")


def _children(module: nn.Module) -> set[str]:
    return {name for name, _ in module.named_children()}


class FusedDecode:
    """Decode steps of a Llama-family model over a `SlotCache` (module docstring)."""

    @staticmethod
    def supports(model: Any) -> bool:
        """Whether ``model`` is a decoder of exactly the shape this step computes (else it decodes by its forward)."""
        config = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in FAMILIES:
            return False
        if any(getattr(config, name, None) not in (None, False) for name in _EXTRAS if name != "layer_types"):
            return False
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
            return False
        inner = getattr(model, "model", None)
        if inner is None or _children(model) != {"model", "lm_head"} or _children(inner) != _MODEL:
            return False
        return all(
            _children(layer) == _LAYER and _children(layer.self_attn) == _ATTENTION and _children(layer.mlp) == _MLP
            for layer in inner.layers
        )

    def __init__(self, model: Any, *, packed: bool) -> None:
        self.model = model
        self.packed = packed and kernels.available() and next(model.parameters()).device.type == "cpu"
        inner = model.model
        attn = inner.layers[0].self_attn
        self._rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        eager = sys.modules[type(attn).__module__].eager_attention_forward
        self._attention = ALL_ATTENTION_FUNCTIONS.get_interface(model.config._attn_implementation, eager)
        self._layers: list[tuple[Callable, Callable]] = []
        self.refresh()

    def covered(self) -> list[nn.Module]:
        """The linear modules whose weights this step uses as stacked copies (the others it calls as they are)."""
        out: list[nn.Module] = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            out += [a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj]
        return out

    def refresh(self) -> None:
        """Rebuild the stacked (and packed) weights from the model's current ones."""
        layers = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                layers.append((self._linear([a.q_proj, a.k_proj, a.v_proj]), self._linear([m.gate_proj, m.up_proj])))
        self._layers = layers

    def _linear(self, modules: list[nn.Linear]) -> Callable[[torch.Tensor], torch.Tensor]:
        weight = torch.cat([m.weight.detach() for m in modules])
        bias = None
        if any(m.bias is not None for m in modules):
            bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                              for m in modules])  # fmt: skip
        packed = None
        if self.packed and weight.dtype in (torch.float32, torch.bfloat16):
            packed = kernels.pack(weight)
        if packed is None:
            return lambda x: F.linear(x, weight, bias)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    def step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, slots: SlotCache, mask: torch.Tensor) -> Any:
        """Logits ``[B, V]`` of the next token of each live row of ``slots``, fed ``input_ids`` ``[B]`` at
        ``position_ids`` ``[B]``; ``mask`` from `SlotCache.begin_decode`. Writes the rows' keys and values."""
        inner = self.model.model
        h = inner.embed_tokens(input_ids[:, None])
        cos, sin = inner.rotary_emb(h, position_ids[:, None])
        batch = h.shape[0]
        for index, (layer, (qkv, gate_up)) in enumerate(zip(inner.layers, self._layers, strict=True)):
            attn = layer.self_attn
            dim = attn.head_dim
            x = qkv(layer.input_layernorm(h))
            q_width = attn.config.num_attention_heads * dim
            kv_width = (x.shape[-1] - q_width) // 2
            q, k, v = x.split([q_width, kv_width, kv_width], dim=-1)
            q = q.view(batch, 1, -1, dim).transpose(1, 2)
            k = k.view(batch, 1, -1, dim).transpose(1, 2)
            v = v.view(batch, 1, -1, dim).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            keys, values = slots.layers[index].update(k, v)
            out, _ = self._attention(attn, q, keys, values, mask, dropout=0.0, scaling=attn.scaling)
            h = h + attn.o_proj(out.reshape(batch, 1, -1))
            gate, up = gate_up(layer.post_attention_layernorm(h)).chunk(2, dim=-1)
            h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        return self.model.lm_head(inner.norm(h))[:, -1, :]
