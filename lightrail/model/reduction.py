"""Gradient reduction strategies: how one update step's gradients and statistics, accumulated by the processes that
computed them, become the step's. One process (`GradientReduction`), data-parallel replicas (`AllReduceSum`), sharded
ranks (`ShardedSum`, FSDP2).

A `lightrail.model.updater.PolicyUpdater` is built with one (``PolicyUpdater(model, config, reduction=...)``;
`lightrail.model.distributed.DistributedPolicyUpdater` picks a data-parallel one from ``config.sharding``) and calls
it at four points, and nowhere else:

* `GradientReduction.prepare`, once, after the policy is built and before its optimizer: the model as this process
  trains it (every rank starting from rank 0's weights; a sharded one cut into shards);
* `GradientReduction.forward`, for every scoring pass of a micro-batch: the LM head's logits and the hidden states
  (the updater hands its scoring function with each call: a strategy keeps no reference back to its updater, so a
  dropped updater's model is freed at once);
* `GradientReduction.padding_passes`, before a step's micro-batches: how many gradient-free passes this process adds
  (every pass of a sharded model is a collective, so every rank runs as many as the busiest);
* `GradientReduction.reduce`, after the last backward pass and before the gradient is clipped: the gradients in
  ``param.grad`` and the step's statistics combined with the other ranks'.

Why the data-parallel strategies sum rather than average, and why they reduce once after accumulation rather than
during each backward as DDP does: `lightrail.model.distributed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllReduceSum", "GradientReduction", "ShardedSum", "whole"]

#: `PolicyUpdater._response_logits`: (model, micro-batch) -> (logits [N, V], hidden states [N, H]). A strategy hands
#: the updater's micro-batches through without reading them (hence ``Any``: the updater's own type stays its own).
ResponseLogits = Callable[[Any, Any], tuple[torch.Tensor, torch.Tensor]]
#: Copies rank 0's values of the given parameters into every rank's (a collective).
StartFromRank0 = Callable[[Sequence[torch.Tensor]], None]


class GradientReduction:
    """One process: the policy trains whole and a step has nothing to combine."""

    device: torch.device | None = None
    """The device this process trains on when the strategy decides it (a CUDA rank's own); None: the config's."""
    shares_prefixes = True
    """Whether a step may run a shared prompt prefix once (an extra decoder pass, which ranks would run unequally)."""

    def prepare(self, model: Any) -> Any:
        """The policy ``model`` as this process trains it."""
        return model

    def forward(self, model: Any, mb: Any, response_logits: ResponseLogits) -> tuple[torch.Tensor, torch.Tensor]:
        """``response_logits(model, mb)``: logits ([N, V]) and hidden states ([N, H]) of ``mb``'s response tokens."""
        return response_logits(model, mb)

    def padding_passes(self, micro_batches: int) -> int:
        """How many gradient-free forward and backward passes this process adds after its ``micro_batches``."""
        return 0

    def reduce(self, params: list[torch.Tensor], stats: torch.Tensor, ratio_max: float) -> tuple[torch.Tensor, float]:
        """This process's accumulated gradients (``params``' ``.grad``, in place) and step statistics (float64 sums,
        [S]; ``ratio_max`` by max) combined with the other ranks': the step's. Here: as they are."""
        return stats, ratio_max


class AllReduceSum(GradientReduction):
    """Data-parallel replicas: every rank holds the whole policy and AdamW state; after the last micro-batch the
    gradients are summed over the ranks with explicit ``all_reduce`` calls (flattened into buckets of at most
    ``bucket_bytes`` per dtype), with the statistics. A parameter gets a gradient only if some rank produced one, as in
    one process (AdamW treats a missing gradient and a zero one differently)."""

    def __init__(self, device: torch.device, bucket_bytes: int, start: StartFromRank0) -> None:
        self.device = device
        self._bucket_bytes = bucket_bytes
        self._start = start

    def prepare(self, model: Any) -> Any:
        self._start([p for p in model.parameters() if p.requires_grad])  # as DDP: rank 0's weights everywhere
        return model

    def reduce(self, params: list[torch.Tensor], stats: torch.Tensor, ratio_max: float) -> tuple[torch.Tensor, float]:
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.float64)
        packed, peak = _reduce_stats(torch.cat([stats, has_grad]), ratio_max, self.device)
        grads = []
        for p, n in zip(params, packed[len(stats) :].tolist(), strict=True):
            if n:  # some rank has a gradient for p: every rank joins the sum (zeros where it had none)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        self._all_reduce_sum(grads)
        return packed[: len(stats)], peak

    def _all_reduce_sum(self, tensors: list[torch.Tensor]) -> None:
        """Sum ``tensors`` over the ranks in place, flattened into buckets of at most ``bucket_bytes`` (per dtype)."""
        bucket: list[torch.Tensor] = []
        size = 0
        for t in [*tensors, None]:
            if bucket and (t is None or t.dtype != bucket[0].dtype or size + t.nbytes > self._bucket_bytes):
                if len(bucket) == 1:
                    dist.all_reduce(bucket[0])
                else:
                    flat = torch.cat([b.reshape(-1) for b in bucket])
                    dist.all_reduce(flat)
                    offset = 0
                    for b in bucket:
                        b.copy_(flat[offset : offset + b.numel()].view_as(b))
                        offset += b.numel()
                bucket, size = [], 0
            if t is not None:
                bucket.append(t)
                size += t.nbytes


