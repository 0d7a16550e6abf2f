"""`run_steps`: the cadence of a training stage's steps (`GRPO`, `SFT`): train, every ``val_every`` steps validate
(not at the last: a stage validates at its end), every ``checkpoint_every`` steps checkpoint, update the step bar.

Concurrency model: a coroutine on the trainer's event loop, awaiting the stage's callables one after the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from lightrail.algorithms.run.folder import RunFolder
from lightrail.algorithms.run.progress import StepBar

__all__ = ["run_steps"]


async def run_steps(
    folder: RunFolder,
    steps: int,
    *,
    train_step: Callable[[], Awaitable[str]],
    validate: Callable[[], Awaitable[float | None]],
    checkpoint: Callable[[], Awaitable[Any]],
    val_every: int,
    checkpoint_every: int,
) -> None:
    """Steps from ``folder.step`` (a resumed run's count) to ``steps``; ``train_step`` advances ``folder.step`` and
    returns its status for the bar (``reward 0.500``), to which a validation adds ``val 40%``."""
    with StepBar(folder.stage, total=steps, completed=folder.step) as bar:
        while folder.step < steps:
            status = await train_step()
            if val_every and folder.step % val_every == 0 and folder.step < steps:
                val = await validate()
                status += f"  val {val:.0%}" if val is not None else ""
            if checkpoint_every and folder.step % checkpoint_every == 0:
                await checkpoint()
            bar.update(folder.step, status)
