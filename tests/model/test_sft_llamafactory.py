"""LLaMA-Factory as an SFT backend, with the real LLaMA-Factory in its own environment (built by
``scripts/_env_llamafactory.sh`` when ``$LIGHTRAIL_LLAMAFACTORY_PYTHON`` does not name one): its own dataset loader
reads the export (tools, tool calls and results, the trained turn), and a short distillation trains through its
trainer into a lightrail model that serves and validates like lightrail's own SFT's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.sft_backends import llamafactory_python as bench_llamafactory_python
from lightrail import MemoryStore, Trainer
from lightrail.adapters import ChatSample
from lightrail.algorithms import SFT, LoraSettings, UpdateConfig
from lightrail.algorithms.run.folder import RunFolder
from lightrail.model.llamafactory import LlamaFactorySettings, sharegpt_sample, write_dataset
from lightrail.types import TrainingRow

REPO = Path(__file__).resolve().parents[2]
AGENT = "examples.calculator.train:calculator_agent"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def llamafactory_python() -> str:
    """LLaMA-Factory's interpreter: the environment's variable, else the venv the script builds (a build that
    fails fails the test: the backend is part of the product)."""
    return bench_llamafactory_python()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from rich.console import Console

    from examples.calculator.data import make_splits
    from examples.calculator.demo import DemoSettings, build_model

    train, _ = make_splits(60, 0, seed=3)
    settings = DemoSettings(model="tiny", out=tmp_path_factory.mktemp("model"))
    return build_model(settings, train, Console(quiet=True))


def _samples() -> list[ChatSample]:
    system = {"role": "system", "content": "Use the calculator."}
    user = {"role": "user", "content": "What is 12*3+1?"}
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "12*3+1"}'},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "c0", "content": "37"}
    answer = {"role": "assistant", "content": "Answer: 37"}
    common = {"rollout_id": "r1", "attempt_id": "a1", "choice": 0, "tools": TOOLS, "agent_name": "solver"}
    return [
        ChatSample(turn=0, messages=[system, user, call], **common),
        ChatSample(turn=1, messages=[system, user, call, result, answer], **common),
        ChatSample(rollout_id="r2", attempt_id="a2", turn=0, choice=0, messages=[answer]),  # no user turn: skipped
    ]


def test_sharegpt_sample_keeps_tools_calls_results_and_ends_on_the_trained_turn():
    second = sharegpt_sample(_samples()[1])
    assert second is not None
    assert second["system"] == "Use the calculator."
    assert json.loads(second["tools"])[0]["name"] == "calculator"
    assert [t["role"] for t in second["messages"]] == ["user", "function_call", "tool", "assistant"]
    assert json.loads(second["messages"][1]["content"]) == {"name": "calculator", "arguments": {"expression": "12*3+1"}}
    assert second["messages"][-1] == {"role": "assistant", "content": "Answer: 37"}
    assert sharegpt_sample(_samples()[2]) is None


_LOADER = textwrap.dedent(
    """
    import json, sys
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    folder, model, out = sys.argv[1:]
    model_args, data_args, training_args, _, _ = get_train_args(dict(
        model_name_or_path=model, stage="sft", do_train=True, finetuning_type="full", dataset="lightrail_sft",
        dataset_dir=folder, template="qwen", mask_history=True, cutoff_len=512, output_dir=out, report_to="none",
        use_cpu=True, preprocessing_num_workers=None,
    ))
    tokenizer_module = load_tokenizer(model_args)
    tokenizer = tokenizer_module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    data = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    rows = []
    for example in data["train_dataset"]:
        trained = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
        rows.append({"text": tokenizer.decode(example["input_ids"]), "trained": tokenizer.decode(trained)})
    print(json.dumps(rows))
    """
)


def test_llamafactory_loader_reads_the_export_and_trains_only_the_last_turn(llamafactory_python, tiny_model, tmp_path):
    row = TrainingRow(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], old_logprobs=[0.0] * 3, advantages=[0.0, 1.0, 1.0])
    counts = write_dataset(tmp_path / "export", _samples(), [row])
    assert counts == {"samples": 2, "skipped_samples": 1, "rows": 1}
    assert json.loads((tmp_path / "export" / "rows.jsonl").read_text()) == {
        "input_ids": [1, 2, 3],
        "labels": [-100, 2, 3],
    }
    (tmp_path / "loader.py").write_text(_LOADER)
    done = subprocess.run(
        [llamafactory_python, str(tmp_path / "loader.py"), str(tmp_path / "export"), str(tiny_model), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "DISABLE_VERSION_CHECK": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    # the tools are offered in the prompt, the call is the first sample's trained turn (Qwen's hermes markup)
    assert "calculator" in first["text"] and "Use the calculator." in first["text"]
    assert "<tool_call>" in first["trained"] and '"expression": "12*3+1"' in first["trained"]
    # the second sample: the call and its result are context, only the answer is trained
    assert "37" in second["text"] and "<tool_call>" in second["text"]
    assert second["trained"].startswith("Answer: 37") and "<tool_call>" not in second["trained"]


def test_a_missing_llamafactory_environment_is_one_clear_line(tiny_model, tmp_path, monkeypatch):
    monkeypatch.delenv("LIGHTRAIL_LLAMAFACTORY_PYTHON", raising=False)
    with pytest.raises(FileNotFoundError, match="_env_llamafactory.sh") as caught:
        SFT(tiny_model, backend="llamafactory", out_dir=tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SFT(tiny_model, backend="llamafactory", llamafactory=LlamaFactorySettings(python=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="lora"):
        SFT(tiny_model, backend="llamafactory", config=UpdateConfig(lora=LoraSettings()))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sft={backend: llamafactory, llamafactory: {python: /nowhere/python}}", "/nowhere/python"),
        (
            "sft={backend: llamafactory, llamafactory: {pyton: x}}",
            "sft.llamafactory: unknown setting(s) ['pyton']; did you mean 'python'?",
        ),
        ("sft={backend: llamafactory, llamafactory: {args: 3}}", "sft.llamafactory.args: Expected `object`"),
    ],
)
def test_config_llamafactory_errors_name_the_field(tmp_path, override, message):
    from lightrail.trainer.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert message in str(err.value)


def test_config_llamafactory_section_reaches_sft(llamafactory_python, tmp_path):
    from lightrail.trainer.config import _sft_kwargs, load_config

    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\n")
    override = f"sft={{backend: llamafactory, llamafactory: {{python: {llamafactory_python}, args: {{seed: 3}}}}}}"
    kwargs = _sft_kwargs(load_config(path, [override]))
    assert kwargs["section"].backend == "llamafactory"
    assert kwargs["llamafactory"] == LlamaFactorySettings(python=llamafactory_python, args={"seed": 3})


def test_llamafactory_training_ends_with_the_process_that_started_it(llamafactory_python, tiny_model, tmp_path):
    """A trainer SIGKILLed mid-run leaves no LLaMA-Factory training behind: its child sees its parent go."""
    import signal
    import time

    from lightrail.model import llamafactory as lf

    folder = tmp_path / "lf"
    row = TrainingRow(input_ids=[5, 6, 7, 8], loss_mask=[0, 0, 1, 1], old_logprobs=[0.0] * 4, advantages=[1.0] * 4)
    write_dataset(folder, [], [row])
    arguments = lf.train_arguments(
        folder,
        tiny_model,
        steps=100_000,
        batch_size=1,
        config=UpdateConfig(),
        max_len=8,
        settings=LlamaFactorySettings(),
    )
    (folder / "train.yaml").write_text(json.dumps(arguments))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; c = subprocess.Popen(sys.argv[1:]); "
         "print(c.pid, flush=True); time.sleep(600)", llamafactory_python, "-P", str(lf._ENTRY),
         str(folder / "train.yaml"), str(folder / "rows.jsonl")],
        stdout=subprocess.PIPE, text=True, cwd=folder,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 120
    while not (folder / "output" / "trainer_log.jsonl").exists():  # training has started
        assert time.monotonic() < deadline, "LLaMA-Factory did not start training"
        time.sleep(0.5)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "zombie" not in _state(child):
        assert time.monotonic() < deadline, "LLaMA-Factory outlived its parent"
        time.sleep(0.2)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].splitlines()[0].lower()
    except (OSError, IndexError):
        return "zombie"


def test_distillation_through_llamafactory_gives_a_lightrail_model(llamafactory_python, tiny_model, tmp_path):
    """A short SFT through LLaMA-Factory's trainer: the export is written, the loss falls, and the result is a
    lightrail checkpoint and model folder (served for validation, exportable, a GRPO stage's start)."""
    from transformers import AutoModelForCausalLM

    from examples.calculator.data import make_splits
    from examples.calculator.teacher_server import TeacherServer

    train, val = make_splits(6, 3, seed=3)
    train = train[:3]
    with TeacherServer(train + val) as teacher:
        sft = SFT(
            tiny_model, teacher=teacher.llm(), n_samples=3, steps=40, batch_size=8, config=UpdateConfig(lr=5e-3),
            val_sampling={"max_tokens": 48}, out_dir=tmp_path / "sft", checkpoint_every=0, backend="llamafactory",
            llamafactory=LlamaFactorySettings(python=llamafactory_python),
        )  # fmt: skip
        Trainer(n_runners=1, concurrency=8, store=MemoryStore(), algorithm=sft).fit(AGENT, train, val)
    report = sft.report
    folder = tmp_path / "sft" / "llamafactory"
    exported = json.loads((folder / "lightrail_sft.json").read_text())
    assert exported and all(s["messages"][-1]["role"] in ("assistant", "function_call") for s in exported)
    # LLaMA-Factory reads, in sequence, the batches lightrail's own 40 steps would have drawn (the seeded shuffle)
    assert json.loads((folder / "train.yaml").read_text())["disable_shuffling"] is True
    shuffle, n = RunFolder(tmp_path / "replay", "SFT", seed=0), report["rows"]
    drawn = [i for _ in range(40) for i in shuffle.next_indices(8, n)]
    rows = [json.loads(line) for line in (folder / "rows.jsonl").open()]
    assert len(rows) == 40 * min(8, n)
    assert rows == [{"input_ids": sft._rows[i].input_ids, "labels": _labels(sft._rows[i])} for i in drawn]
    lines = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["kind"] == "train"]
    assert [m["step"] for m in steps] == list(range(1, 41)) and steps[0]["backend"] == "llamafactory"
    assert report["loss_last"] < 0.5 * report["loss_first"], report
    assert report["val_after"] is not None
    # the trained weights are LLaMA-Factory's, and lightrail's model folder and checkpoint hold them
    ours = AutoModelForCausalLM.from_pretrained(report["model"]).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(folder / "output").state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    name = "model.layers.0.mlp.down_proj.weight"
    assert ours[name].equal(theirs[name]) and not ours[name].equal(base[name])
    assert (Path(report["checkpoint"]) / "trainable.safetensors").exists()


