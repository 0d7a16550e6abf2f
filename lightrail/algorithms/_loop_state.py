"""The loop state a training algorithm (`GRPO`, `SFT`) keeps beside each checkpoint of its updater, and how a
resumed run finds it.

A checkpoint directory ``checkpoints/step-N`` holds the updater's files (written atomically by the updater) and
``loop_state.json`` (step, task order, RNG, metric history), written last and atomically: a checkpoint counts only
once its loop state is complete, so a run killed at any moment resumes from the newest complete one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LOOP_STATE",
    "latest_checkpoint",
    "prune_checkpoints",
    "read_loop_state",
    "rewrite_metrics",
    "set_aside_earlier_run",
    "start_fresh",
    "start_metrics",
    "write_checkpoint",
    "write_loop_state",
]

LOOP_STATE = "loop_state.json"

log = logging.getLogger(__name__)


def write_loop_state(checkpoint: Path, state: dict[str, Any], rng: random.Random) -> None:
    """Write ``state`` plus ``rng``'s state as the checkpoint's loop state (temporary file, then renamed)."""
    version, internal, gauss = rng.getstate()
    tmp = checkpoint / f".{LOOP_STATE}.tmp"
    with open(tmp, "w") as f:
        json.dump({**state, "rng": [version, list(internal), gauss]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, checkpoint / LOOP_STATE)


def read_loop_state(checkpoint: Path, rng: random.Random) -> dict[str, Any]:
    """The checkpoint's loop state; ``rng`` is set back to the state it had."""
    state = json.loads((checkpoint / LOOP_STATE).read_text())
    version, internal, gauss = state.pop("rng")
    rng.setstate((version, tuple(internal), gauss))
    return state


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


def write_checkpoint(
    out_dir: Path, step: int, save: Callable[[Path], None], state: dict[str, Any], rng: random.Random, keep: int | None
) -> Path:
    """``out_dir/checkpoints/step-N``: the updater's files (``save(folder)``; skipped when this step is saved already,
    as in a stage's final save right after a periodic one, so no moment is left without a complete checkpoint),
    then the loop state (`write_loop_state`), then `prune_checkpoints` to ``keep``. Blocking: run it in a thread."""
    path = out_dir / "checkpoints" / f"step-{step}"
    if not (path / LOOP_STATE).exists():
        save(path)
    write_loop_state(path, state, rng)
    prune_checkpoints(out_dir, keep)
    return path


def _steps(out_dir: Path) -> list[tuple[int, Path]]:
    """``(N, folder)`` of the ``step-N`` folders under ``out_dir/checkpoints`` by step (not a save's
    ``step-N.old-*`` leftovers)."""
    root = out_dir / "checkpoints"
    found = [p for p in root.glob("step-*") if p.name[5:].isdigit()] if root.exists() else []
    return sorted((int(p.name[5:]), p) for p in found)


def append_metrics(out_dir: Path, record: dict[str, Any], track: Callable[[dict[str, Any]], None] | None) -> None:
    """One record as a line of ``metrics.jsonl``, then mirrored to the run's experiment trackers (``track``: the
    trainer's `TrainerContext.track`, None before setup)."""
    with (out_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    if track is not None:
        track(record)


def rewrite_metrics(out_dir: Path, history: Sequence[dict[str, Any]]) -> None:
    """``metrics.jsonl`` as of a checkpoint: what a crashed session recorded after it is redone, so the file holds
    each step once."""
    (out_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))


def set_aside_earlier_run(out_dir: Path) -> Path | None:
    """Where a fresh (not resumed) run starts: an earlier run's ``metrics.jsonl``, ``checkpoints/`` and (SFT's)
    ``traces.json`` in ``out_dir`` move to ``out_dir/earlier/<UTC time>/``, so the metrics file holds this run's
    lines only and a later resume finds this run's checkpoints, not the earlier run's higher steps; nothing is
    deleted. Returns that folder, or None when there was nothing to move."""
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
    return dest


def start_metrics(out_dir: Path, history: Sequence[dict[str, Any]] | None, *, resume: bool, stage: str) -> None:
    """``metrics.jsonl`` as a stage sets up: a resumed run's ``history`` as of its checkpoint (`rewrite_metrics`);
    asked to resume with nothing checkpointed yet (``history`` None), an empty file (what SFT pinned in
    ``traces.json`` stays); a fresh run sets the earlier run aside (`set_aside_earlier_run`) and says where."""
    if history is not None or resume:
        rewrite_metrics(out_dir, history or [])
    else:
        start_fresh(out_dir, stage)


def start_fresh(out_dir: Path, stage: str) -> None:
    """`set_aside_earlier_run`, with a warning saying where the earlier run went (its checkpoints stay until deleted)."""
    if (earlier := set_aside_earlier_run(out_dir)) is not None:
        log.warning(
            "%s: a fresh run in %s; the earlier run's metrics and checkpoints are in %s (delete it to free the space)",
            stage, out_dir, earlier,
        )  # fmt: skip
