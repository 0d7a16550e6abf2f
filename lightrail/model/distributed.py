"""Data-parallel policy updates: one GRPO/SFT step computed by N ranks, each on its share of the rows.

`DistributedPolicyUpdater` is a `PolicyUpdater` (same ``step``, ``token_logprobs``, ``state_dict_for_serving``,
``save``, ``load``) whose step spans ``N`` processes joined by ``torch.distributed``: gloo on CPU, NCCL on CUDA (the
backend follows ``UpdateConfig.device``). Every rank holds a full replica of the policy and of AdamW's state
(with ``sharding="fsdp"`` a shard of them: see "Sharded ranks" below).

How a step is computed, and why it equals the one-process step:

1. Rank 0 holds the step's rows. It drops stale rows and validates them (bad input fails here, before any other
   rank is involved), computes the step's loss normalisation weights over *all* rows (`loss_norm` is global: a
   token-mean divides by the step's token count, a rollout-mean counts rollouts whose rows sit on different ranks
   once), and shards the rows that need a forward pass over the ranks (`shard_by_tokens`: longest first onto the
   least-loaded rank, deterministic).
2. Each rank receives its rows with their slices of the global weights (``scatter_object_list`` on a gloo control
   group), packs them into micro-batches and accumulates gradients exactly as one process does. Because the weights
   are global, the per-rank losses add up to the step's loss.
3. The accumulated gradients are summed over the ranks with an explicit ``all_reduce`` (flattened into buckets of
   ``bucket_mb``) after the last micro-batch (`lightrail.model.reduction.AllReduceSum`, the updater's reduction),
   with the step's statistics (loss sums, token counts, micro-batches; ``ratio_max`` by MAX). Summing, not averaging:
   the 1/N of DDP would be wrong here, since the normalisation is already global. A parameter gets a gradient only if
   some rank produced one, as in one process (AdamW treats a missing gradient and a zero one differently). Every rank
   then clips the same global gradient norm and takes the same AdamW step, so the replicas stay bitwise identical (an
   all-reduce hands every rank the same bits). The N-rank gradient equals the 1-rank gradient up to float summation
   order (tested: 2 ranks vs 1 within 1e-5 on weights, gradients and Adam moments over two steps, full fine-tuning
   and LoRA).


Why not ``DistributedDataParallel``: DDP reduces during each backward and averages; with gradient accumulation it
needs ``no_sync`` on all but the last micro-batch (so it overlaps only that one's communication), a rank with no
rows this step (fewer rows than ranks, or every row of a shard skipped) would have to run a dummy forward to join the
reduction, and the average must be undone. One reduction after accumulation is exact, handles empty shards, and
costs one pass over the gradient (measured in ``bench/_model_plane_ddp.py``).

Rank 0 alone serves weights (`state_dict_for_serving`), scores rows (`token_logprobs`) and writes checkpoints
(`save`): every replica is the same. `load` runs on every rank from the same directory (a shared filesystem across
machines) and then checks that the replicas agree (`replica_fingerprints`).

Two ways to run it:

* **Ranks started by the trainer** (``UpdateConfig(ranks=N)``; ``grpo.config.ranks: N`` in a ``lightrail train``
  config). The constructing process is rank 0; it spawns ``N - 1`` worker processes (``multiprocessing`` spawn,
  gloo/NCCL over 127.0.0.1 with a free port) that build the same model and wait for commands. `GRPO` uses it with no
  other change. Workers stop with the trainer (`lightrail._lifeline`; a closed connection to rank 0 also ends
  them) and are shut down cleanly by `close`.
* **torchrun** (``torchrun --nproc-per-node N train.py``): every rank constructs the updater (the process group is
  set up from torchrun's environment); rank 0 drives, the others call `serve`::

      upd = DistributedPolicyUpdater(model_dir, UpdateConfig(lora=LoraSettings(r=16)))
      if upd.rank == 0:
          for rows in batches:
              upd.step(rows)
          upd.save("runs/ckpt")
          upd.close()          # releases the other ranks' serve()
      else:
          upd.serve()          # runs rank 0's steps on this rank's shards until rank 0 closes

Failures: collectives on the compute group time out after ``timeout_s`` (a hung rank); a rank that dies closes its
connections, which fails the collective at once. Either way rank 0 raises `RankFailedError` naming each worker's
state (exit code, signal, or its traceback), and the updater refuses further work: `close` it and resume from the
last checkpoint. Followers wait for commands on a separate gloo group without a practical timeout, so a long
rollout phase between steps is fine.

Sharded ranks (``UpdateConfig(sharding="fsdp")``, for policies whose weights, gradients and AdamW state do not fit one
device): the same rows, weights and commands, but each rank holds 1/N of the training state. The model is cut with
``torch.distributed.fsdp.fully_shard`` (FSDP2) after it is built and before the optimizer: every decoder layer is a
unit, and the rest (embeddings, final norm, LM head; tied weights stay in one unit) belongs to a root module that runs
the whole scoring forward (decoder and LM head on the response positions), so its weights are gathered around that
forward (`lightrail.model.reduction.ShardedSum`, the updater's reduction). What changes:

* Gradients are reduce-scattered during each micro-batch's backward, summed (``set_gradient_divide_factor(1.0)``:
  the loss weights are already global; gloo has no pre-multiplied sum, so the sum is forced), and accumulate in each
  rank's shard; the reduction then combines only the statistics. ``clip_grad_norm_`` over the sharded gradients
  computes the global norm, and AdamW steps each rank's shard.
* Every forward and backward pass is collective, so every rank runs as many passes as the busiest one: a rank with
  fewer micro-batches (or none) adds passes of a one-token row whose loss is multiplied by 0 (``padding_passes``).
  Shared prompt prefixes are not run once (their extra decoder pass would differ between ranks).
* `state_dict_for_serving`, `trainable_weights`, `token_logprobs` and `save` are commands every rank runs: the
  weights are gathered whole (``DTensor.full_tensor``) and rank 0 serves or writes them. Checkpoints keep the 1-rank
  format (whole trainable weights in safetensors, the whole AdamW state), gathered rather than written as per-rank shards with
  ``torch.distributed.checkpoint``: the policies trained here fit one host's memory once (only their training state
  is spread), and one format lets a sharded run resume on any number of ranks, sharded or not, and export with the
  same `lightrail.model.export` folder code. `load` reads the whole checkpoint on every rank and keeps each
  rank's slice (cut locally, no communication).
* The replicas' fingerprints are per shard, so `load` does not compare them.

Measured in ``bench/sharded.py``: 2 sharded ranks' weights after a step differ from 1 rank's by float summation
order, and each rank holds about half of the parameter and optimizer bytes.

Concurrency model: one process per rank, one thread driving each rank's updater; rank 0's methods are called by one
caller at a time (`GRPO` calls them from a worker thread, sequentially). Not thread-safe. One updater per process:
it uses the default ``torch.distributed`` process group (created and destroyed by the updater unless one exists).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from lightrail._lifeline import exit_with_parent
from lightrail.engine.engine import THREADS_ENV
from lightrail.model.reduction import AllReduceSum, ShardedSum, whole
from lightrail.model.updater import PolicyUpdater, UpdateConfig, _validate
from lightrail.types import TrainingRow

__all__ = ["DistributedPolicyUpdater", "RankFailedError", "shard_by_tokens"]

log = logging.getLogger(__name__)

#: Followers wait this long for rank 0's next command (rollouts run between steps); a dead rank 0 ends it sooner.
_CONTROL_TIMEOUT = timedelta(days=7)
_JOINED = "lightrail/joined"
#: How long spawned workers may take to start (import torch, connect); a worker that dies meanwhile fails at once.
_START_TIMEOUT = timedelta(minutes=5)


class RankFailedError(RuntimeError):
    """A data-parallel collective failed: a rank died, raised, or hung past ``timeout_s``. The message names each
    worker's state; the updater cannot continue (close it, resume from the last checkpoint)."""


