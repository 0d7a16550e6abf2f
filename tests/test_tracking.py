"""Experiment tracking: a real `lightrail train` run mirrored into TensorBoard, MLflow (SQLite backend, the real
``mlflow`` client reading it back) and Weights & Biases (offline: its run file read back record by record), each
holding what ``metrics.jsonl`` holds; a failing tracker is dropped without stopping anything."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest

from lightrail.cli import main
from lightrail.tracking import LoggerSettings, Trackers, _flat, open_trackers

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
name: calc-tracked
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
data_args: {n_train: 8, n_val: 2, seed: 1}
model: tiny
trainer: {n_runners: 1, concurrency: 4, loggers: [tensorboard, mlflow, {kind: wandb, mode: offline}]}
grpo:
  steps: 2
  tasks_per_step: 2
  n_samples: 2
  val_every: 0
  sampling: {temperature: 1.0, max_tokens: 6}
  val_sampling: {temperature: 0.0, max_tokens: 6}
  config: {lr: 1.0e-3}
"""


def _wandb_records(path: Path):
    """The records of an offline W&B run file: its 7-byte header, then LevelDB-log framed protobuf `Record`s (32 KiB
    blocks; each chunk: CRC (4), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last))."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def _items(items) -> dict:
    """W&B's key/value items as a dict (a key with a slash is stored as ``nested_key`` parts)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_a_training_run_is_mirrored_into_tensorboard_mlflow_and_wandb(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs lightrail[mlflow]")
    pytest.importorskip("wandb", reason="needs lightrail[wandb]")
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(ROOT)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(CONFIG))
    run = tmp_path / "run"
    assert main(["train", str(path), "--out", str(run)]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in lines if m["kind"] == "train"]
    report = json.loads((run / "report.json").read_text())
    assert [m["step"] for m in train] == [1, 2]

    # TensorBoard: every train line's reward at its step
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tb = [(e.step, e.value) for e in events.Scalars("train/reward_mean")]
    assert tb == [(m["step"], pytest.approx(m["reward_mean"])) for m in train]

    # MLflow: one finished run in the config's experiment, the same metric history, the config, the report
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("calc-tracked")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED" and found.info.run_name == "run"
    history = client.get_metric_history(found.info.run_id, "train/reward_mean")
    assert [(h.step, h.value) for h in history] == [(m["step"], pytest.approx(m["reward_mean"])) for m in train]
    params = found.data.params
    assert params["agent"] == "examples.calculator.train:calculator_agent" and params["grpo.steps"] == "2"
    assert found.data.tags["checkpoint"] == report["checkpoint"]
    assert found.data.metrics["report/val_after"] == pytest.approx(report["val_after"])
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"config.json", "reward_curve.png"} <= artifacts
    assert Path(experiment.artifact_location.removeprefix("file://")).is_relative_to(run)  # not the cwd's mlruns

    # W&B offline: the run file holds the config, each train line against its own step, the report in the summary
    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    rows, summary, config = [], {}, {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
        elif kind == "config":
            config.update(_items(record.config.update))
        elif kind == "run":
            config.update(_items(record.run.config.update))
    wandb_train = [(r["train/step"], r["train/reward_mean"]) for r in rows if "train/reward_mean" in r]
    assert wandb_train == [(m["step"], pytest.approx(m["reward_mean"])) for m in train]
    assert config["agent"] == "examples.calculator.train:calculator_agent" and config["grpo"]["steps"] == 2
    assert summary["report/val_after"] == pytest.approx(report["val_after"])


class Broken:
    """A tracker whose backend went away (our own protocol's implementation, not a stand-in for a library)."""

    def __init__(self):
        self.calls = 0

    def start(self, config):
        pass

    def log(self, metrics, step):
        self.calls += 1
        raise ConnectionError("tracking server gone")

    def finish(self, report, failed):
        raise AssertionError("a dropped tracker is not called again")


class Kept:
    def __init__(self):
        self.seen, self.finished = [], None

    def start(self, config):
        self.seen.append(("config", dict(config)))

    def log(self, metrics, step):
        self.seen.append((step, dict(metrics)))

    def finish(self, report, failed):
        self.finished = (report, failed)


def test_a_failing_tracker_is_dropped_and_the_others_get_everything_in_order(caplog):
    broken, kept = Broken(), Kept()
    trackers = Trackers([("broken", broken), ("kept", kept)])
    trackers.start({"name": "x"})
    with caplog.at_level(logging.WARNING, logger="lightrail.tracking"):
        for step in range(1, 4):
            trackers.log({"kind": "train", "step": step, "reward_mean": step / 10, "note": "text"})
        trackers.finish({"val_after": 0.5})
    assert broken.calls == 1  # dropped after its first failure
    assert kept.seen == [("config", {"name": "x"})] + [(s, {"train/reward_mean": s / 10}) for s in range(1, 4)]
    assert kept.finished == ({"val_after": 0.5}, False)
    assert [r.message for r in caplog.records] == [
        "experiment tracker broken failed in log and is dropped: tracking server gone"
    ]


def test_records_become_prefixed_numbers_at_their_step():
    record = {"kind": "train", "step": 3, "loss": 0.5, "n": 2, "ok": True, "nan": float("nan"), "tag": "x"}
    assert _flat(record) == ({"train/loss": 0.5, "train/n": 2.0}, 3)
    assert _flat({"kind": "round", "round": 2, "best_score": 1.0}) == ({"round/best_score": 1.0}, 2)
    assert _flat({"stage": "sft", "kind": "train", "step": 1, "loss": 1.0}) == ({"sft/train/loss": 1.0}, 1)


def test_an_unknown_logger_is_refused_before_anything_opens(tmp_path):
    with pytest.raises(ValueError, match="unknown logger 'tensorbord'; choose from tensorboard, mlflow, wandb"):
        open_trackers(["tensorbord"], tmp_path, run_name="r", experiment=None)
    with pytest.raises(ValueError, match="unknown logger"):
        open_trackers([LoggerSettings(kind="nope")], tmp_path, run_name="r", experiment=None)  # type: ignore[arg-type]
