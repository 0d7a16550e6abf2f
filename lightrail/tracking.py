"""Experiment tracking: every record a training run writes to its ``metrics.jsonl`` (a step, a validation, an APO
round), mirrored to TensorBoard, MLflow or Weights & Biases, with the run's config at the start and its report at
the end (validation before/after, the final checkpoint's path, the reward curve's image).

``metrics.jsonl`` stays the record a run resumes from; the trackers are views of it. A tracker that fails (a
tracking server gone) is reported once and dropped: training goes on, nothing in the run folder is lost.

Choose them in a config (``trainer: {loggers: [tensorboard, mlflow]}``) or with `Trainer(loggers=...)`; each is a
name or a `LoggerSettings`::

    trainer:
      loggers:
        - tensorboard                                  # <run dir>/tb
        - mlflow                                       # sqlite:///<run dir>/mlflow.db, artifacts in <run dir>/mlruns
        - {kind: mlflow, tracking_uri: http://mlflow:5000, experiment: sql-agent}
        - {kind: wandb, mode: offline}                 # <run dir>/wandb; `wandb sync` uploads it later

Keys are ``{kind}/{metric}`` (``train/reward_mean``, ``val/val_success``), prefixed with the stage in a chained run
(``sft/train/loss``). The step is the record's ``step`` (APO: its ``round``). Each backend is an optional extra
(``lightrail[mlflow]``, ``lightrail[wandb]``; TensorBoard comes with ``lightrail[train]``), imported only when chosen.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

import msgspec

__all__ = ["LOGGER_KINDS", "LoggerSettings", "Tracker", "Trackers", "open_trackers"]

log = logging.getLogger(__name__)

LoggerKind = Literal["tensorboard", "mlflow", "wandb"]
LOGGER_KINDS: tuple[str, ...] = get_args(LoggerKind)


class LoggerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One experiment tracker."""

    kind: LoggerKind
    """``tensorboard``, ``mlflow`` or ``wandb``."""
    tracking_uri: str | None = None
    """MLflow: where runs are recorded (default ``sqlite:///<run dir>/mlflow.db``; a server's URL works too)."""
    experiment: str | None = None
    """MLflow experiment / W&B project (default: the config's ``name``, else ``lightrail``)."""
    mode: Literal["offline", "online"] = "offline"
    """W&B: ``offline`` writes under ``<run dir>/wandb`` (no account, no network; ``wandb sync`` uploads it);
    ``online`` needs ``WANDB_API_KEY``."""
    entity: str | None = None
    """W&B team or user (online mode)."""


class Tracker(Protocol):
    """What the trainer calls; an implementation mirrors records into one tracking backend."""

    def start(self, config: Mapping[str, Any]) -> None: ...

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def finish(self, report: Mapping[str, Any] | None, failed: bool) -> None: ...


def _flat(record: Mapping[str, Any]) -> tuple[dict[str, float], int]:
    """A metrics record as ``{kind}/{key}`` numbers and its step (non-numbers, bools and NaN/inf left out)."""
    prefix = "/".join(str(record[k]) for k in ("stage", "kind") if record.get(k) is not None)
    step = record.get("step", record.get("round", 0))
    step = step if isinstance(step, int) and not isinstance(step, bool) else 0
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "round", "kind", "stage") or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[f"{prefix}/{key}" if prefix else key] = float(value)
    return out, step


