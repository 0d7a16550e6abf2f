"""The ``lightrail`` command. Each component registers its own subcommands; a command that composes components
(``store serve``: the store server with the dashboard's pages) lives here, above them. Heavy imports happen only
inside the handler of the command that runs."""

from __future__ import annotations

import argparse
import importlib
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        try:
            importlib.import_module(module).add_parser(sub)
        except ModuleNotFoundError as exc:  # an optional component not installed / not built yet
            if exc.name is None or not module.startswith(exc.name):
                raise
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return int(args.handler(args) or 0)
