"""``lightrail dev``: run an agent on a tasks file with real runner processes and print what happened.

Only argparse at import time (the main CLI imports this module to build ``--help``). To add a command, write
its ``add_*`` function (here or in its own module) and call it from `add_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lightrail.agent.cli import DEFAULT_CONCURRENCY
from lightrail.store.options import TOKEN_ENV, add_store_arguments

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the trainer's commands on the main CLI's subparsers."""
    add_train_parser(subparsers)
    add_dev_parser(subparsers)


def add_train_parser(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train an agent from a YAML config: GRPO, SFT, APO, or SFT then GRPO (examples/<name>/config.yaml)",
        description=(
            "Build or prepare the model, generate the data, start a store, runners, the gateway and the engine, "
            "and train the agent as CONFIG says (its `algorithm`: grpo, sft, apo, or [sft, grpo]). Prints held-out "
            "success before and after, and where the checkpoint, metrics and reward curve are. Every field, with its "
            "type, default and meaning: "
            "docs/config.md (also printed by --config-reference)."
        ),
        epilog=(
            "examples:\n  lightrail train examples/sql_agent/config.yaml\n"
            "  lightrail train examples/rag_agent/config.yaml --steps 5 --set trainer.concurrency=4\n"
            "  lightrail train examples/sql_agent/config.yaml --set grpo.steps=3 --print-config\n\n"
            "every config field (type, default, meaning): docs/config.md, or lightrail train --config-reference"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("config", metavar="CONFIG.yaml", nargs="?", help="the run's configuration")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field by dotted path, value read as YAML (repeatable), e.g. grpo.config.lr=1e-4",
    )
    train.add_argument("--steps", type=int, default=None, metavar="N", help="shorthand for --set grpo.steps=N")
    train.add_argument("--model", default=None, help="shorthand for --set model=NAME (tiny, small, smollm2, a path)")
    train.add_argument("--out", default=None, metavar="DIR", help="shorthand for --set out_dir=DIR")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue a run that stopped (crashed, killed, Ctrl-C) from its newest checkpoint in the same out_dir; "
        "the rollouts it left unfinished are cancelled and the steps after the checkpoint redone (APO always "
        "resumes from its state file)",
    )
    train.add_argument(
        "--print-config",
        action="store_true",
        help="print the config as it would run (overrides applied, every default filled in) as YAML, and exit",
    )
    train.add_argument(
        "--config-reference",
        action="store_true",
        help="print the reference of every config field (type, default, meaning) as Markdown, and exit",
    )
    train.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    if args.config_reference:
        from lightrail.trainer.config_reference import render_markdown

        sys.stdout.write(render_markdown())
        return 0
    if args.config is None:
        print("lightrail train: give CONFIG.yaml (or --config-reference)", file=sys.stderr)
        return 2
    from lightrail.algorithms.run.guard import RunStopped
    from lightrail.model.mismatch import MismatchError
    from lightrail.trainer.config import ConfigError, load_config, train

    overrides = list(args.overrides)
    for key, value in (("grpo.steps", args.steps), ("model", args.model), ("out_dir", args.out)):
        if value is not None:
            overrides.append(f"{key}={value}")
    try:
        config = load_config(args.config, overrides)
        args.on_interrupt = lambda: _interrupted(config.run_dir, args.argv)
        args.error_log = config.run_dir / "error.log"  # the traceback of a failed run, kept with it
        if args.resume:
            stages = [config.algorithm] if isinstance(config.algorithm, str) else config.algorithm
            overrides += [f"{stage}.resume=true" for stage in stages if stage in ("grpo", "sft")]
            config = load_config(args.config, overrides)
        if args.print_config:
            import yaml

            from lightrail.trainer.config import resolved_config

            sys.stdout.write(yaml.safe_dump(resolved_config(config), sort_keys=False, default_flow_style=None))
            return 0
        train(config)  # prints the summary (`lightrail.trainer.result.summary`), as `Trainer.fit` does
    except ConfigError as exc:
        print(f"lightrail train: {exc}", file=sys.stderr)
        return 2
    except (RunStopped, MismatchError) as exc:  # the cause was printed at its step; this is the run's last line
        print(f"lightrail train: stopped: {exc}", file=sys.stderr)
        return RunStopped.exit_code
    return 0


