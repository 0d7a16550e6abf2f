"""The store options every command spells the same way: ``--store`` (default ``$LIGHTRAIL_STORE``) and
``--store-token`` (default ``$LIGHTRAIL_TOKEN``). ``--token`` is a command's own server token (``store serve``,
``gateway serve``, ``dashboard``); commands whose ``--token`` used to mean the store's keep it as a deprecated
spelling of ``--store-token``.

Only argparse and os at import time: every command module imports this to build ``--help``.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["STORE_ENV", "TOKEN_ENV", "add_store_arguments", "given_store", "store_argument"]

STORE_ENV = "LIGHTRAIL_STORE"
TOKEN_ENV = "LIGHTRAIL_TOKEN"


def add_store_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    store_help: str = "SQLite file, postgresql:// URL or store server URL",
    token_help: str = "bearer token of a store server URL",
    old_token: bool = False,
    store_default: str | None = None,
) -> None:
    """Add ``--store`` and ``--store-token`` (and, with ``old_token``, ``--token`` as their deprecated spelling).
    ``store_default`` describes what happens without a store (default: the command asks for one)."""
    default = f"${STORE_ENV}" + (f", else {store_default}" if store_default else "")
    parser.add_argument(
        "--store",
        default=os.environ.get(STORE_ENV),
        type=store_argument,
        metavar="PATH|URL",
        help=f"{store_help}; a folder means its store.db (default: {default})",
    )
    parser.add_argument(
        "--store-token",
        default=os.environ.get(TOKEN_ENV),
        metavar="TOKEN",
        help=f"{token_help} (default: ${TOKEN_ENV})",
    )
    if old_token:
        parser.add_argument(
            "--token",
            dest="store_token",
            default=argparse.SUPPRESS,
            metavar="TOKEN",
            help="deprecated spelling of --store-token",
        )


def store_argument(value: str) -> str:
    """``--store`` as every command reads it (`lightrail.store.resolve_store`: a URL, a database file, or a folder
    meaning its ``store.db``); a bad one is argparse's one-line error, with the accepted forms."""
    from lightrail.store import resolve_store

    try:
        return resolve_store(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def given_store(command: str, args: argparse.Namespace) -> str | None:
    """``args.store``, or None after printing the one line that asks for it."""
    if not args.store:
        print(f"lightrail {command}: give --store PATH|URL or set ${STORE_ENV}", file=sys.stderr)
        return None
    return str(args.store)
