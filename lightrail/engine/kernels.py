"""Pre-packed weight matrices for the engine's forward passes on a CPU (`PackedLinears`).

Why: decoding multiplies a handful of rows by every weight matrix, so a step's time is the time to read the weights.
torch's default CPU path for ``F.linear`` re-lays-out (packs) the weight matrix on every call, and for some shapes
picks a slow kernel: the 576 x 49152 LM head of SmolLM2-135M takes ~50-110 ms at batch 8 in float32, 3-7x the time
to read it (bench/RESULTS.md, "Where a decode step's time goes"). oneDNN's linear with the weight packed once into
its blocked layout (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, what torch.compile's
inductor does for frozen CPU linears; AMX tiles for bfloat16 on CPUs that have them) reads the weights at close
to memory speed, for any batch size.

The packed copies are used only inside `PackedLinears.active` (the engine wraps its forward passes in it), only
without autograd, and only for plain ``nn.Linear`` modules on the CPU in float32 or bfloat16: the same model used
anywhere else (a trainer's forward, a test's reference pass) runs the stock ``F.linear``. Float32 results differ
from ``F.linear`` by float32 rounding only (another summation order); `PackedLinears.pack` checks each packed
matrix against ``F.linear`` once and leaves out any that does not agree. After the weights change in place (the
engine's weight updates) `repack` packs them again.

Memory: one packed copy of each weight matrix next to the parameters (the parameters stay: state dicts, weight
updates and the prefix cache read them).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinears", "available", "pack"]

log = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16)


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds for x86 and Arm do)."""
    ops = getattr(torch.ops, "mkldnn", None)
    return bool(
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


class PackedLinears:
    """The plain ``nn.Linear`` modules of a CPU model, each with its weight packed for oneDNN (module docstring)."""

    def __init__(self, model: nn.Module, *, skip: list[nn.Module] | None = None) -> None:
        """``skip``: modules left to ``F.linear`` (e.g. those `lightrail.engine.decode.FusedDecode` holds stacked
        copies of: a prefill's many rows run ``F.linear`` at full speed, and no third copy is kept)."""
        left = {id(m) for m in skip or []}
        self.modules: list[nn.Linear] = [
            m
            for m in model.modules()
            if type(m) is nn.Linear
            and m.weight.device.type == "cpu"
            and m.weight.dtype in _DTYPES
            and id(m) not in left
        ]
        self._packed: list[torch.Tensor | None] = [None] * len(self.modules)
        self.repack()

    def __len__(self) -> int:
        return sum(p is not None for p in self._packed)

    def repack(self) -> None:
        """Pack every weight again (after the weights changed in place)."""
        with torch.no_grad():
            self._packed = [pack(m.weight.detach()) for m in self.modules]
        left = len(self.modules) - len(self)
        if left:
            log.warning("packed linears: %d of %d weight matrices left to F.linear (packed result disagreed)", left,
                        len(self.modules))  # fmt: skip

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Forward passes inside this block use the packed weights (without autograd; see the module docstring)."""
        patched = []
        for module, packed in zip(self.modules, self._packed, strict=True):
            if packed is not None:
                # An instance attribute shadows the class's `forward` for this call only; `object.__setattr__` skips
                # nn.Module's bookkeeping (it is not a submodule or parameter).
                object.__setattr__(module, "forward", _forward(module, packed))
                patched.append(module)
        try:
            yield
        finally:
            for module in patched:
                module.__dict__.pop("forward", None)


def _forward(module: nn.Linear, packed: torch.Tensor) -> Any:
    weight, bias = module.weight, module.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != weight.dtype or x.device.type != "cpu" or torch.is_grad_enabled():
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (``[out, in]``, float32 or bfloat16, CPU) packed for ``torch.ops.mkldnn._linear_pointwise``, or None
    when oneDNN cannot pack it or its packed product disagrees with ``F.linear`` on a probe (beyond rounding)."""
    if weight.device.type != "cpu" or weight.dtype not in _DTYPES or not available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
        probe = torch.randn((3, weight.shape[1]), generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "").float()
    except RuntimeError:
        return None
    want = F.linear(probe.float(), weight.float())
    # float32: rounding of another summation order; bfloat16: the products are rounded to bfloat16 either way.
    tol = 1e-4 if weight.dtype == torch.float32 else 2e-2
    scale = float(want.abs().max()) + 1e-6
    return packed if float((got - want).abs().max()) <= tol * scale else None