def _params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as flat ``a.b.c`` parameters (MLflow's params are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


class TensorBoardTracker:
    """Scalars in ``<run dir>/tb`` (``tensorboard --logdir <run dir>/tb``); the config and the report as text."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out_dir / "tb"))

    def start(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", f"```\n{json.dumps(dict(config), indent=2, default=str)}\n```", 0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, report: Mapping[str, Any] | None, failed: bool) -> None:
        if report is not None:
            self.writer.add_text("report", f"```\n{json.dumps(dict(report), indent=2, default=str)}\n```", 0)
        self.writer.close()


class MLflowTracker:
    """One MLflow run (through `mlflow.MlflowClient`, never the global active run of the user's process): the
    config as flat params and ``config.json``, metrics per step, the report as final metrics and tags (``checkpoint``,
    ``out_dir``), the reward curve's PNG as an artifact; status FINISHED, or FAILED when training raised."""

    def __init__(self, settings: LoggerSettings, out_dir: Path, run_name: str, experiment: str) -> None:
        from mlflow import MlflowClient

        uri = settings.tracking_uri or f"sqlite:///{(out_dir / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:  # artifacts of a local experiment next to its database, not in the process's working directory
            local = uri.startswith("sqlite:") or uri.startswith("file:")
            location = (out_dir / "mlruns").resolve().as_uri() if local else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        self.run_id = self.client.create_run(
            experiment_id, run_name=run_name, tags={"lightrail.out_dir": str(out_dir.resolve())}
        ).info.run_id
        self.out_dir = out_dir

    def start(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k[:250], v[:6000]) for k, v in _params(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.client.log_dict(self.run_id, dict(config), "config.json")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, report: Mapping[str, Any] | None, failed: bool) -> None:
        if report is not None:
            from mlflow.entities import Metric, RunTag

            now = int(time.time() * 1000)
            numbers, _ = _flat({k: v for k, v in report.items() if not isinstance(v, Mapping)})
            tags = [RunTag(k, str(report[k])) for k in ("checkpoint", "best_prompt", "output_model") if k in report]
            self.client.log_batch(
                self.run_id, metrics=[Metric(f"report/{k}", v, now, 0) for k, v in numbers.items()], tags=tags
            )
            curve = report.get("reward_curve")
            if curve and Path(curve).is_file():
                self.client.log_artifact(self.run_id, curve)
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class WandbTracker:
    """One W&B run (offline by default, under ``<run dir>/wandb``): the config, metrics with each record's own step
    as the x axis (``{kind}/step``: steps of a resumed or chained run may repeat, which W&B's own step refuses), the
    report in the run summary, the reward curve's PNG saved with the run."""

    def __init__(self, settings: LoggerSettings, out_dir: Path, run_name: str, experiment: str) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.out_dir = out_dir
        self.run = wandb.init(
            project=experiment, entity=settings.entity, name=run_name, dir=str(out_dir), mode=settings.mode,
            reinit="create_new",
        )  # fmt: skip
        self._axes: set[str] = set()

    def start(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        by_axis: dict[str, dict[str, float]] = {}
        for key, value in metrics.items():
            axis = f"{key.rsplit('/', 1)[0]}/step" if "/" in key else "step"
            by_axis.setdefault(axis, {})[key] = value
        for axis, values in by_axis.items():
            if axis not in self._axes:
                self.run.define_metric(axis)
                self.run.define_metric(f"{axis.removesuffix('step')}*", step_metric=axis)
                self._axes.add(axis)
            self.run.log({**values, axis: step})

    def finish(self, report: Mapping[str, Any] | None, failed: bool) -> None:
        if report is not None:
            self.run.summary.update({f"report/{k}": v for k, v in report.items() if not isinstance(v, Mapping)})
            curve = report.get("reward_curve")
            if curve and Path(curve).is_file():
                self.run.save(str(curve), base_path=str(Path(curve).parent), policy="now")
        self.run.finish(exit_code=1 if failed else 0)


class Trackers:
    """The trackers of one run, fed from one background thread (a slow tracking server never stalls the trainer's
    event loop, which serves the gateway): each metrics record goes to all of them, in order; a tracker that raises
    is reported once and dropped (training goes on; ``metrics.jsonl`` has everything). `finish` waits until
    everything queued has been written."""

    def __init__(self, trackers: Sequence[tuple[str, Tracker]] = ()) -> None:
        self.trackers = list(trackers)
        self._queue: queue.SimpleQueue[tuple[str, Callable[[Tracker], None]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if self.trackers:
            self._thread = threading.Thread(target=self._drain, name="lightrail-trackers", daemon=True)
            self._thread.start()

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            what, call = item
            for name, tracker in list(self.trackers):
                try:
                    call(tracker)
                except Exception as exc:  # noqa: BLE001 - a tracking backend must not stop training
                    log.warning("experiment tracker %s failed in %s and is dropped: %s", name, what, exc)
                    self.trackers.remove((name, tracker))

    def _submit(self, what: str, call: Callable[[Tracker], None]) -> None:
        if self._thread is not None:
            self._queue.put((what, call))

    def start(self, config: Mapping[str, Any]) -> None:
        self._submit("start", lambda t: t.start(config))

    def log(self, record: Mapping[str, Any]) -> None:
        """Mirror one ``metrics.jsonl`` record (``kind``, ``step`` or ``round``, numbers)."""
        metrics, step = _flat(record)
        if metrics:
            self._submit("log", lambda t: t.log(metrics, step))

    def finish(self, report: Mapping[str, Any] | None, *, failed: bool = False) -> None:
        """Close every tracker with the run's report (None when it failed before having one) and wait for them."""
        if self._thread is None:
            return
        self._submit("finish", lambda t: t.finish(report, failed))
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        self.trackers.clear()


def open_trackers(
    loggers: Sequence[str | LoggerSettings], out_dir: str | os.PathLike[str], *, run_name: str, experiment: str | None
) -> Trackers:
    """The trackers ``loggers`` names, writing under ``out_dir``. An unknown name is a `ValueError`; a backend
    whose package is missing is an `ImportError` naming the extra to install (before any rollout runs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    opened: list[tuple[str, Tracker]] = []
    try:
        for item in loggers:
            kind = item if isinstance(item, str) else item.kind
            if kind not in LOGGER_KINDS:
                raise ValueError(f"unknown logger {kind!r}; choose from {', '.join(LOGGER_KINDS)}")
            settings = LoggerSettings(kind=cast(LoggerKind, kind)) if isinstance(item, str) else item
            opened.append((settings.kind, _open(settings, out, run_name, experiment or "lightrail")))
    except BaseException:
        Trackers(opened).finish(None, failed=True)
        raise
    return Trackers(opened)


_EXTRA = {"tensorboard": "train", "mlflow": "mlflow", "wandb": "wandb"}


def _open(settings: LoggerSettings, out: Path, run_name: str, experiment: str) -> Tracker:
    try:
        if settings.kind == "tensorboard":
            return TensorBoardTracker(out)
        if settings.kind == "mlflow":
            return MLflowTracker(settings, out, run_name, settings.experiment or experiment)
        return WandbTracker(settings, out, run_name, settings.experiment or experiment)
    except ImportError as exc:
        raise ImportError(
            f"the {settings.kind} logger needs its package: pip install 'lightrail[{_EXTRA[settings.kind]}]' ({exc})"
        ) from exc
