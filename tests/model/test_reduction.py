"""The gradient reduction strategies alone, on fixed tensors: one process, and two real gloo ranks (spawned
processes on 127.0.0.1) for the data-parallel sum and the sharded ranks' padding and statistics."""

from __future__ import annotations

import gc
import socket
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightrail.model.reduction import AllReduceSum, GradientReduction, ShardedSum

CPU = torch.device("cpu")


def test_one_process_combines_nothing_and_scores_through_the_updater():
    reduction = GradientReduction()
    model = object()
    calls = []
    logits, hidden = torch.ones(2, 5), torch.zeros(2, 3)

    def response_logits(m, mb):
        calls.append((m, mb))
        return logits, hidden

    assert reduction.prepare(model) is model
    assert reduction.forward(model, "mb", response_logits) == (logits, hidden) and calls == [(model, "mb")]
    stats = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert reduction.reduce([], stats, 1.5) == (stats, 1.5)
    assert reduction.padding_passes(3) == 0
    assert reduction.device is None and reduction.shares_prefixes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        # Rank 0 has gradients for a and c; rank 1 for a and b; d has none anywhere. a and c (float32, 28 bytes) share
        # one flattened bucket of 64 bytes; b (float64) is a bucket of its own.
        params = [torch.zeros(3), torch.zeros(4), torch.zeros(2, dtype=torch.float64), torch.zeros(2)]
        grads = {0: [[1.0, 2.0, 3.0], [1.0] * 4, None, None], 1: [[10.0, 20.0, 30.0], None, [5.0, 6.0], None]}[rank]
        for p, g in zip(params, grads, strict=True):
            p.grad = None if g is None else torch.tensor(g, dtype=p.dtype)
        replicas = AllReduceSum(CPU, bucket_bytes=64, start=lambda ps: None)
        stats = torch.tensor([float(rank + 1), 0.5], dtype=torch.float64)
        summed, peak = replicas.reduce(params, stats, ratio_max=1.0 + rank)
        sharded = ShardedSum(CPU, start=lambda ps: None)
        padding = sharded.padding_passes(micro_batches=3 if rank == 0 else 1)
        sharded_stats, sharded_peak = sharded.reduce([], torch.tensor([2.0 * rank], dtype=torch.float64), 3.0 - rank)
        results.put(
            (
                rank,
                [None if p.grad is None else p.grad.tolist() for p in params],
                summed.tolist(),
                peak,
                padding,
                sharded_stats.tolist(),
                sharded_peak,
            )
        )
    finally:
        dist.destroy_process_group()


def test_two_ranks_sum_gradients_and_statistics_and_pad_to_the_busiest():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, *rest = results.get(timeout=120)
        got[rank] = rest
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for rank in (0, 1):
        grads, summed, peak, padding, sharded_stats, sharded_peak = got[rank]
        # summed, not averaged; a parameter no rank touched keeps no gradient (AdamW skips it)
        assert grads == [[11.0, 22.0, 33.0], [1.0] * 4, [5.0, 6.0], None]
        assert summed == [3.0, 1.0] and peak == 2.0
        assert padding == (0 if rank == 0 else 2)  # the rank with 1 micro-batch runs 2 more, as many as rank 0's 3
        assert sharded_stats == [2.0] and sharded_peak == 3.0


def test_a_dropped_updater_frees_its_model_without_the_cycle_collector():
    """The reduction keeps no reference back to its updater: dropping the updater frees the policy's weights (and
    AdamW's state) at once, not whenever Python's cycle collector next runs (GPU memory waits on it)."""
    from lightrail.model.updater import PolicyUpdater
    from tests.algorithms.grpo_helpers import tiny_llama

    updater = PolicyUpdater(tiny_llama())
    model = weakref.ref(updater.model)
    gc.disable()
    try:
        del updater
        assert model() is None
    finally:
        gc.enable()
