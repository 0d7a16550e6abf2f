"""``lightrail dashboard``: the dashboard alone, in front of any store.

Only argparse at import time; Starlette, Jinja2 and the store load inside the handler.
"""

from __future__ import annotations

import argparse
import os
import sys

from lightrail._net import add_tls_arguments, refuse_to_serve
from lightrail.store.options import add_store_arguments

__all__ = ["add_parser"]

DEFAULT_PORT = 4748
TOKEN_ENV = "LIGHTRAIL_DASHBOARD_TOKEN"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    dashboard = subparsers.add_parser(
        "dashboard",
        help="browse runs, rollouts, spans, resources and failures in a web page",
        description=(
            "Serve the dashboard for a store: runs with their curves (live while they go), rollouts filtered and\n"
            "paged by the store, one rollout's attempts, span tree on a timeline, LLM calls with token logprobs and\n"
            "rewards, resources versions with diffs, the failure digest.\n"
            "A store server serves the same pages at <store URL>/ui; this command serves them for a SQLite file,\n"
            "a PostgreSQL database or a store server reached with a read token.\n"
            "Binds 127.0.0.1 by default; binding any other address requires --token (asked for by a sign-in form)."
        ),
        epilog=(
            "examples:\n"
            "  lightrail dashboard --store runs/calc            # a run folder holding store.db\n"
            '  lightrail dashboard --store http://store:4747 --store-token "$(cat read.token)"\n'
            "  LIGHTRAIL_DASHBOARD_TOKEN=s3cret lightrail dashboard --store runs/calc --host 0.0.0.0"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(
        dashboard,
        store_help="SQLite file (or a run folder holding store.db), postgresql:// URL or store server URL",
        token_help="bearer token of a store server URL; a read token is enough",
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    dashboard.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to bind, 0 for any free one (default: {DEFAULT_PORT})"
    )
    dashboard.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"the token the sign-in form asks for (default: ${TOKEN_ENV}; none: anyone who reaches the port)",
    )
    dashboard.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow binding a non-loopback address without a token (anyone who can reach it reads the store)",
    )
    dashboard.add_argument(
        "--tokenizer",
        metavar="MODEL_DIR",
        help="a model folder whose tokenizer shows each generated token as text next to its logprob (needs the "
        "train extra; default: token ids, unless the agent asked for logprobs itself)",
    )
    dashboard.add_argument(
        "--secure-cookie",
        action="store_true",
        help="mark the sign-in cookie Secure (HTTPS only) when a TLS proxy serves this dashboard (with --tls-cert it "
        "always is)",
    )
    dashboard.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="how much to log to stderr (default: warning)",
    )
    add_tls_arguments(dashboard)
    dashboard.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from lightrail.inspection.cli import store_location

    if refuse_to_serve("lightrail dashboard", args, TOKEN_ENV):
        return 2
    location = store_location("dashboard", args)
    if location is None:
        return 2
    if args.tokenizer and not os.path.isdir(args.tokenizer):
        print(f"lightrail dashboard: --tokenizer {args.tokenizer}: no such model folder", file=sys.stderr)
        return 2
    from lightrail._errors import one_line
    from lightrail._serving import run, serve_app, tls_options
    from lightrail.dashboard.app import create_dashboard_app
    from lightrail.store import StoreError, open_store, store_kind

    if store_kind(location) == "http":
        try:  # the token and its role now, not a sign-in page that fails on every view
            run(_check(location, args.store_token))
        except StoreError as exc:
            print(f"lightrail dashboard: {one_line(exc)}", file=sys.stderr)
            return 1
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tls = tls_options(args.tls_cert, args.tls_key)
    app = create_dashboard_app(lambda: open_store(location, token=args.store_token), token=args.token or None,
                               secure_cookie=bool(tls) or args.secure_cookie, tokenizer=args.tokenizer)  # fmt: skip
    try:
        serve_app(app, "lightrail dashboard", host=args.host, port=args.port, tls=tls, log_level=args.log_level)
    except KeyboardInterrupt:
        pass
    except (OSError, StoreError) as exc:  # a busy port, a store that cannot be opened
        print(f"lightrail dashboard: {one_line(exc)}", file=sys.stderr)
        return 1
    return 0


async def _check(url: str, token: str | None) -> None:
    """That the store server at ``url`` answers and lets ``token`` read (`lightrail.store.checks`)."""
    from lightrail.store import check_store, open_store

    store = open_store(url, token=token)
    try:
        await check_store(store, ("query_rollouts", "query_spans", "counts"),
                          token_hint="a read token with --store-token or $LIGHTRAIL_TOKEN")  # fmt: skip
    finally:
        await store.close()