class ShardedSum(GradientReduction):
    """Sharded ranks (FSDP2, ``torch.distributed.fsdp.fully_shard``): each rank holds 1/N of the weights, gradients
    and AdamW state. Every decoder layer is a unit; the rest (embeddings, final norm, LM head; tied weights stay in
    one unit) belongs to a root module that runs the whole scoring forward (`_Scoring`), so its weights are gathered
    around that forward. Gradients are reduce-scattered, summed, during each backward (``reduce`` then combines only
    the statistics); every pass is a collective, so a rank with fewer micro-batches pads (`padding_passes`); shared
    prompt prefixes are not run once (their extra pass would differ between ranks)."""

    shares_prefixes = False

    def __init__(self, device: torch.device, start: StartFromRank0) -> None:
        self.device = device
        self._start = start
        self._model: Any = None
        self._root: Any = None

    def prepare(self, model: Any) -> Any:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        self._start([p for p in model.parameters() if p.requires_grad])  # whole, before the cut
        base = model.get_base_model() if hasattr(model, "peft_config") else model  # a peft model wraps its base
        for layer in base.get_decoder().layers:
            fully_shard(layer)
        self._root = fully_shard(_Scoring(model))
        for module in self._root.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a sum: the loss weights are already global
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        self._model = model
        return model

    def forward(self, model: Any, mb: Any, response_logits: ResponseLogits) -> tuple[torch.Tensor, torch.Tensor]:
        if model is self._model:
            return self._root(mb, response_logits)  # through the FSDP root: it gathers its weights around the forward
        return response_logits(model, mb)

    def padding_passes(self, micro_batches: int) -> int:
        most = torch.tensor([micro_batches], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most.item()) - micro_batches

    def reduce(self, params: list[torch.Tensor], stats: torch.Tensor, ratio_max: float) -> tuple[torch.Tensor, float]:
        return _reduce_stats(stats, ratio_max, self.device)  # the backward passes already summed the gradients


def _reduce_stats(stats: torch.Tensor, ratio_max: float, device: Any) -> tuple[torch.Tensor, float]:
    """``stats`` summed over the ranks (on the CPU) and ``ratio_max``'s maximum over them (two collectives)."""
    packed = stats.to(device)
    dist.all_reduce(packed)
    peak = torch.tensor([ratio_max], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return packed.cpu(), float(peak)


class _Scoring(torch.nn.Module):
    """The root module of a sharded policy: its forward is the scoring forward (decoder and LM head,
    `PolicyUpdater._response_logits`), so FSDP gathers the weights outside the decoder layers (embeddings, final
    norm, LM head) around it and reduce-scatters their gradients after its backward."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, mb: Any, response_logits: ResponseLogits) -> tuple[torch.Tensor, torch.Tensor]:
        return response_logits(self.policy, mb)


def whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor (DTensor) gathered whole on every rank (a collective: every rank calls it); any other tensor
    as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
