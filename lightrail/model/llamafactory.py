"""LLaMA-Factory as an SFT backend: the rows `SFT` builds from traces, exported in LLaMA-Factory's dataset format,
and trained by LLaMA-Factory's own trainer in its own Python environment.

LLaMA-Factory pins older transformers, peft, accelerate and datasets than lightrail, so it lives in a venv of its
own (``scripts/_env_llamafactory.sh`` builds ``.venv-llamafactory`` with the versions of
``constraints-llamafactory.txt``) and runs as a child process of that venv's interpreter; nothing here imports it.

What one run writes under its folder (``<sft out_dir>/llamafactory``):

* ``lightrail_sft.json`` + ``dataset_info.json``: the kept calls as a LLaMA-Factory ``sharegpt`` dataset with
  OpenAI-style role tags and a ``tools`` column (`sharegpt_sample`). One sample per trained call: its request's
  messages and the answer; **the trained turn is the last assistant turn** (train it with ``mask_history: true``,
  as ``train.yaml`` says), every earlier turn is context. Portable: train it with any LLaMA-Factory template.
* ``rows.jsonl``: the same calls as lightrail's own `TrainingRow`s (``input_ids``; ``labels`` = the id where
  ``loss_mask`` is 1, else -100), rendered with the student's chat template and tool format, the ones its engine
  serves and parses. LLaMA-Factory's templates do not know every model's (lightrail's own tiny models list tools
  in a compact form of their own), so the run trains on these rows: ``_llamafactory_entry.py`` saves them as
  LLaMA-Factory's tokenized dataset (``tokenized_path``), which its loader reads in place of the JSON one. `SFT`
  writes them in training order, one line per trained row (``steps`` × ``batch_size`` lines: the batches lightrail's
  own steps would draw from the run's seeded shuffle), and LLaMA-Factory reads them in sequence
  (``disable_shuffling``), so a run with either backend sees the same batches in the same order.
* ``train.yaml``: LLaMA-Factory's arguments (full fine-tuning; lightrail's steps, batch size and optimizer
  settings mapped onto them; ``sft.llamafactory.args`` overrides any), ``train.log`` (its output) and ``output/``
  (the model it saved: a Hugging Face folder, loaded back into `SFT`'s updater, so the result is a lightrail
  checkpoint and model like any other SFT run's).

Concurrency model: blocking file writes and one child process; `train` awaits the process without blocking the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from lightrail.adapters import ChatSample
from lightrail.types import TrainingRow, content_text

__all__ = ["LlamaFactorySettings", "read_train_log", "sharegpt_sample", "train", "write_dataset"]

DATASET = "lightrail_sft"
"""The dataset's name in ``dataset_info.json`` (its file is ``lightrail_sft.json``)."""

#: ``dataset_info.json``'s entry for the export: sharegpt with OpenAI-style role tags, a system and a tools column.
DATASET_INFO = {
    DATASET: {
        "file_name": f"{DATASET}.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "system": "system", "tools": "tools"},
        "tags": {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "observation_tag": "tool",
            "function_tag": "function_call",
            "system_tag": "system",
        },
    }
}

IGNORE_INDEX = -100
"""LLaMA-Factory's (and Hugging Face's) label of a token that is not trained."""

_ENTRY = Path(__file__).with_name("_llamafactory_entry.py")
_PYTHON_ENV = "LIGHTRAIL_LLAMAFACTORY_PYTHON"


class LlamaFactorySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How `SFT` runs LLaMA-Factory (``sft.llamafactory`` in a config)."""

    python: str | None = None
    """The interpreter of the venv LLaMA-Factory is installed in (null: ``$LIGHTRAIL_LLAMAFACTORY_PYTHON``, which
    ``scripts/_env_llamafactory.sh`` sets when it builds ``.venv-llamafactory``)."""
    template: str = "empty"
    """The LLaMA-Factory chat template written into ``train.yaml`` (unused by the run, which trains the tokenized
    rows; it matters to whoever trains the exported JSON dataset with LLaMA-Factory directly)."""
    args: dict[str, Any] = {}
    """More LLaMA-Factory arguments, over the ones lightrail derives (e.g. ``{lr_scheduler_type: cosine}``)."""

    def interpreter(self) -> str:
        """The configured interpreter; a one-line `FileNotFoundError` when there is none."""
        python = self.python or os.environ.get(_PYTHON_ENV)
        if not python:
            raise FileNotFoundError(
                "sft backend llamafactory: no LLaMA-Factory environment; build one with "
                f"`bash scripts/_env_llamafactory.sh` and set sft.llamafactory.python (or ${_PYTHON_ENV}) to its python"
            )
        if not Path(python).is_file():
            raise FileNotFoundError(f"sft backend llamafactory: {python} (sft.llamafactory.python) does not exist")
        return python


# -- export --------------------------------------------------------------------------------------------------------


def sharegpt_sample(sample: ChatSample) -> dict[str, Any] | None:
    """One recorded call as a LLaMA-Factory sharegpt sample (the tags of `DATASET_INFO`): a leading system message
    in ``system``, tool calls as ``function_call`` turns (``{"name", "arguments"}``, a list for parallel calls),
    tool results as ``tool`` turns, the tools offered as JSON in ``tools``. The call's answer is the last turn, the
    trained one.

    LLaMA-Factory wants user-side and assistant-side turns to alternate, starting with the user's: consecutive
    messages of one side are joined with a blank line (parallel tool results, several user messages), and an
    assistant message that carries both text and tool calls keeps its calls (the text is dropped: its
    ``function_call`` turns hold calls only). None when the call has no user-side message before its answer.

    >>> s = ChatSample(rollout_id="r", attempt_id="a", turn=0, choice=0, messages=[
    ...     {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}])
    >>> sharegpt_sample(s)["messages"]
    [{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}]
    """
    messages = list(sample.messages)
    system = None
    if messages and messages[0].get("role") in ("system", "developer"):
        system = content_text(messages[0].get("content"))
        messages = messages[1:]
    turns: list[dict[str, str]] = []
    for message in messages:
        role, text = _turn(message)
        user_side = role in ("user", "tool")
        if turns and (turns[-1]["role"] in ("user", "tool")) == user_side:
            if user_side:  # a result after a user message, or the reverse: one turn of the later role's kind
                turns[-1] = {"role": role, "content": f"{turns[-1]['content']}\n\n{text}"}
                continue
            turns.pop()  # two assistant turns in a row: only the later one is answerable from the context
        turns.append({"role": role, "content": text})
    if len(turns) < 2 or turns[0]["role"] not in ("user", "tool") or turns[-1]["role"] in ("user", "tool"):
        return None
    out: dict[str, Any] = {"messages": turns}
    if system:
        out["system"] = system
    if sample.tools:
        out["tools"] = json.dumps([tool.get("function", tool) for tool in sample.tools])
    return out


def _turn(message: dict[str, Any]) -> tuple[str, str]:
    role = message.get("role")
    if role == "assistant" and message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            fn = call.get("function") or call
            arguments = fn.get("arguments") or {}
            if isinstance(arguments, str):
                with contextlib.suppress(json.JSONDecodeError):  # else as the model wrote it
                    arguments = json.loads(arguments) if arguments.strip() else {}
            calls.append({"name": fn.get("name"), "arguments": arguments})
        return "function_call", json.dumps(calls[0] if len(calls) == 1 else calls)
    if role == "assistant":
        return "assistant", content_text(message.get("content"))
    if role == "tool":
        return "tool", content_text(message.get("content"))
    return "user", content_text(message.get("content"))  # user, and any other role the agent sent


def write_dataset(folder: str | os.PathLike, samples: Iterable[ChatSample], rows: Sequence[TrainingRow]) -> dict:
    """Write the export into ``folder``: ``lightrail_sft.json`` and ``dataset_info.json`` (the ``samples``, one per
    trained call) and ``rows.jsonl`` (the ``rows``); returns counts (``samples``, ``skipped_samples``, ``rows``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    exported, skipped = [], 0
    for sample in samples:
        converted = sharegpt_sample(sample)
        if converted is None:
            skipped += 1
        else:
            exported.append(converted)
    (folder / f"{DATASET}.json").write_text(json.dumps(exported, ensure_ascii=False, indent=1))
    (folder / "dataset_info.json").write_text(json.dumps(DATASET_INFO, indent=2))
    with open(folder / "rows.jsonl", "w") as out:
        for row in rows:
            labels = [t if m else IGNORE_INDEX for t, m in zip(row.input_ids, row.loss_mask, strict=True)]
            out.write(json.dumps({"input_ids": row.input_ids, "labels": labels}) + "\n")
    return {"samples": len(exported), "skipped_samples": skipped, "rows": len(rows)}


# -- the run -------------------------------------------------------------------------------------------------------


def train_arguments(
    folder: Path,
    model: str | os.PathLike,
    *,
    steps: int,
    batch_size: int,
    config: Any,
    max_len: int,
    settings: LlamaFactorySettings,
) -> dict[str, Any]:
    """LLaMA-Factory's arguments for a full fine-tune of ``model`` on the rows in ``folder``: ``steps`` optimizer
    steps of ``batch_size`` rows, with the learning rate, warm-up, linear decay (when ``config.decay_steps``),
    betas, weight decay, gradient clipping, bfloat16 autocast and seed of ``config`` (a `UpdateConfig`)."""
    args: dict[str, Any] = {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "disable_gradient_checkpointing": True,  # LLaMA-Factory's default recomputes activations; lightrail's does not
        "dataset": DATASET,
        "dataset_dir": str(folder),
        "template": settings.template,
        "mask_history": True,
        "tokenized_path": str(folder / "tokenized"),
        "cutoff_len": max_len,
        "output_dir": str(folder / "output"),
        "overwrite_output_dir": True,
        "per_device_train_batch_size": batch_size,
        "gradient_accumulation_steps": 1,
        "max_steps": steps,
        "learning_rate": config.lr,
        "lr_scheduler_type": "linear" if config.decay_steps else "constant_with_warmup",
        "warmup_steps": config.warmup_steps,
        "weight_decay": config.weight_decay,
        "adam_beta1": config.betas[0],
        "adam_beta2": config.betas[1],
        "max_grad_norm": config.max_grad_norm if config.max_grad_norm is not None else 0.0,
        "bf16": config.autocast == "bfloat16",
        "use_cpu": config.device == "cpu",
        "seed": config.seed,
        "disable_shuffling": True,  # the rows come in the order lightrail's steps would draw them
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "dataloader_num_workers": 0,
        "preprocessing_num_workers": None,
    }
    return {**args, **settings.args}


async def train(python: str, folder: Path, arguments: dict[str, Any]) -> Path:
    """Run LLaMA-Factory's trainer with ``python`` on ``arguments`` (written to ``folder/train.yaml``); returns the
    folder of the model it saved. Its output goes to ``folder/train.log``; a failed run raises `RuntimeError` with
    the log's last lines."""
    config = folder / "train.yaml"
    config.write_text(json.dumps(arguments, indent=2))  # JSON is YAML
    log = folder / "train.log"
    env = dict(os.environ)
    env.setdefault("DISABLE_VERSION_CHECK", "1")
    with open(log, "wb") as out:
        # -P: the entry's own folder stays off sys.path, where this module would shadow the llamafactory package.
        process = await asyncio.create_subprocess_exec(
            python, "-P", str(_ENTRY), str(config), str(folder / "rows.jsonl"), stdout=out, stderr=asyncio.subprocess.STDOUT,
            env=env, cwd=str(folder),
        )  # fmt: skip
        try:
            code = await process.wait()
        except BaseException:  # cancelled: the child goes with the run
            process.kill()
            await process.wait()
            raise
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"LLaMA-Factory exited with {code} (log: {log}):\n{tail}")
    return Path(arguments["output_dir"])


def read_train_log(output: Path) -> list[dict[str, Any]]:
    """LLaMA-Factory's per-step records (``trainer_log.jsonl``: ``current_steps``, ``loss``, ``lr``, ...)."""
    path = output / "trainer_log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
