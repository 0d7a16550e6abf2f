"""`Chain`: algorithms run one after another in one `Trainer` session (same store, same runners).

The usual chain is a supervised warm start then reinforcement learning: ``Chain([sft, GRPO(sft.output_model)])``
(`lightrail train` builds it from ``algorithm: [sft, grpo]``). A stage that produces weights writes them where the
next stage's ``model`` points (`SFT.output_model`); each stage is set up only when the previous one has finished,
so it loads what its predecessor wrote. A stage's closing validation is the next stage's opening one when it
measured the weights the next stage starts from in the same way (`_hand_over_validation`): a GRPO after SFT does not
repeat a full pass over the val tasks (recorded in its ``metrics.jsonl`` with ``"reused": true``).

Concurrency model: the stages' ``setup``/``run``/``close`` run in order on the trainer's event loop; a stage is
closed before the next is set up, so gateway ports and engine memory are released in between.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightrail.algorithms.protocol import Algorithm, TrainerContext

__all__ = ["Chain"]


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
        dirs = [str(d) for s in self.stages if (d := getattr(s, "out_dir", None)) is not None]
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
            out_dir = getattr(stage, "out_dir", None)
            if out_dir is not None and getattr(stage, "resume", None) is False:
                start_fresh(Path(out_dir), name)

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
            reports[name] = dict(getattr(stage, "report", {}) or {})
            previous = stage
        before = next((r["val_before"] for r in reports.values() if r.get("val_before") is not None), None)
        self.report = {**reports[self.names[-1]], "val_before": before, "stages": reports}

    async def close(self) -> None:
        """Nothing: every stage was closed when it finished (or failed)."""


def _hand_over_validation(previous: Any, stage: Any) -> None:
    """Give ``stage`` the held-out success ``previous`` measured at its end when it measured the same thing: the
    weights ``stage`` starts from (``previous.output_model`` is ``stage.model``), the same sampling and success
    threshold, both on the embedded engine with the same options. A GRPO after SFT then skips its opening
    validation (a full pass over the val tasks) instead of repeating the SFT's last one."""
    val = (getattr(previous, "report", None) or {}).get("val_after")
    output = getattr(previous, "output_model", None)
    if val is None or output is None or not hasattr(stage, "val_before") or stage.val_before is not None:
        return
    same = (
        Path(output) == Path(getattr(stage, "model", ""))
        and getattr(previous, "val_sampling", None) == getattr(stage, "val_sampling", None)
        and getattr(previous, "success_threshold", None) == getattr(stage, "success_threshold", None)
        and getattr(stage, "rollout_engine", "embedded") == "embedded"
        and getattr(previous, "engine_options", None) == getattr(stage, "engine_options", None)
    )
    if same:
        stage.val_before = val


def _in_stage(track: Callable[[dict[str, Any]], None], stage: str) -> Callable[[dict[str, Any]], None]:
    """``track`` with each record tagged by its stage (trackers prefix the stage: ``sft/train/loss``)."""
    return lambda record: track({**record, "stage": stage})