def _interrupted(run_dir: Path, argv: list[str]) -> str:
    """The line a Ctrl-C of ``lightrail train`` ends with: where the run can continue from (its newest complete
    checkpoint, any stage's) and the command that continues it."""
    import shlex

    from lightrail.algorithms.run.folder import LOOP_STATE

    saved = sorted(run_dir.glob(f"**/checkpoints/step-*/{LOOP_STATE}"), key=lambda p: p.stat().st_mtime)
    again = shlex.join(["lightrail", *argv, *([] if "--resume" in argv else ["--resume"])])
    if not saved:
        return f"interrupted before the first checkpoint; start again with: {again}"
    checkpoint = saved[-1].parent
    step = checkpoint.name.removeprefix("step-")
    return f"interrupted; continue from step {step} (checkpoint {checkpoint}) with: {again}"


def add_dev_parser(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="run an agent on tasks with real runners; print a per-rollout table and a failure digest",
        description=(
            "Run AGENT once on every task of a JSONL file (one task input per line, or a Task object with an "
            "'input' key), with N runner processes of K concurrent rollouts against a store server, then print "
            "a per-rollout table and failures grouped by exception type and message pattern. With --llm, rollouts "
            "that recorded no LLM call through lightrail's endpoint, calls without token ids, or no reward are named "
            "with their likely cause. Exits 1 if any rollout failed or captured nothing to train on."
        ),
        epilog="examples:\n  lightrail dev --agent my_agents:solve --tasks tasks.jsonl --runners 2 -k 4\n"
        "  lightrail dev --agent my_agents:solve --tasks tasks.jsonl --llm http://127.0.0.1:8000/v1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dev.add_argument("--agent", required=True, metavar="MODULE:OBJECT", help="the agent, as an import reference")
    dev.add_argument("--tasks", required=True, metavar="FILE.jsonl", help="tasks, one JSON value per line")
    dev.add_argument("--runners", type=int, default=2, metavar="N", help="runner processes (default: 2)")
    dev.add_argument(
        "-k", "--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="K",
        help=f"rollouts per runner (default: {DEFAULT_CONCURRENCY})",
    )  # fmt: skip
    dev.add_argument(
        "--llm",
        metavar="fake|URL",
        default=None,
        help="start a gateway in front of the scripted fake model ('fake') or an OpenAI-compatible server, and give "
        "the agent its endpoint as the 'llm' resource; the table then names rollouts whose calls it did not record",
    )
    add_store_arguments(
        dev,
        store_help="SQLite file, postgresql:// URL or store server URL",
        token_help="the store server's token",
        old_token=True,
        store_default="a fresh ./runs/<timestamp>/store.db",
    )
    dev.set_defaults(handler=_dev)


def read_tasks(path: str) -> list:
    """Tasks of a JSONL file: a line with an object holding ``input`` (and only Task fields) is a `Task`;
    any other JSON value is a task input."""
    import msgspec

    from lightrail.types import Task

    tasks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if isinstance(value, dict) and "input" in value and set(value) <= {"input", "task_id", "metadata"}:
                value = msgspec.convert(value, Task)
            tasks.append(value)
    return tasks


def _dev(args: argparse.Namespace) -> int:
    from lightrail._errors import one_line
    from lightrail.gateway.backends import UpstreamError
    from lightrail.store import StoreError
    from lightrail.trainer import Trainer
    from lightrail.types import RolloutStatus

    try:
        tasks = read_tasks(args.tasks)
    except (OSError, ValueError) as exc:
        print(f"lightrail dev: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = Trainer(
            n_runners=args.runners, store=args.store, concurrency=args.concurrency, token=args.store_token
        )
        trainer.token_source = f"--store-token or ${TOKEN_ENV}"  # what a shell user types, not Trainer(token=...)
        report = trainer.dev(args.agent, tasks, llm=_dev_backend(args.llm))
    except (ImportError, ValueError, RuntimeError, StoreError, OSError, UpstreamError) as exc:
        print(f"lightrail dev: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0 if all(row.status is RolloutStatus.SUCCEEDED and not row.capture for row in report.rows) else 1


def _dev_backend(llm: str | None) -> Any:
    """The model `lightrail dev --llm` puts a gateway in front of: the scripted fake, or an upstream server."""
    if llm is None:
        return None
    if llm == "fake":
        from lightrail.gateway.fake import ScriptedBackend

        return ScriptedBackend()
    if not llm.startswith(("http://", "https://")):
        raise ValueError(f"--llm: expected 'fake' or an http(s):// URL of an OpenAI-compatible server, not {llm!r}")
    from lightrail.gateway.backends import OpenAIUpstream

    return OpenAIUpstream(llm)
