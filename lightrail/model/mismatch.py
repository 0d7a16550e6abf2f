"""Train–inference mismatch: how far the logprobs the sampler recorded are from the trainer's own for the same tokens,
measured on every row of a GRPO step, summarised per policy version and per agent, and enforced.

Where the numbers come from: `PolicyUpdater.step` runs each row through the model once, before its optimizer step,
so its logprobs are those of the weights the engine was synced to; the per-token k3 estimate of KL(sampler ||
trainer) (`lightrail.model._loss.mismatch_kl`) is averaged per row into a `RowMismatch`
(`PolicyUpdater.last_mismatch`), at no extra forward pass. Rows whose advantages are all zero are not run (they carry
no gradient) and so are not measured.

What it catches:

* a weight sync that did not take: the engine reports the new version but still samples from the previous weights,
  so the next step's rows (stamped with the new version) diverge by the size of the last update; `stop_cause` names
  it. An engine whose version did not advance at all is caught at once by `unserved_cause`. A sync that did not take
  after an update smaller than ``stop`` (in KL) passes unnoticed: the threshold is the detection limit.
* rows whose tokens are not the ones the sampler saw (a prompt re-rendered by a changed chat template, another
  tokenizer): the recorded logprobs were conditioned on another context; their rows are flagged (`summarize`).
* numerics: float32 on both sides gives ~1e-9 per token (`bench/mismatch.py`); a bfloat16 engine is orders of
  magnitude above that, which is why the thresholds are settings.

Pure functions over `RowMismatch` lists; no torch (imported by the updater, not the other way round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightrail.types import TrainingRow

__all__ = ["MismatchError", "RowMismatch", "stop_cause", "summarize", "unserved_cause"]

FLAGGED_EXAMPLES = 5
"""Rollout ids of flagged rows kept in a step's metrics (the worst first)."""


class MismatchError(RuntimeError):
    """A training run stopped because the sampler and the trainer disagree; the message is the one-line cause."""


@dataclass(frozen=True)
class RowMismatch:
    """The train–inference mismatch of one row: the mean (``kl``) and largest (``kl_max``) per-token k3 KL over its
    ``tokens`` response tokens."""

    row: TrainingRow
    kl: float
    kl_max: float
    tokens: int

    @property
    def agent(self) -> str:
        """The agent whose call(s) the row holds (``metadata["agent_name"]``), ``"-"`` when unnamed."""
        return str(self.row.metadata.get("agent_name") or "-")


def _stats(rows: Sequence[RowMismatch], flag: float) -> dict[str, Any]:
    tokens = sum(m.tokens for m in rows)
    return {
        "kl_mean": sum(m.kl * m.tokens for m in rows) / max(tokens, 1),
        "kl_max": max((m.kl for m in rows), default=0.0),
        "rows": len(rows),
        "flagged": sum(1 for m in rows if m.kl > flag),
    }


def _grouped(rows: Sequence[RowMismatch], key: Callable[[RowMismatch], str], flag: float) -> dict[str, Any]:
    groups: dict[str, list[RowMismatch]] = {}
    for m in rows:
        groups.setdefault(key(m), []).append(m)
    return {name: _stats(group, flag) for name, group in sorted(groups.items())}


def summarize(measured: Sequence[RowMismatch], flag: float) -> dict[str, Any]:
    """A step's mismatch metrics: ``mismatch_kl_mean`` (token mean), ``mismatch_kl_max`` (the worst row's mean),
    ``mismatch_rows`` (rows measured), ``mismatch_rows_flagged`` (rows whose mean exceeds ``flag``),
    ``mismatch_flagged`` (rollout ids of up to `FLAGGED_EXAMPLES` flagged rows, worst first) and the same statistics
    per policy version (``mismatch_by_version``, keyed by the version as a string, ``"-"`` when unknown) and per
    agent (``mismatch_by_agent``) as nested dicts.

        >>> from lightrail.types import TrainingRow
        >>> row = TrainingRow(input_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0, -1], advantages=[0, 1])
        >>> summarize([RowMismatch(row, kl=0.2, kl_max=0.2, tokens=1)], flag=0.05)["mismatch_rows_flagged"]
        1
    """
    total = _stats(measured, flag)
    worst = sorted((m for m in measured if m.kl > flag), key=lambda m: -m.kl)
    return {
        "mismatch_kl_mean": total["kl_mean"],
        "mismatch_kl_max": total["kl_max"],
        "mismatch_rows": total["rows"],
        "mismatch_rows_flagged": total["flagged"],
        "mismatch_flagged": [m.row.rollout_id for m in worst[:FLAGGED_EXAMPLES]],
        "mismatch_by_version": _grouped(measured, _version, flag),
        "mismatch_by_agent": _grouped(measured, lambda m: m.agent, flag),
    }


def _version(m: RowMismatch) -> str:
    return "-" if m.row.policy_version is None else str(m.row.policy_version)


def stop_cause(measured: Sequence[RowMismatch], stop: float | None, *, synced: int | None) -> str | None:
    """Why a run must stop, in one line, or None: the rows of some policy version diverge from the trainer by more
    than ``stop`` (token mean). ``synced`` is the version the run last synced the engine to (None before its first
    update): rows of that version diverging mean the sync did not take; before any update, that the sampler and the
    trainer do not run the same model on the same tokens."""
    if stop is None:
        return None
    for version, stats in _grouped(measured, _version, stop).items():
        kl = stats["kl_mean"]
        if kl <= stop:
            continue
        where = f"train–inference mismatch KL {kl:.3g} > mismatch_stop {stop:g} on {stats['rows']} rows of policy "
        if synced is not None and version == str(synced):
            return (
                f"{where}version {version}, synced after the last update: the weight sync did not take (the engine "
                "still samples from other weights)"
            )
        if synced is None:
            return (
                f"{where}version {version}, before any update: the sampler and the trainer disagree on the same "
                "weights (chat template, tokenizer or dtype)"
            )
        return f"{where}version {version} (last synced: {synced}): the sampler and the trainer disagree"
    return None


def unserved_cause(served: int, version: int) -> str | None:
    """The one-line cause when the engine serves ``served`` after a sync to ``version``, else None."""
    if served == version:
        return None
    return (
        f"the rollout engine still serves policy version {served} after update {version}: the weight sync did not take"
    )
