"""``lightrail runner``: one runner process against a store server.

Only argparse at import time (the main CLI imports this module to build ``--help``).
"""

from __future__ import annotations

import argparse
import os
import sys

from lightrail.store.options import add_store_arguments, given_store

__all__ = ["DEFAULT_CONCURRENCY", "RUNNER_ROUTES", "add_parser"]

DEFAULT_CONCURRENCY = 8
"""Rollouts at once per runner, the same default for every command that starts runners (`runner`, `dev`, the
`Trainer`, a train config's ``trainer.concurrency``)."""

RUNNER_ROUTES = ("lease", "heartbeat", "finish", "add_spans", "get_resources")
"""What a runner calls on its store: its token's role must allow all of them."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``runner`` on the main CLI's subparsers."""
    runner = subparsers.add_parser(
        "runner",
        help="lease rollouts from a store server and run an agent on them",
        description=(
            "Run AGENT on rollouts leased from the store at URL, K at a time, until stopped (SIGTERM/SIGINT: "
            "stop leasing, let running rollouts finish within the grace period, hand the rest back for retry)."
        ),
        epilog="example:\n  LIGHTRAIL_TOKEN=s3cret lightrail runner --store http://127.0.0.1:4747 --agent my_agents:solve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_store_arguments(
        runner,
        store_help="store server URL (or a SQLite or postgresql:// database this machine reaches)",
        token_help="the store server's token; a runner token is enough",
        old_token=True,
    )
    runner.add_argument(
        "--agent", required=True, metavar="MODULE:OBJECT", help="the agent: module:object or path/to/file.py:object"
    )
    runner.add_argument(
        "-k", "--concurrency", type=int, default=DEFAULT_CONCURRENCY, metavar="K",
        help=f"rollouts at once (default: {DEFAULT_CONCURRENCY})",
    )  # fmt: skip
    runner.add_argument("--max-rollouts", type=int, default=None, metavar="N", help="exit after N rollouts")
    runner.add_argument("--idle-exit", type=float, default=None, metavar="S", help="exit after S idle seconds")
    runner.add_argument("--grace", type=float, default=10.0, metavar="S", help="shutdown grace period (default: 10)")
    runner.add_argument("--worker-id", default=None, help="name of this runner (default: host:pid:suffix)")
    runner.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="how much to log to stderr (default: warning; info adds each attempt, debug each HTTP request)",
    )
    runner.add_argument(
        "--give-up-after",
        type=float,
        default=600.0,
        metavar="S",
        help="exit when the store has been unreachable for S seconds in a row, 0 to retry forever (default: 600)",
    )
    runner.add_argument(
        "--otel",
        nargs="?",
        const="sink",
        choices=["sink", "otlp"],
        default=None,
        help="record the agent framework's OpenTelemetry spans in each attempt (needs lightrail[otel]); 'otlp' "
        "exports them to the store server's /v1/traces instead of through the runner (default: sink)",
    )
    runner.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from lightrail._errors import one_line
    from lightrail.agent.agent import load_agent
    from lightrail.agent.processes import RUNNER_ENV
    from lightrail.agent.runner import Runner
    from lightrail.store import StoreError, check_store, open_store, redact_url, store_kind

    store_url = given_store("runner", args)
    if store_url is None:
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    os.environ[RUNNER_ENV] = "1"

    if args.otel is not None:
        try:
            from lightrail.agent.runner import require_otel

            require_otel()
            if args.otel == "otlp":
                if not store_url.startswith(("http://", "https://")):
                    print("lightrail runner: --otel otlp needs a store server URL", file=sys.stderr)
                    return 2
                from lightrail.tracing import otel

                otel.setup(exporter="otlp", store_url=store_url, token=args.store_token)
        except ImportError as exc:
            print(f"lightrail runner: {exc}", file=sys.stderr)
            return 2

    try:
        store_kind(store_url)
        agent = load_agent(args.agent)  # before the store: a missing module must not leave a store file behind
    except (ImportError, ValueError, TypeError) as exc:
        print(f"lightrail runner: {exc}", file=sys.stderr)
        return 2

    async def main() -> Runner:
        store = open_store(store_url, token=args.store_token)
        try:
            await check_store(
                store, RUNNER_ROUTES, token_hint="the store's token with --store-token or $LIGHTRAIL_TOKEN"
            )
            runner = Runner(
                store,
                agent,
                concurrency=args.concurrency,
                worker_id=args.worker_id,
                grace_s=args.grace,
                otel=args.otel is not None,
                store_patience_s=args.give_up_after or None,
            )
            print(
                f"lightrail runner {runner.worker_id} leasing from {redact_url(store_url)}: {args.agent}, "
                f"{args.concurrency} at a time",
                file=sys.stderr,
                flush=True,
            )
            stats = await runner.run(max_rollouts=args.max_rollouts, idle_exit_s=args.idle_exit)
            logging.getLogger("lightrail.runner").info("runner done: %d leased, %s", stats.leased, dict(stats.ended))
            return runner
        finally:
            await store.close()

    try:
        runner = asyncio.run(main())
    except (ImportError, ValueError, TypeError) as exc:  # a bad argument the Runner refuses
        print(f"lightrail runner: {exc}", file=sys.stderr)
        return 2
    except (StoreError, OSError) as exc:  # unreachable at start or for --give-up-after, token or role refused
        print(f"lightrail runner: {one_line(exc)}", file=sys.stderr)
        return 1
    if runner.abandoned_threads:  # sync agents stuck in threads would keep the interpreter alive
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
