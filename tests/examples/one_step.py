"""What the showcase-agent tests share: `lightrail train` overrides for one tiny GRPO step, and that step's metrics."""

from __future__ import annotations

import json
from typing import Any

ONE_TINY_STEP = ["model=tiny", "grpo.steps=1", "grpo.tasks_per_step=2", "grpo.n_samples=2", "grpo.val_every=0"]
"""The tiny random model, one step of 2 tasks × 2 samples, validation only before and after."""


def train_step_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The one ``train`` line of a run's ``metrics.jsonl`` (fails unless there is exactly one)."""
    with open(report["metrics"], encoding="utf-8") as f:
        (step,) = [m for m in map(json.loads, f) if m["kind"] == "train"]
    return step
