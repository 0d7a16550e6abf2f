"""The loop state a training algorithm (`GRPO`, `SFT`) keeps beside each checkpoint of its updater, and how a
resumed run finds it.

A checkpoint directory ``checkpoints/step-N`` holds the updater's files (written atomically by the updater) and
``loop_state.json`` (step, task order, RNG, metric history), written last and atomically: a checkpoint counts only
once its loop state is complete, so a run killed at any moment resumes from the newest complete one.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["LOOP_STATE", "latest_checkpoint", "read_loop_state", "rewrite_metrics", "write_loop_state"]

LOOP_STATE = "loop_state.json"


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
    root = out_dir / "checkpoints"
    found = [p for p in root.glob("step-*") if (p / LOOP_STATE).exists()] if root.exists() else []
    return max(found, key=lambda p: int(p.name.split("-")[1]), default=None)


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
