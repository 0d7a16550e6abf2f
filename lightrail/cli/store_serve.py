"""``lightrail store serve``: run the store's HTTP server on a SQLite file or a PostgreSQL database, with the
dashboard's pages under ``/ui`` (same tokens).

The one place the two are put together: the store server knows no pages (`lightrail.store.server.create_app` takes
them as ``ui``) and the dashboard knows no server, so neither package imports the other.

Only argparse at import time: the main CLI imports this module to build ``--help``; the server stack (Starlette,
uvicorn, SQLite, asyncpg, Jinja2) loads inside the handler.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from lightrail._net import add_tls_arguments, refuse_to_serve
from lightrail.store.options import store_argument

DEFAULT_PORT = 4747


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``store serve`` on the main CLI's subparsers."""
    store = subparsers.add_parser(
        "store",
        help="run the durable store that trainers and runners share",
        description="The store holds rollouts, attempts, spans and resources; trainers and runners reach it over HTTP.",
        epilog="example:\n  lightrail store serve --db runs/store.db --token s3cret",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    store.set_defaults(handler=lambda args: (store.print_help(), 2)[1])

    serve = commands.add_parser(
        "serve",
        help="serve a store (SQLite file or PostgreSQL database) over HTTP",
        description=(
            "Serve a store over HTTP (JSON API, OpenAPI at /openapi.json, liveness at /health).\n"
            "Everything acknowledged survives a crash of the server; restarting on the same database resumes.\n"
            "With PostgreSQL, run several servers on one database (any hosts) and spread clients across them.\n"
            "Binds 127.0.0.1 by default; binding any other address requires a bearer token.\n"
            "--tls-cert/--tls-key serve HTTPS (clients trust a private CA through SSL_CERT_FILE)."
        ),
        epilog=(
            "examples:\n"
            "  LIGHTRAIL_TOKEN=s3cret lightrail store serve --db runs/store.db --host 0.0.0.0\n"
            "  # runners: open_store('http://HOST:4747', token='s3cret')\n"
            "  lightrail store serve --db postgresql://lightrail:PW@db:5432/runs --host 0.0.0.0 --token s3cret\n"
            "  # the same command on a second host: both serve the same run"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--db",
        default="lightrail.db",
        type=store_argument,
        metavar="URL",
        help="the database: a SQLite file path (or sqlite:///PATH; a folder means its store.db), created if missing; "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE (schema created on first use, shareable by several "
        "servers); or 'memory:' for a throwaway in-memory store (default: ./lightrail.db)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to bind, 0 for any free one (default: {DEFAULT_PORT})"
    )
    serve.add_argument(
        "--token",
        default=os.environ.get("LIGHTRAIL_TOKEN"),
        help="bearer token every request must carry (default: $LIGHTRAIL_TOKEN); /health stays open",
    )
    serve.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one dies (for trainers that run the store as a child)",
    )
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow binding a non-loopback address without a token (anyone who can reach it can write)",
    )
    serve.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="how much to log to stderr (default: warning)",
    )
    add_tls_arguments(serve)
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    if refuse_to_serve("lightrail store serve", args, "LIGHTRAIL_TOKEN"):
        return 2
    from lightrail.store import store_kind

    try:
        kind = store_kind(args.db)
        if kind == "http":
            raise ValueError(f"--db names a database, not another store server: {args.db!r}")
    except ValueError as exc:
        print(f"lightrail store serve: {exc}", file=sys.stderr)
        return 2
    if kind == "postgres":
        problem = _check_postgres(args.db)
        if problem is not None:
            print(f"lightrail store serve: {problem}", file=sys.stderr)
            return 1
    import functools
    import sqlite3

    from lightrail._errors import one_line
    from lightrail.dashboard.app import dashboard_routes
    from lightrail.store.base import StoreError
    from lightrail.store.server import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if args.exit_with_parent:
        from lightrail._lifeline import exit_with_parent

        exit_with_parent()
    try:
        serve(
            args.db,
            host=args.host,
            port=args.port,
            token=args.token or None,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            log_level=args.log_level,
            ui=functools.partial(dashboard_routes, secure_cookie=bool(args.tls_cert)),  # its cookie: HTTPS only
            then="dashboard: {url}/ui/ (same tokens)",
        )
    except KeyboardInterrupt:
        pass
    except (OSError, StoreError, sqlite3.Error) as exc:  # port in use, unwritable folder, not a store file, ...
        print(f"lightrail store serve: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0


def _check_postgres(url: str) -> str | None:
    """Open the database once before serving (connect, create or check the schema), so an unreachable server, a
    wrong password or a newer schema is one line here, not a traceback from the server's startup."""
    import asyncio

    from lightrail.store.base import StoreError

    async def probe() -> None:
        from lightrail.store.postgres import PostgresStore

        store = PostgresStore(url)
        try:
            await store.open()
        finally:
            await store.close()

    try:
        asyncio.run(probe())
    except (StoreError, ValueError, OSError) as exc:
        return str(exc)
    except Exception as exc:  # asyncpg's own errors (authentication, missing database): name them, no traceback
        return f"cannot open {url.split('@')[-1]!r}: {type(exc).__name__}: {exc}"
    return None
