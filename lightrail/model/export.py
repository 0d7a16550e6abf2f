"""Ship a trained policy: turn a training checkpoint into a Hugging Face model folder that other programs serve.

A checkpoint (``<run>/checkpoints/step-N``, written by `PolicyUpdater.save`) holds only what training needs to
resume: the trainable tensors (the full model, or a LoRA adapter), optimizer state and, in ``updater.json``, the
config and the base model it was trained from. `export_checkpoint` rebuilds the policy the engine served from it
and writes one of:

* **full** (full fine-tuning): ``config.json``, ``model.safetensors``, ``generation_config.json``;
* **merged** (LoRA, ``merge=True``): the same, with ``W + (alpha / r) * B @ A`` folded into every adapted layer
  (what ``PolicyUpdater.state_dict_for_serving`` hands the engine);
* **adapter** (LoRA, ``merge=False``): a peft adapter folder (``adapter_config.json`` naming the base model's
  directory in ``base_model_name_or_path``, ``adapter_model.safetensors``) for ``PeftModel.from_pretrained`` or
  ``vllm serve BASE --enable-lora --lora-modules NAME=OUT``;

always with the base model's tokenizer files copied as they are, its chat template both in
``chat_template.jinja`` and in ``tokenizer_config.json`` (older loaders read only the latter), and
``lightrail_export.json`` saying what was exported from where. ``lightrail gateway serve --model OUT`` and
``vllm serve OUT`` serve the full and merged folders as they are; the gateway also serves the adapter folder
(it loads the base model and merges the adapter).

    >>> export_checkpoint("runs/calc", "models/calc-v1", merge=True)     # doctest: +SKIP
    $ lightrail export runs/calc --merge models/calc-v1

The folder is written under a temporary name next to ``out`` and renamed into place when complete, so a reader
never sees half an export; an existing non-empty ``out`` is replaced only with ``force=True``.

Concurrency model: one blocking call, no shared state. It only reads the checkpoint, so it is safe to run while
the training run writes newer ones (those appear by atomic rename and are never modified afterwards).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Literal

__all__ = ["EXPORT_INFO", "ExportError", "export_checkpoint", "find_checkpoint"]

#: The file in an export that records its kind, source checkpoint and base model.
EXPORT_INFO = "lightrail_export.json"

ExportKind = Literal["full", "merged", "adapter"]

_STEP_DIR = re.compile(r"step-(\d+)")
# What a model directory's tokenizer may consist of (fast and slow tokenizers, chat templates old and new).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
# Config keys that must agree between the base model recorded at training time and the one found at export time.
_ARCHITECTURE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "tie_word_embeddings",
)


class ExportError(ValueError):
    """A checkpoint cannot be exported as asked; the message says what is wrong and what to do (one line)."""


def find_checkpoint(run_dir_or_checkpoint: str | os.PathLike, step: int | None = None) -> Path:
    """The checkpoint directory to export: ``run/checkpoints/step-<step>``, the newest one when ``step`` is None,
    or the argument itself when it is a checkpoint directory (one holding ``updater.json``).

    Only complete checkpoints count (``updater.json`` is written inside the atomically renamed directory);
    leftovers of an interrupted save (``.step-N.tmp-*``, ``step-N.old-*``) are ignored.
    """
    path = Path(run_dir_or_checkpoint)
    if not path.is_dir():
        raise ExportError(f"{path} does not exist or is not a directory; give a run directory or a checkpoint")
    if (path / "updater.json").is_file():
        if step is not None and path.name != f"step-{step}":
            raise ExportError(f"{path} is a single checkpoint; --step selects among a run directory's checkpoints")
        return path
    root = path / "checkpoints"
    if not root.is_dir():
        raise ExportError(
            f"{path} is not a run directory (no checkpoints/) nor a checkpoint (no updater.json); "
            "give the GRPO out_dir or one of its checkpoints/step-N"
        )
    steps = _available_steps(root)
    if not steps:
        raise ExportError(f"{root} holds no complete checkpoint yet (GRPO writes one every checkpoint_every steps)")
    if step is None:
        return steps[max(steps)]
    if step not in steps:
        listed = ", ".join(str(s) for s in sorted(steps))
        raise ExportError(f"{root} has no checkpoint for step {step}; available steps: {listed}")
    return steps[step]


def _available_steps(root: Path) -> dict[int, Path]:
    found = {}
    for child in root.iterdir():
        match = _STEP_DIR.fullmatch(child.name)
        if match and (child / "updater.json").is_file():
            found[int(match.group(1))] = child
    return found


def export_checkpoint(
    run_dir_or_checkpoint: str | os.PathLike,
    out: str | os.PathLike,
    *,
    step: int | None = None,
    merge: bool = False,
    force: bool = False,
    base_model: str | os.PathLike | None = None,
) -> Path:
    """Write the policy of a checkpoint as a Hugging Face model folder at ``out``; returns ``out``.

    ``run_dir_or_checkpoint``: a GRPO ``out_dir`` (its newest checkpoint, or ``step``) or a checkpoint directory.
    ``merge``: for a LoRA checkpoint, fold the adapter into the base weights (a full model) instead of writing a
    peft adapter folder; ignored for full fine-tuning. ``force``: replace a non-empty ``out``. ``base_model``:
    the base model's directory, for checkpoints that do not record it (written before lightrail recorded it, or
    trained from a model instance) or whose base model has moved.

    Raises `ExportError` (one line) for a missing run, checkpoint or step, a corrupt checkpoint, a base model that
    is not found or does not match, or an ``out`` that exists. The result is described in ``out/lightrail_export.json``.
    """
    checkpoint = find_checkpoint(run_dir_or_checkpoint, step)
    meta = _read_meta(checkpoint)
    config = _read_config(checkpoint, meta)
    base = _find_base_model(checkpoint, meta, base_model)
    out = Path(out)
    _check_out(out, force, protected=[Path(run_dir_or_checkpoint), checkpoint, base])
    tensors = _read_tensors(checkpoint)
    kind: ExportKind = "full" if config.lora is None else ("merged" if merge else "adapter")
    dtype = (meta.get("base_model") or {}).get("dtype") or config.dtype or "float32"

    from lightrail.model.checkpoint import atomic_directory

    with atomic_directory(out) as tmp:
        model = _load_base(base, dtype)
        if config.lora is None:
            _copy_tensors(dict(model.named_parameters()), tensors, checkpoint)
            model.save_pretrained(tmp)
        else:
            from lightrail.model.updater import PolicyUpdater

            peft_model = PolicyUpdater._wrap_lora(model, config.lora, config.seed)
            _copy_tensors({n: p for n, p in peft_model.named_parameters() if p.requires_grad}, tensors, checkpoint)
            if merge:
                peft_model.merge_and_unload().save_pretrained(tmp)
            else:
                peft_model.save_pretrained(tmp)
                _set_adapter_base(tmp, base)
        _copy_tokenizer(base, tmp)
        info = {
            "kind": kind,
            "checkpoint": str(checkpoint.resolve()),
            "optimizer_steps": meta.get("steps"),
            "base_model": str(base),
            "dtype": dtype,
        }
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return out


# -- reading the checkpoint -----------------------------------------------------------------------------------------


def _read_meta(checkpoint: Path) -> dict[str, Any]:
    from lightrail.model.updater import CHECKPOINT_FORMAT

    try:
        meta = json.loads((checkpoint / "updater.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"corrupt checkpoint {checkpoint}: updater.json is unreadable ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ExportError(
            f"{checkpoint}: unknown checkpoint format {found!r} (this lightrail writes {CHECKPOINT_FORMAT})"
        )
    return meta


def _read_config(checkpoint: Path, meta: dict[str, Any]) -> Any:
    from lightrail.model.updater import UpdateConfig

    try:
        return UpdateConfig.from_json(meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(f"corrupt checkpoint {checkpoint}: updater.json has no valid config ({exc!r})") from None


def _read_tensors(checkpoint: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = checkpoint / "trainable.safetensors"
    if not path.is_file():
        raise ExportError(f"corrupt checkpoint {checkpoint}: trainable.safetensors is missing")
    try:  # a PPO critic's value head (`lightrail.model.ppo`) is not part of the policy
        return {k: v for k, v in load_file(path).items() if not k.startswith("value_head.")}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ExportError(
            f"corrupt checkpoint {checkpoint}: trainable.safetensors is truncated or unreadable ({exc})"
        ) from None


def _find_base_model(checkpoint: Path, meta: dict[str, Any], override: str | os.PathLike | None) -> Path:
    recorded = meta.get("base_model") or {}
    if override is not None:
        base = Path(override).expanduser().resolve()
    elif recorded.get("path"):
        base = Path(recorded["path"])
    else:
        raise ExportError(
            f"{checkpoint} does not record its base model (saved by an older lightrail or trained from a model "
            "instance); pass --base-model DIR"
        )
    if not (base / "config.json").is_file():
        raise ExportError(f"base model {base} of {checkpoint} not found (no config.json there); pass --base-model DIR")
    trained = recorded.get("config")
    if trained:
        found = json.loads((base / "config.json").read_text())
        differ = [k for k in _ARCHITECTURE_KEYS if k in trained and k in found and trained[k] != found[k]]
        if differ:
            k = differ[0]
            raise ExportError(
                f"base model {base} is not the one {checkpoint} was trained from ({k}: {found[k]!r} here, "
                f"{trained[k]!r} in training); pass --base-model DIR"
            )
    return base


def _check_out(out: Path, force: bool, *, protected: list[Path]) -> None:
    target = out.resolve()
    for p in protected:
        p = p.resolve()
        if target == p or target in p.parents:
            raise ExportError(f"{out} would replace {p}, which the export reads from; choose another output directory")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory; choose another output directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} exists and is not empty; pass --force to replace it")


# -- writing the model ----------------------------------------------------------------------------------------------


def _load_base(base: Path, dtype: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))


def _copy_tensors(params: dict[str, Any], tensors: dict[str, Any], checkpoint: Path) -> None:
    import torch

    if set(params) != set(tensors):
        diff = sorted(set(params) ^ set(tensors))
        raise ExportError(
            f"the tensors of {checkpoint} do not match its base model ({len(diff)} differ, e.g. {diff[0]}); "
            "pass the right --base-model DIR"
        )
    with torch.no_grad():
        for name, value in tensors.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ExportError(
                    f"{checkpoint}: tensor {name} has shape {tuple(value.shape)}, the base model's "
                    f"{tuple(params[name].shape)}; pass the right --base-model DIR"
                )
            params[name].copy_(value)


def _set_adapter_base(folder: Path, base: Path) -> None:
    # peft writes the name the base model was loaded by; make it the absolute directory so the folder loads from
    # anywhere (vLLM and PeftModel read this field).
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = str(base)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_tokenizer(base: Path, folder: Path) -> None:
    copied = [name for name in _TOKENIZER_FILES if (base / name).is_file()]
    if "tokenizer_config.json" not in copied:
        raise ExportError(f"base model {base} has no tokenizer (tokenizer_config.json); export needs it to serve")
    for name in copied:
        shutil.copyfile(base / name, folder / name)
    # transformers >= 4.47 saves the chat template only to chat_template.jinja; older loaders (and some servers)
    # read tokenizer_config.json's "chat_template". Carry it in both, identical.
    template_file = folder / "chat_template.jinja"
    if template_file.is_file():
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        if not config.get("chat_template"):
            config["chat_template"] = template_file.read_text()
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
