"""`FitResult`, what `Trainer.fit` returns, and `summary`, the lines it and ``lightrail train`` print at the end: one
function, so the Python API and the CLI say the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FitResult", "summary"]


@dataclass(frozen=True)
class FitResult:
    """What a `Trainer.fit` run produced.

    ``val_before``/``val_after``: held-out success (share of validation tasks whose reward reached the algorithm's
    ``success_threshold``, 0..1) before and after training; None when not measured (no validation tasks, or
    ``validate_before=False``). ``checkpoint``: the final checkpoint folder (None when the algorithm writes none, e.g.
    APO). ``report_path``: the algorithm's ``report.json`` (None when it has no run folder). ``store``: where every
    rollout and span of the run is (a SQLite path or a URL, password redacted). ``out_dir``: the algorithm's run
    folder. ``report``: the algorithm's report as a dict (every figure it wrote, e.g. ``reward_curve``, ``steps``).
    """

    val_before: float | None
    val_after: float | None
    checkpoint: Path | None
    report_path: Path | None
    store: str
    out_dir: Path | None
    report: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, report: dict[str, Any], *, store: str, out_dir: Path | None) -> FitResult:
        """The result of an algorithm whose ``report`` is as `GRPO`/`SFT`/`APO`/`Chain` write it."""
        stages = report.get("stages") or {"": report}
        checkpoints = [s["checkpoint"] for s in stages.values() if s.get("checkpoint")]
        report_path = out_dir / "report.json" if out_dir is not None else None
        return cls(
            val_before=report.get("val_before"),
            val_after=report.get("val_after"),
            checkpoint=Path(checkpoints[-1]) if checkpoints else None,  # a chain's: its last stage's
            report_path=report_path if report_path is not None and report_path.is_file() else None,
            store=store,
            out_dir=out_dir,
            report=dict(report),
        )

    def summary(self) -> str:
        """The lines ``lightrail train`` prints (`summary`)."""
        return summary(self.report, self.store)


def summary(report: dict[str, Any], store: str) -> str:
    """What ``lightrail train`` and `Trainer.fit` print at the end, for any algorithm's report (GRPO, SFT, APO, a
    chain): held-out success before and after, the minutes, and where the outputs are (only those the algorithm
    wrote)."""

    def shown(value: float | None) -> str:
        return "not measured" if value is None else f"{value:.2f}"  # no held-out tasks, or none before SFT

    stages = report.get("stages") or {"": report}  # a chain: its stages' minutes add up, each lists its outputs
    minutes = [m for r in stages.values() if (m := r.get("minutes", r.get("train_minutes"))) is not None]
    lines = [
        f"held-out success: {shown(report.get('val_before'))} -> {shown(report.get('val_after'))}"
        + (f" in {sum(minutes):.1f} min" if minutes else "")
    ]
    outputs = {"reward curve": "reward_curve", "checkpoint": "checkpoint", "model": "model", "metrics": "metrics"}
    rows = [
        (f"{name} {label}" if name else label, str(stage[key]))
        for name, stage in stages.items()
        for label, key in outputs.items()
        if stage.get(key)
    ]
    if report.get("best_candidate") is not None:
        rows.append(("best prompt", f"candidate {report['best_candidate']} (score {shown(report.get('best_score'))})"))
    rows.append(("store", store))
    width = max(len(label) for label, _ in rows) + 2  # "grpo reward curve: " lines up with "store: "
    lines += [f"{label + ':':<{width}}{value}" for label, value in rows]
    return "\n".join(lines)