def test_resuming_a_lightrail_run_part_way_with_the_llamafactory_backend_is_refused(
    llamafactory_python, tiny_model, tmp_path
):
    """A run checkpointed by lightrail's own steps cannot be finished by LLaMA-Factory (it would train every step
    again over the remaining batches): the resume is refused in one line, before any teacher call or training."""
    from examples.calculator.data import make_splits
    from examples.calculator.teacher_server import TeacherServer

    train, val = make_splits(4, 2, seed=5)
    store = str(tmp_path / "store.db")  # shared: the resume reloads the first run's pinned traces from it
    settings = dict(n_samples=2, batch_size=4, val_sampling={"max_tokens": 16}, out_dir=tmp_path / "sft",
                    validate_before=False)  # fmt: skip
    with TeacherServer(train + val) as teacher:
        first = SFT(tiny_model, teacher=teacher.llm(), steps=2, **settings)
        Trainer(n_runners=1, concurrency=4, store=store, algorithm=first).fit(AGENT, train, val)
        assert first.report["steps"] == 2
        again = SFT(tiny_model, teacher=teacher.llm(), steps=4, resume=True, backend="llamafactory",
                    llamafactory=LlamaFactorySettings(python=llamafactory_python), **settings)  # fmt: skip
        with pytest.raises(ValueError, match="resumed at step 2 of 4.*resume with backend lightrail"):
            Trainer(n_runners=1, concurrency=4, store=store, algorithm=again).fit(AGENT, train, val)
    assert not (tmp_path / "sft" / "llamafactory").exists()


def _labels(row: TrainingRow) -> list[int]:
    return [t if m else -100 for t, m in zip(row.input_ids, row.loss_mask, strict=True)]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
