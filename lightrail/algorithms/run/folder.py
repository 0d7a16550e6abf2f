"""`RunFolder`: a training stage's ``out_dir`` and the loop state it checkpoints there.

What a stage leaves in its folder: ``metrics.jsonl`` (one line per record, mirrored to the run's experiment
trackers), ``checkpoints/step-N`` and ``report.json``. A checkpoint holds the updater's files (written atomically by
the updater) and ``loop_state.json`` (step, task or row order, RNG, metric history, and what the stage adds), written
last and atomically: a checkpoint counts only once its loop state is complete, so a run killed at any moment resumes
from the newest complete one. A fresh (not resumed) run first moves an earlier run's files to ``earlier/<UTC time>/``.

Concurrency model: called from the trainer's event loop; `RunFolder.checkpoint` writes in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LOOP_STATE", "RunFolder", "latest_checkpoint", "prune_checkpoints", "start_fresh"]

LOOP_STATE = "loop_state.json"

log = logging.getLogger(__name__)


class RunFolder:
    """The folder of the stage named ``stage`` and its loop state: ``step`` (steps done), ``order`` (what is left of
    the current epoch's seeded shuffle, `next_indices`), ``rng`` and ``history`` (every record of this run).

        >>> folder = RunFolder("runs/grpo", "GRPO", keep_checkpoints=3, seed=0)          # doctest: +SKIP
        >>> checkpoint, state = folder.start(resume=True, track=ctx.track)              # doctest: +SKIP
        >>> folder.record({"kind": "train", "step": 1}); await folder.checkpoint(save)  # doctest: +SKIP
    """

    def __init__(self, path: str | Path, stage: str, *, keep_checkpoints: int | None = None, seed: int = 0) -> None:
        if keep_checkpoints is not None and keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1 (None keeps every one), not {keep_checkpoints}")
        self.path = Path(path)
        self.stage = stage
        self.keep_checkpoints = keep_checkpoints
        self.step = 0
        self.order: list[int] = []
        self.rng = random.Random(seed)
        self.history: list[dict[str, Any]] = []
        self.track: Callable[[dict[str, Any]], None] | None = None
        """The trainer's `TrainerContext.track` (set by `start`): mirrors each record to the experiment trackers."""

    def start(
        self, *, resume: bool, track: Callable[[dict[str, Any]], None] | None
    ) -> tuple[Path | None, dict[str, Any]]:
        """Where the stage starts: with ``resume``, the newest complete checkpoint (its loop state restored here, and
        ``metrics.jsonl`` rewritten as of it, so redone steps are recorded once); asked to resume with nothing
        checkpointed, an empty ``metrics.jsonl`` (SFT's pinned ``traces.json`` stays); else fresh (`start_fresh`).
        Returns the checkpoint (None: none) and what the stage added to its loop state."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.track = track
        checkpoint = latest_checkpoint(self.path) if resume else None
        state: dict[str, Any] = {}
        if checkpoint is not None:
            state = json.loads((checkpoint / LOOP_STATE).read_text())
            version, internal, gauss = state.pop("rng")
            self.rng.setstate((version, tuple(internal), gauss))
            self.step, self.order, self.history = state.pop("step"), state.pop("order"), state.pop("history")
        if resume:  # said once, so a resumed run's log shows where it picked up
            from rich import get_console

            where = f"from step {self.step} ({checkpoint})" if checkpoint is not None else (
                f"from step 0: no checkpoint in {self.path / 'checkpoints'} yet"
            )  # fmt: skip
            get_console().print(f"{self.stage}: resuming {where}", markup=False, highlight=False, soft_wrap=True)
            (self.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in self.history))
        else:
            start_fresh(self.path, self.stage)
        return checkpoint, state

    def append(self, record: dict[str, Any]) -> None:
        """One record as a line of ``metrics.jsonl``, mirrored to the experiment trackers."""
        with (self.path / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.track is not None:
            self.track(record)

    def record(self, metrics: dict[str, Any]) -> None:
        """`append`, and keep ``metrics`` in the history a checkpoint saves."""
        self.history.append(metrics)
        self.append(metrics)

    def first_val(self) -> float | None:
        """The first validation's success in the history (a resumed run's ``val_before``), or None."""
        return next((m["val_success"] for m in self.history if m["kind"] == "val"), None)

    def next_indices(self, n: int, total: int) -> list[int]:
        """The next ``n`` (at most ``total``) indices of a seeded shuffle of ``range(total)``, reshuffled each epoch
        (resumable: the order and the RNG are checkpointed)."""
        picked: list[int] = []
        while len(picked) < min(n, total):
            if not self.order:
                self.order = list(range(total))
                self.rng.shuffle(self.order)
            picked.append(self.order.pop())
        return picked

    async def checkpoint(self, save: Callable[[Path], None], **state: Any) -> Path:
        """``checkpoints/step-N``: the updater's files (``save(folder)``; skipped when this step is saved already, as
        in a stage's final save right after a periodic one, so no moment is left without a complete checkpoint), then
        the loop state with ``state`` added, then the older ones pruned to ``keep_checkpoints``."""
        path = self.path / "checkpoints" / f"step-{self.step}"
        loop_state = {"step": self.step, "order": self.order, "history": self.history, **state}
        version, internal, gauss = self.rng.getstate()
        loop_state["rng"] = [version, list(internal), gauss]

        def write() -> None:
            if not (path / LOOP_STATE).exists():
                save(path)
            tmp = path / f".{LOOP_STATE}.tmp"
            with open(tmp, "w") as f:
                json.dump(loop_state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path / LOOP_STATE)
            prune_checkpoints(self.path, self.keep_checkpoints)

        await asyncio.to_thread(write)
        return path

    def write_report(self, report: dict[str, Any]) -> None:
        """``report.json``: what the stage reports at its end."""
        (self.path / "report.json").write_text(json.dumps(report, indent=2))


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``out_dir/checkpoints`` (one whose loop state was written), or None."""
    found = [p for _, p in _steps(out_dir) if (p / LOOP_STATE).exists()]
    return found[-1] if found else None


