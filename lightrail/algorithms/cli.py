"""``lightrail export``: a training checkpoint out as a Hugging Face model folder (see `lightrail.model.export`).

lightrail export runs/calc --merge models/calc-v1
lightrail gateway serve --store serve.db --model models/calc-v1
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["add_parser"]

_EPILOG = """\
examples:
  lightrail export runs/calc models/calc-v1                 # newest checkpoint of the run
  lightrail export runs/calc --step 40 --merge models/calc-v1
  lightrail export runs/calc/checkpoints/step-40 models/calc-v1

then serve it:
  lightrail gateway serve --store serve.db --model models/calc-v1
  vllm serve models/calc-v1                                  # full or --merge exports
  vllm serve BASE --enable-lora --lora-modules calc=models/calc-v1   # a LoRA export without --merge

what is written to OUT: full fine-tuning -> a full model (config.json, model.safetensors, generation_config.json);
LoRA with --merge -> the same, adapter folded in; LoRA without --merge -> a peft adapter folder
(adapter_config.json naming the base model, adapter_model.safetensors). Always the base model's tokenizer and
chat template, and lightrail_export.json (kind, source checkpoint, base model).
"""


def add_parser(subparsers: Any) -> None:
    """Register ``export`` on the ``lightrail`` command's subparsers."""
    parser = subparsers.add_parser(
        "export",
        help="write a training checkpoint as a servable Hugging Face model folder",
        description="Write the policy of a GRPO checkpoint as a Hugging Face model folder that `lightrail gateway "
        "serve --model`, vLLM, transformers and peft load.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR", help="a GRPO out_dir (its checkpoints/step-N) or one checkpoint")
    parser.add_argument("out", metavar="OUT", help="directory to write (created; must be empty unless --force)")
    parser.add_argument("--step", type=int, help="export checkpoints/step-N (default: the newest)")
    parser.add_argument("--merge", action="store_true", help="LoRA: fold the adapter into a full model")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    parser.add_argument(
        "--base-model",
        metavar="DIR",
        help="the base model's directory, when the checkpoint does not record it or it has moved",
    )
    parser.set_defaults(handler=_export)


def _export(args: argparse.Namespace) -> int:
    from lightrail.model.export import EXPORT_INFO, ExportError, export_checkpoint

    start = time.perf_counter()
    try:
        out = export_checkpoint(
            args.run, args.out, step=args.step, merge=args.merge, force=args.force, base_model=args.base_model
        )
    except ExportError as exc:
        print(f"lightrail export: {exc}", file=sys.stderr)
        return 2
    import json

    info = json.loads((out / EXPORT_INFO).read_text())
    print(
        f"exported {info['kind']} model from {info['checkpoint']} to {out} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0