def shard_by_tokens(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Assign row indices to ``ranks`` shards with balanced token counts: longest row first onto the rank with the
    fewest tokens so far (ties: the lower rank; equal lengths keep their order). Deterministic; each shard's
    indices are returned in increasing order.

        >>> shard_by_tokens([5, 9, 3, 9, 1], 2)
        [[0, 1], [2, 3, 4]]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, not {ranks}")
    loads = [0] * ranks
    shards: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min(range(ranks), key=lambda r: loads[r])
        shards[r].append(i)
        loads[r] += lengths[i]
    return [sorted(s) for s in shards]


@dataclasses.dataclass
class _Worker:
    rank: int
    process: Any  # multiprocessing.Process
    errors: Any  # receiving end of a one-way pipe: the worker's traceback if it fails

    def status(self) -> str:
        """One line (plus the worker's traceback, if it sent one) saying how this rank is doing."""
        error = None
        with contextlib.suppress(EOFError, OSError):
            if self.errors.poll():
                error = self.errors.recv()
        code = self.process.exitcode
        if error:
            state = f"failed:\n{error.rstrip()}"
        elif code is None:
            state = "still running (hung, or waiting on another rank)"
        elif code < 0:
            state = f"killed by {signal.Signals(-code).name}"
        else:
            state = f"exited with code {code}"
        return f"rank {self.rank} (pid {self.process.pid}) {state}"


def _exitcode_of(process: Any) -> Callable[[], int | None]:
    return lambda: process.exitcode


class DistributedPolicyUpdater(PolicyUpdater):
    """A `PolicyUpdater` whose step runs on ``config.ranks`` data-parallel ranks (see the module docstring).

        >>> upd = DistributedPolicyUpdater("path/to/model", UpdateConfig(ranks=2))   # doctest: +SKIP
        >>> upd.step(rows)["loss"]     # rows sharded over 2 processes    # doctest: +SKIP
        >>> weights = upd.state_dict_for_serving()                         # doctest: +SKIP
        >>> upd.close()                # stops the worker rank            # doctest: +SKIP

    Under ``torchrun`` (or with a default process group already initialised) the ranks are the group's; otherwise
    this process becomes rank 0 and starts ``config.ranks - 1`` workers. ``timeout_s`` bounds every collective of a
    step (a rank that hangs longer is reported as failed); ``bucket_mb`` sizes the flattened gradient all-reduces.
    ``model`` is a local model directory (each rank loads it) or a model instance (sent to the workers serialised).
    """

    data_parallel = True

    def __init__(
        self, model: Any, config: UpdateConfig | None = None, *, timeout_s: float = 600.0, bucket_mb: float = 64.0
    ) -> None:
        config = config or UpdateConfig()
        device = PolicyUpdater._resolve_device(config.device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        self.timeout_s = timeout_s
        self._bucket_bytes = int(bucket_mb * 2**20)
        self._workers: list[_Worker] = []
        self._owns_group = False
        self._failed: str | None = None
        self._closed = False
        try:
            if not dist.is_initialized():
                if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun (or any env:// launcher)
                    world = int(os.environ["WORLD_SIZE"])
                    if config.ranks not in (1, world):
                        raise ValueError(f"UpdateConfig(ranks={config.ranks}) but the launcher started {world} ranks")
                    if device.type == "cuda":
                        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
                    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
                else:
                    if config.ranks < 2:
                        raise ValueError("a DistributedPolicyUpdater outside torchrun needs UpdateConfig(ranks >= 2)")
                    self._start_workers(model, config, backend)
                self._owns_group = True
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self._local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
            # Commands travel on their own gloo group: followers may wait a whole rollout phase for the next one,
            # while the step's collectives keep the short ``timeout_s``.
            self._control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
            config = dataclasses.replace(config, ranks=self.world_size)
            if device.type == "cuda":
                device = torch.device("cuda", self._local_rank)  # this rank's own
            if config.sharding == "fsdp":
                reduction: AllReduceSum | ShardedSum = ShardedSum(device, self._start_from_rank_0)
            else:
                reduction = AllReduceSum(device, self._bucket_bytes, self._start_from_rank_0)
            super().__init__(model, config, reduction=reduction)
        except BaseException:
            self._shutdown(graceful=False)
            raise

    @property
    def sharded(self) -> bool:
        """Whether each rank holds a shard of the training state (``config.sharding == "fsdp"``) or all of it."""
        return self.config.sharding == "fsdp"

    def _start_from_rank_0(self, params: Sequence[torch.Tensor]) -> None:
        """Every rank starts from rank 0's trainable weights, as DDP does (the reduction calls this before the
        optimizer is built; a sharded one before the model is cut)."""
        with self._collective("start"):
            # Ranks build their models at their own pace: wait for all (bounded) before the timed collectives.
            _bounded(lambda: dist.barrier(group=self._control), _START_TIMEOUT.total_seconds(), "ranks not ready")
            with torch.no_grad():
                for p in params:
                    dist.broadcast(p.data, src=0)

    # -- starting workers -----------------------------------------------------------------------------------------

    def _start_workers(self, model: Any, config: UpdateConfig, backend: str) -> None:
        world = config.ranks
        # The rendezvous store listens on a socket bound here to 127.0.0.1 (TCPStore alone listens on every
        # interface) at a port the OS picks (no race with other processes); the workers are told which.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            "127.0.0.1", port, world, True, timeout=_START_TIMEOUT, wait_for_workers=False,
            master_listen_fd=listener.detach(),
        )  # fmt: skip
        if isinstance(model, str | os.PathLike):
            spec: str | bytes = str(model)
        else:  # serialised now, before this rank's updater takes the instance over (LoRA wraps it in place)
            buffer = io.BytesIO()
            torch.save(model, buffer)
            spec = buffer.getvalue()
        ctx = multiprocessing.get_context("spawn")
        for rank in range(1, world):
            errors, errors_in = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_worker_main,
                args=(rank, world, port, backend, spec, config, self.timeout_s, self._bucket_bytes, errors_in),
                name=f"lightrail-update-rank-{rank}",
                daemon=True,
            )
            process.start()
            errors_in.close()  # the worker holds the only writing end: its death reads as EOF here
            self._workers.append(_Worker(rank, process, errors))
        # Wait for every worker to reach the rendezvous while watching that they live: a worker that fails to start
        # is reported at once instead of after the rendezvous timeout.
        deadline = time.monotonic() + _START_TIMEOUT.total_seconds()
        while store.add(_JOINED, 0) < world - 1:
            dead = [w for w in self._workers if w.process.exitcode is not None]
            if dead or time.monotonic() > deadline:
                what = "started" if dead else f"joined within {_START_TIMEOUT.total_seconds():.0f} s"
                raise RankFailedError(f"data-parallel ranks not {what}: " + "; ".join(self._statuses()))
            time.sleep(0.02)
        dist.init_process_group(
            backend, store=store, rank=0, world_size=world, timeout=timedelta(seconds=self.timeout_s)
        )

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker ranks this updater started (empty under torchrun)."""
        return [w.process.pid for w in self._workers]

    # -- driving (rank 0) -------------------------------------------------------------------------------------

    def step(
        self,
        rows: Sequence[TrainingRow],
        *,
        current_version: int | None = None,
        max_staleness: int | None = None,
        objective: Literal["grpo", "sft"] = "grpo",
    ) -> dict[str, float]:
        """`PolicyUpdater.step` on every rank, each on its share of ``rows`` (rank 0 only; metrics are global)."""
        self._check_driver("step")
        return super().step(rows, current_version=current_version, max_staleness=max_staleness, objective=objective)

    def _step_on(
        self,
        rows: Sequence[TrainingRow],
        *,
        objective: Literal["grpo", "sft"],
        weights: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        if weights is not None:  # a shard: this rank's part of a step
            return super()._step_on(rows, objective=objective, weights=weights)
        skip_zero = self.config.skip_zero_advantage_rows and objective != "sft"
        all_weights = self._row_weights(rows)
        active = self._active_rows(rows, skip_zero_advantage=skip_zero)
        shards = shard_by_tokens([len(rows[i].input_ids) for i in active], self.world_size)
        payloads = [
            ([rows[active[j]] for j in shard], [all_weights[active[j]] for j in shard], objective) for shard in shards
        ]
        with self._collective("step"):
            own_rows, own_weights, _ = self._command("step", payloads)
            return super()._step_on(own_rows, objective=objective, weights=own_weights)

    def state_dict_for_serving(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """`PolicyUpdater.state_dict_for_serving` (rank 0; sharded: every rank gathers the whole weights, rank 0
        gets them)."""
        if not self.sharded:
            return super().state_dict_for_serving(dtype)
        self._check_driver("state_dict_for_serving")
        with self._collective("serving"):
            self._command("serving", [dtype] * self.world_size)
            return self._gathered_serving_state(dtype)

    def token_logprobs(self, rows: Sequence[TrainingRow]) -> list[list[float]]:
        """`PolicyUpdater.token_logprobs` (rank 0; sharded: every rank runs the same forward passes)."""
        if not self.sharded:
            return super().token_logprobs(rows)
        self._check_driver("token_logprobs")
        _validate(rows)  # before the other ranks are involved
        with self._collective("logprobs"):
            self._command("logprobs", [list(rows)] * self.world_size)
            return super().token_logprobs(rows)

    def trainable_weights(self) -> dict[str, torch.Tensor]:
        """`PolicyUpdater.trainable_weights` (rank 0; sharded: every rank gathers them, rank 0 gets them)."""
        if not self.sharded:
            return super().trainable_weights()
        self._check_driver("trainable_weights")
        with self._collective("trainable"):
            self._command("trainable", [None] * self.world_size)
            return self._full_trainable()

    def save(self, directory: str | os.PathLike) -> Path:
        """`PolicyUpdater.save` (rank 0 writes; sharded: every rank first gathers the whole weights and AdamW
        state, in the 1-rank checkpoint format)."""
        if not self.sharded:
            return super().save(directory)
        self._check_driver("save")
        with self._collective("save"):
            self._command("save", [None] * self.world_size)
            return super().save(directory)

    def load(self, directory: str | os.PathLike) -> None:
        """`PolicyUpdater.load` on every rank from ``directory`` (which every rank must be able to read), then a
        check that the replicas agree (sharded: each rank keeps its slice; shards are not compared)."""
        self._check_driver("load")
        super().load(directory)  # rank 0 first: a bad checkpoint fails here, with the other ranks untouched
        with self._collective("load"):
            self._command("load", [str(directory)] * self.world_size)
            fingerprints = self._gather_fingerprints()
        if not self.sharded and any(f != fingerprints[0] for f in fingerprints):
            self._failed = "load"
            raise RankFailedError(
                f"ranks loaded different states from {directory} (fingerprints {fingerprints}): every rank must read "
                "the same checkpoint (a shared filesystem across machines)"
            )

    def replica_fingerprints(self) -> list[tuple[float, ...]]:
        """Per rank: ``(steps, sum of trainable weights, sum of their squares, sum of AdamW's state)``, in float64.
        Replicas in step are equal bit for bit, so these are equal; a diverged rank shows here."""
        self._check_driver("replica_fingerprints")
        with self._collective("fingerprint"):
            self._command("fingerprint", [None] * self.world_size)
            return self._gather_fingerprints()

    def children(self) -> list[tuple[str, Callable[[], int | None]]]:
        """The worker ranks this process started (none under torchrun: the launcher watches them)."""
        return [(f"update rank {w.rank} (pid {w.process.pid})", _exitcode_of(w.process)) for w in self._workers]

    def close(self) -> None:
        """Stop the worker ranks (or release torchrun's followers from `serve`) and leave the process group.
        Idempotent; a failed updater's workers are terminated."""
        self._shutdown(graceful=True)

    def __enter__(self) -> DistributedPolicyUpdater:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- following (ranks > 0) ----------------------------------------------------------------------------------

    def serve(self) -> None:
        """Run rank 0's commands on this rank until rank 0 closes (ranks > 0; spawned workers run this)."""
        if self.rank == 0:
            raise RuntimeError("rank 0 drives the update (step, load, close); the other ranks call serve()")
        while True:
            received: list[Any] = [None]
            dist.scatter_object_list(received, None, src=0, group=self._control)
            op, arg = received[0]
            if op == "close":
                break
            if op == "step":
                rows, weights, objective = arg
                super()._step_on(rows, objective=objective, weights=weights)
            elif op == "load":
                PolicyUpdater.load(self, arg)
                self._gather_fingerprints()
            elif op == "fingerprint":
                self._gather_fingerprints()
            elif op == "serving":
                self._gathered_serving_state(arg)
            elif op == "logprobs":
                PolicyUpdater.token_logprobs(self, arg)
            elif op == "trainable":
                self._full_trainable()
            elif op == "save":  # the gathers of `PolicyUpdater.save`, in its order; rank 0 writes
                self._full_trainable()
                self._full_optimizer_state()
            else:
                raise RuntimeError(f"unknown command {op!r} from rank 0")
        self._shutdown(graceful=True)

    # -- collectives --------------------------------------------------------------------------------------------

    def _command(self, op: str, args: list[Any]) -> Any:
        """Send each rank its argument of ``op``; returns rank 0's own."""
        dead = [w for w in self._workers if w.process.exitcode is not None]
        if dead:
            raise RankFailedError("; ".join(w.status() for w in dead))
        received: list[Any] = [None]
        _bounded(
            lambda: dist.scatter_object_list(received, [(op, a) for a in args], src=0, group=self._control),
            self.timeout_s,
            f"the other ranks did not take the {op!r} command",
        )
        return received[0][1]

    # -- sharded state, whole --------------------------------------------------------------------------------------

    def _gathered_serving_state(self, dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
        """The weights `PolicyUpdater.state_dict_for_serving` gives, gathered whole (every rank must call this)."""
        with torch.no_grad():
            base = self.model.get_base_model() if self.is_lora else self.model
            gathered = {k: whole(v.detach()) for k, v in base.state_dict().items()}
            state = {k.replace(".base_layer.", "."): v for k, v in gathered.items() if ".lora_" not in k}
            if self.is_lora:
                from peft.tuners.lora import LoraLayer

                for name, module in base.named_modules():
                    if not isinstance(module, LoraLayer) or module.merged:
                        continue
                    merged = gathered[f"{name}.base_layer.weight"].clone()
                    for adapter in module.active_adapters:
                        if adapter in module.lora_A:  # peft's delta: B @ A x scaling (transposed for Conv1D)
                            a, b = (
                                gathered[f"{name}.lora_A.{adapter}.weight"],
                                gathered[f"{name}.lora_B.{adapter}.weight"],
                            )
                            delta = (b @ a) * module.scaling[adapter]
                            merged += (delta.T if module.fan_in_fan_out else delta).to(merged.dtype)
                    state[f"{name}.weight"] = merged
            if dtype is not None:
                state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return state

    def _gather_fingerprints(self) -> list[tuple[float, ...]]:
        mine = self._fingerprint()
        out: list[Any] = [None] * self.world_size if self.rank == 0 else []
        dist.gather_object(mine, out if self.rank == 0 else None, dst=0, group=self._control)
        return out

    def _fingerprint(self) -> tuple[float, ...]:
        with torch.no_grad():
            params = [_local(p) for p in self._trainable.values()]
            total = sum(float(p.double().sum()) for p in params)
            squares = sum(float(p.double().square().sum()) for p in params)
            moments = sum(
                float(_local(v).double().sum())
                for state in self.optimizer.state.values()
                for v in state.values()
                if isinstance(v, torch.Tensor)
            )
        return (float(self.steps), total, squares, moments)

    # -- failures and shutdown ------------------------------------------------------------------------------------

    def _check_driver(self, what: str) -> None:
        if self.rank != 0:
            raise RuntimeError(f"{what}() is rank 0's: rank {self.rank} follows it by calling serve()")
        if self._closed:
            raise RuntimeError("this DistributedPolicyUpdater is closed")
        if self._failed is not None:
            raise RankFailedError(
                f"a data-parallel {self._failed} failed earlier: close() this updater and resume from a checkpoint"
            )

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """Run collectives; any failure leaves the replicas in unknown states, so it fails the updater for good."""
        try:
            yield
        except RankFailedError:
            self._failed = what
            raise
        except Exception as exc:
            self._failed = what
            if self.world_size == 1 or not self._workers:  # torchrun: the launcher reports the other ranks
                raise RankFailedError(f"data-parallel {what} failed on rank {self.rank}: {exc}") from exc
            # Give a rank that crashed a moment to report its traceback before naming everyone's state.
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and not any(w.process.exitcode is not None for w in self._workers):
                time.sleep(0.05)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankFailedError(
                f"data-parallel {what} failed on rank 0 ({first}); " + "; ".join(self._statuses())
            ) from exc

    def _statuses(self) -> list[str]:
        return [w.status() for w in self._workers]

    def _shutdown(self, *, graceful: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if (
            graceful
            and self._failed is None
            and getattr(self, "rank", None) == 0
            and dist.is_initialized()
            and hasattr(self, "_control")
        ):
            with contextlib.suppress(Exception):
                self._command("close", [None] * self.world_size)
        for w in self._workers:
            w.process.join(timeout=30.0 if graceful and self._failed is None else 0.5)  # a loaded machine exits slowly
            if w.process.exitcode is None:
                w.process.kill()  # SIGKILL also ends a stopped (SIGSTOP) or wedged process
                w.process.join(timeout=5.0)
            w.errors.close()
        if self._owns_group and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor (DTensor); any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _bounded(call: Any, timeout_s: float, what: str) -> None:
    """Run a control-group collective, giving up after ``timeout_s``.

    gloo hands a message over only once the receiver has posted its receive, and the control group waits for days
    (followers idle through rollouts), so a hung rank would block the caller as long. The call runs in a helper
    thread instead; a hung rank's end (`DistributedPolicyUpdater.close` kills it) later releases that thread.
    """
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="lightrail-update-control", daemon=True).start()
    if not done.wait(timeout_s):
        raise TimeoutError(f"{what} within {timeout_s:.0f} s")
    if failure:
        raise failure[0]


def _worker_main(
    rank: int,
    world: int,
    port: int,
    backend: str,
    model: str | bytes,
    config: UpdateConfig,
    timeout_s: float,
    bucket_bytes: int,
    errors: Any,
) -> None:
    """Entry point of a worker rank started by `DistributedPolicyUpdater`: join, build the replica, serve."""
    exit_with_parent(grace_s=5.0)
    try:
        if backend == "gloo" and not os.environ.get(THREADS_ENV):
            # The ranks share the machine's cores (rank 0 keeps the trainer's own setting).
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=_START_TIMEOUT)
        store.add(_JOINED, 1)
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        if isinstance(model, bytes):
            model = torch.load(io.BytesIO(model), weights_only=False)
        updater = DistributedPolicyUpdater(model, config, timeout_s=timeout_s, bucket_mb=bucket_bytes / 2**20)
        updater.serve()
    except BaseException:
        with contextlib.suppress(OSError):
            errors.send(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