def prune_checkpoints(out_dir: Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints under ``out_dir/checkpoints`` (None: keep every one),
    and any incomplete ``step-N`` older than the newest complete one (a crash's leftover); returns what was deleted."""
    if keep is None:
        return []
    steps = _steps(out_dir)
    complete = [s for s, p in steps if (p / LOOP_STATE).exists()]
    if not complete:
        return []
    kept = set(complete[-keep:])
    doomed = [p for s, p in steps if s not in kept and s < complete[-1]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def _steps(out_dir: Path) -> list[tuple[int, Path]]:
    """``(N, folder)`` of the ``step-N`` folders under ``out_dir/checkpoints`` by step (not a save's
    ``step-N.old-*`` leftovers)."""
    root = out_dir / "checkpoints"
    found = [p for p in root.glob("step-*") if p.name[5:].isdigit()] if root.exists() else []
    return sorted((int(p.name[5:]), p) for p in found)


def start_fresh(out_dir: Path, stage: str) -> Path | None:
    """Where a fresh (not resumed) run starts: an earlier run's ``metrics.jsonl``, ``checkpoints/`` and (SFT's)
    ``traces.json`` in ``out_dir`` move to ``out_dir/earlier/<UTC time>/``, so the metrics file holds this run's
    lines only and a later resume finds this run's checkpoints, not the earlier run's higher steps; nothing is
    deleted, and a warning says where they went. Returns that folder, or None when there was nothing to move."""
    found = [out_dir / name for name in ("metrics.jsonl", "checkpoints", "traces.json") if (out_dir / name).exists()]
    if not found:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = out_dir / "earlier" / stamp, 1
    while dest.exists():  # two fresh runs within a second
        n += 1
        dest = out_dir / "earlier" / f"{stamp}-{n}"
    dest.mkdir(parents=True)
    for path in found:
        path.rename(dest / path.name)
    log.warning(
        "%s: a fresh run in %s; the earlier run's metrics and checkpoints are in %s (delete it to free the space)",
        stage, out_dir, dest,
    )  # fmt: skip
    return dest
