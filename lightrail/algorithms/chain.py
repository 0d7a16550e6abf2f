"""`Chain`: algorithms run one after another in one `Trainer` session (same store, same runners).

The usual chain is a supervised warm start then reinforcement learning: ``Chain([sft, GRPO(sft.output_model)])``
(`lightrail train` builds it from ``algorithm: [sft, grpo]``). A stage that produces weights writes them where the
next stage's ``model`` points (`SFT.output_model`); each stage is set up only when the previous one has finished,
so it loads what its predecessor wrote. A stage's closing validation is the next stage's opening one when it
measured the weights the next stage starts from in the same way (`_hand_over_validation`): a GRPO after SFT does not
repeat a full pass over the val tasks (recorded in its ``metrics.jsonl`` with ``"reused": true``).

What `Chain` reads of a stage beyond the `Algorithm` methods is written down as protocols, each optional (a stage
of your own needs none of them): `StageFolder` (its run folder), `Resumable` (whether it continues from it),
`Reporting` (its report),
`WeightsProducer` (the weights it writes and how it measured them) and `ValidationTaker` (the weights it starts from
and how it would measure them). `SFT`, `GRPO` and `APO` satisfy the ones that apply to them.

Concurrency model: the stages' ``setup``/``run``/``close`` run in order on the trainer's event loop; a stage is
closed before the next is set up, so gateway ports and engine memory are released in between.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lightrail.algorithms.protocol import Algorithm, TrainerContext

__all__ = ["Chain", "Reporting", "Resumable", "StageFolder", "ValidationTaker", "WeightsProducer"]


@runtime_checkable
class StageFolder(Protocol):
    """A stage with a run folder of its own (metrics, checkpoints): the stages' folders must differ, and the run is
    named after the folder they share."""

    out_dir: Path


@runtime_checkable
class Resumable(StageFolder, Protocol):
    """A stage that can continue from its folder's checkpoints; ``resume`` False: an earlier run in the folder is
    set aside when the chain starts."""

    resume: bool


@runtime_checkable
class Reporting(Protocol):
    """A stage that reports its figures when it ends (``val_before``, ``val_after``, paths...)."""

    report: dict[str, Any]


@runtime_checkable
class WeightsProducer(Reporting, Protocol):
    """A stage that writes weights (``output_model``) and measured them at its end (``report["val_after"]``) with
    these settings."""

    output_model: Path
    val_sampling: dict[str, Any]
    success_threshold: float
    engine_options: dict[str, Any]


@runtime_checkable
class ValidationTaker(Protocol):
    """A stage that measures the weights it starts from (``model``) before it trains, unless ``val_before`` is given
    to it, with these settings."""

    model: Path
    val_before: float | None
    val_sampling: dict[str, Any]
    success_threshold: float
    engine_options: dict[str, Any]
    rollout_engine: str


class Chain:
    """Run ``stages`` (`Algorithm`s) in order; ``names`` label their reports (default: the class names, lowercase).

    ``report`` is the last stage's report, plus ``stages`` (every stage's report by name) and ``val_before`` from
    the first stage that measured one, so before/after spans the whole chain.

        >>> sft = SFT("runs/base", teacher=teacher, out_dir="runs/x/sft")                       # doctest: +SKIP
        >>> chain = Chain([sft, GRPO(sft.output_model, out_dir="runs/x/grpo")])                  # doctest: +SKIP
        >>> Trainer(algorithm=chain).fit(agent, train, val); chain.report["stages"]["sft"]      # doctest: +SKIP
    """

    def __init__(self, stages: Sequence[Algorithm], names: Sequence[str] | None = None) -> None:
        if not stages:
            raise ValueError("a chain needs at least one stage")
        names = list(names) if names is not None else [type(s).__name__.lower() for s in stages]
        if len(names) != len(stages) or len(set(names)) != len(names):
            raise ValueError(f"need one distinct name per stage, got {names}")
        self.stages = list(stages)
        self.names = names
        dirs = [str(s.out_dir) for s in self.stages if isinstance(s, StageFolder) and s.out_dir is not None]
        if len({os.path.abspath(d) for d in dirs}) != len(dirs):
            raise ValueError(f"each stage needs its own out_dir (its metrics and checkpoints), got {dirs}")
        self.out_dir: Path | None = Path(os.path.commonpath(dirs)) if len(dirs) == len(self.stages) else None
        """The folder the stages' folders share (the run folder of a config): the run's name and its trackers'."""
        self.report: dict[str, Any] = {}

    async def setup(self, ctx: TrainerContext) -> None:
        """Set aside an earlier run in the folder of every stage that starts fresh (not ``resume``), all at once: a
        later stage's would otherwise stay until its turn, and a ``--resume`` after a crash before that turn would
        continue the earlier run's checkpoints. Each stage is set up when its turn comes (it may load what the
        previous stage wrote)."""
        from lightrail.algorithms.run.folder import start_fresh

        for name, stage in zip(self.names, self.stages, strict=True):
            if isinstance(stage, Resumable) and stage.out_dir is not None and stage.resume is False:
                start_fresh(Path(stage.out_dir), name)

    async def run(self, ctx: TrainerContext) -> None:
        reports: dict[str, Any] = {}
        previous: Algorithm | None = None
        for name, stage in zip(self.names, self.stages, strict=True):
            if previous is not None:
                _hand_over_validation(previous, stage)
            stage_ctx = dataclasses.replace(ctx, track=_in_stage(ctx.track, name))
            try:
                await stage.setup(stage_ctx)
                await stage.run(stage_ctx)
            finally:
                await stage.close()
            reports[name] = dict(stage.report or {}) if isinstance(stage, Reporting) else {}
            previous = stage
        before = next((r["val_before"] for r in reports.values() if r.get("val_before") is not None), None)
        self.report = {**reports[self.names[-1]], "val_before": before, "stages": reports}

    async def close(self) -> None:
        """Nothing: every stage was closed when it finished (or failed)."""


def _hand_over_validation(previous: Algorithm, stage: Algorithm) -> None:
    """Give ``stage`` the held-out success ``previous`` measured at its end when it measured the same thing: the
    weights ``stage`` starts from (``previous.output_model`` is ``stage.model``), the same sampling and success
    threshold, both on the embedded engine with the same options. A GRPO after SFT then skips its opening
    validation (a full pass over the val tasks) instead of repeating the SFT's last one."""
    if not isinstance(previous, WeightsProducer) or not isinstance(stage, ValidationTaker):
        return
    val = previous.report.get("val_after")
    if val is None or stage.val_before is not None:
        return
    same = (
        Path(previous.output_model) == Path(stage.model)
        and previous.val_sampling == stage.val_sampling
        and previous.success_threshold == stage.success_threshold
        and stage.rollout_engine == "embedded"
        and previous.engine_options == stage.engine_options
    )
    if same:
        stage.val_before = val


def _in_stage(track: Callable[[dict[str, Any]], None], stage: str) -> Callable[[dict[str, Any]], None]:
    """``track`` with each record tagged by its stage (trackers prefix the stage: ``sft/train/loss``)."""
    return lambda record: track({**record, "stage": stage})
