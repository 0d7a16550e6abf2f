"""The ``lightrail`` command. Each component registers its own subcommands; a command that composes components
(``store serve``: the store server with the dashboard's pages) lives here, above them. Heavy imports happen only
inside the handler of the command that runs."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import NoReturn

# module providing `add_parser(subparsers)`, in --help order
_COMMANDS = [
    "lightrail.demos.cli",  # demo
    "lightrail.trainer.cli",  # train, dev
    "lightrail.trainer.doctor",  # doctor
    "lightrail.inspection.cli",  # runs, rollouts, show, failures
    "lightrail.dashboard.cli",  # dashboard
    "lightrail.agent.cli",  # runner
    "lightrail.cli.store_serve",  # store serve
    "lightrail.store.token_cli",  # token create|list|revoke
    "lightrail.gateway.cli",  # gateway serve
    "lightrail.engine.cli",  # models list|prepare
    "lightrail.algorithms.cli",  # export
    "lightrail.continuous.cli",  # learn, policies, rollback
]


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other bad input (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lightrail",
        description="Train the LLM inside any agent from its own runs. Run `lightrail COMMAND --help` for details.",
        epilog="examples:\n  lightrail demo --quick\n  lightrail store serve --db runs/store.db --token s3cret\n"
        "  lightrail train examples/sql_agent/config.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from lightrail import __version__

    parser.add_argument("--version", action="version", version=f"lightrail {__version__}", help="print the version")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"show the full traceback of an error (also after the command: lightrail train CONFIG --debug; or "
        f"${DEBUG_ENV}=1) instead of its one line",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as exc:  # an optional component not installed / not built yet
            if exc.name is None or not module.startswith(exc.name):
                raise
    return parser


DEBUG_ENV = "LIGHTRAIL_DEBUG"
_BUGS = (KeyError, AttributeError, TypeError, IndexError, NameError, AssertionError, ArithmeticError)


def _traceback_kept(exc: BaseException, log: str | os.PathLike[str] | None) -> str:
    """Where the traceback of ``exc`` can be read: appended to ``log`` (a run's ``error.log``) when its folder
    exists (a run that made nothing gets no folder for it), else shown by ``--debug``."""
    if log is None or not os.path.isdir(os.path.dirname(os.path.abspath(log))):
        return "--debug shows the traceback"
    import time
    import traceback

    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
        f.write("".join(traceback.format_exception(exc)) + "\n")
    return f"traceback in {log}"


def run() -> NoReturn:
    """The ``lightrail`` command's entry point: `main`, then exit with its code. A command is done by then, so the
    objects it made are frozen (`gc.freeze`) for the interpreter's exit: its collections then skip them. A training
    process holds ~450k objects (torch, the model library), and the exit's collections took ~3 s of a stopped
    run's exit on 2 CPUs."""
    code = main()
    gc.freeze()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every command's errors end here the same way: one line ``lightrail COMMAND: what went wrong``
    on stderr and exit code 1 (`lightrail._errors.one_line`: a syntax error as ``file:line: message``); Ctrl-C is one
    line too (the command's ``args.on_interrupt()`` says how to continue, e.g. ``--resume``), exit code 130. With
    ``--debug`` (anywhere on the line) or ``$LIGHTRAIL_DEBUG=1`` the traceback is shown instead; a command that names
    ``args.error_log`` (``lightrail train``: its run's ``error.log``) has it appended there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]  # accepted after the command too, where users type it
    # the model library's per-file weight bars: noise in a command's output (set before it is imported, and
    # inherited by every child process the command starts)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as typed (less --debug): what a hint to run it again repeats
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    from lightrail._errors import one_line

    prog = f"lightrail {args.command}"
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        hint = getattr(args, "on_interrupt", None)
        print(f"{prog}: {hint() if hint is not None else 'interrupted'}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place a command's error becomes its one line
        if debug:
            raise
        line = one_line(exc)
        if isinstance(exc, _BUGS):  # a message that means little without its type (KeyError: 'x')
            line = f"{type(exc).__name__}: {line}"
        print(f"{prog}: {line} ({_traceback_kept(exc, getattr(args, 'error_log', None))})", file=sys.stderr)
        return 1
