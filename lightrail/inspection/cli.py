"""``lightrail runs | rollouts | show | failures``: look into a store from the terminal.

Only argparse at import time (the main CLI imports this module to build ``--help``); the store, rich and
`lightrail.inspection.runs` load inside the handlers.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from lightrail.store.options import STORE_ENV, TOKEN_ENV, add_store_arguments

__all__ = ["add_parser"]


_RUNS_HELP = (
    "The store records rollouts, not runs, so runs are derived: rollouts whose metadata names a run ('run': the "
    "trainer tags them with the algorithm's out_dir, or dev-<time>; 'apo_run' for APO) form that run; the others "
    "are cut into sessions in enqueue order, a new "
    "one starting when a rollout is enqueued more than --gap minutes after every earlier one had ended. Runs are "
    "numbered 1, 2, ... by their first rollout."
)


def _wrap(text: str) -> str:
    return textwrap.fill(text, 100)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``runs``, ``rollouts``, ``show`` and ``failures`` on the main CLI's subparsers."""
    store = argparse.ArgumentParser(add_help=False)
    where = store.add_argument_group("store")
    add_store_arguments(
        where,
        store_help="SQLite file (or a run folder holding store.db), postgresql:// URL or store server URL",
        token_help="bearer token of a store server URL; a read token is enough",
        old_token=True,
    )
    gap = argparse.ArgumentParser(add_help=False)
    gap.add_argument(
        "--gap", type=float, default=10.0, metavar="MINUTES", help="idle time that separates two runs (default: 10)"
    )
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument(
        "--run", default=None, metavar="N|TAG", help="only this run (its number or tag in `lightrail runs`)"
    )

    runs = subparsers.add_parser(
        "runs",
        parents=[store, gap],
        help="list the runs in a store: when, how many rollouts by status and mode, mean reward",
        description=_wrap("List the runs a store holds, oldest first. " + _RUNS_HELP),
        epilog="example:\n  lightrail runs --store runs/calc/store.db",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    runs.set_defaults(handler=_runs)

    rollouts = subparsers.add_parser(
        "rollouts",
        parents=[store, run, gap],
        help="list a store's rollouts, newest first, with the error of each failed one",
        description=_wrap(
            "List rollouts newest first (filtered by status, mode and run), a page at a time, with the last error "
            "of each. " + _RUNS_HELP
        ),
        epilog="examples:\n  lightrail rollouts --status failed --limit 20\n"
        "  lightrail rollouts --run 2 --mode val --offset 20",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rollouts.add_argument(
        "--status",
        action="append",
        default=None,
        metavar="STATUS",
        help="queued, running, succeeded, failed, timeout, infra_error or cancelled (repeatable, or comma-separated)",
    )
    rollouts.add_argument("--mode", default=None, help="train or val")
    rollouts.add_argument("--limit", type=int, default=20, metavar="N", help="rollouts shown (default: 20)")
    rollouts.add_argument("--offset", type=int, default=0, metavar="N", help="newest rollouts skipped (default: 0)")
    rollouts.set_defaults(handler=_rollouts)

    show = subparsers.add_parser(
        "show",
        parents=[store],
        help="show one rollout: its attempts, span tree and the messages of its LLM calls",
        description=_wrap(
            "Show a rollout: task, status, reward, its attempts, the span tree of one attempt (the last by "
            "default), the traceback of a failure, and the conversation its LLM calls had."
        ),
        epilog="example:\n  lightrail show ro-3f2a9c01d4e5b6a7 --attempt 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    show.add_argument("rollout_id", metavar="ROLLOUT_ID", help="the rollout, as `lightrail rollouts` lists it")
    show.add_argument("--attempt", type=int, default=None, metavar="N", help="attempt number (default: the last)")
    show.add_argument("--full", action="store_true", help="print long messages and tracebacks whole")
    show.set_defaults(handler=_show)

    failures = subparsers.add_parser(
        "failures",
        parents=[store, run, gap],
        help="the failure digest of a store or run: failed attempts grouped by exception and message pattern",
        description=_wrap(
            "Group failed, timed-out, lost and infrastructure-failed attempts by exception type and message "
            "pattern (numbers, ids and quoted strings replaced), most frequent first, with one example each, and "
            "count succeeded rollouts that captured nothing to train on (no LLM call through lightrail's endpoint, "
            "calls without token ids, no reward): the digest `lightrail dev` and training validations print. "
            + _RUNS_HELP
        ),
        epilog="example:\n  lightrail failures --store runs/calc/store.db --run 1",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    failures.add_argument(
        "--limit",
        type=int,
        default=500,
        metavar="N",
        help="read the attempts of at most the N newest rollouts that failed or were retried (default: 500; 0: all)",
    )
    failures.add_argument(
        "--since",
        type=float,
        default=None,
        metavar="MINUTES",
        help="only rollouts enqueued in the last MINUTES minutes (default: any time)",
    )
    failures.set_defaults(handler=_failures)


def _console() -> Any:
    """rich on a terminal; plain text as wide as $COLUMNS (else 200) when piped, so ids never wrap."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() else 200, highlight=False)


def store_location(command: str, args: argparse.Namespace) -> str | None:
    location = args.store
    if not location:
        print(f"lightrail {command}: give --store PATH|URL or set ${STORE_ENV}", file=sys.stderr)
        return None
    from lightrail.store import store_kind

    try:
        kind = store_kind(location)
    except ValueError as exc:
        print(f"lightrail {command}: {exc}", file=sys.stderr)
        return None
    if kind == "sqlite":
        path = Path(location.removeprefix("sqlite://"))
        if path.is_dir() and (path / "store.db").is_file():
            return str(path / "store.db")
        if not path.is_file():  # opening would create an empty store
            print(f"lightrail {command}: no store at {path}", file=sys.stderr)
            return None
    return location


def _with_store(command: str, args: argparse.Namespace, body: Any) -> int:
    """Open the store named by the arguments, run ``body(store, console)`` on an event loop, close the store."""
    import asyncio

    from lightrail.store import NotFoundError, StoreError, check_store, open_store

    location = store_location(command, args)
    if location is None:
        return 2

    async def main() -> int:
        store = open_store(location, token=args.store_token)
        try:
            # reachable, a store, the token accepted, a role that reads (PostgreSQL: connected)
            await check_store(store, ("query_rollouts", "query_spans"),
                              token_hint=f"a read token with --store-token or ${TOKEN_ENV}")  # fmt: skip
            return await body(store, _console(), location)
        finally:
            await store.close()

    try:
        return asyncio.run(main())
    except (LookupError, NotFoundError) as exc:
        print(f"lightrail {command}: {exc}", file=sys.stderr)
        return 1
    except (StoreError, OSError) as exc:
        print(f"lightrail {command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _label(location: str) -> str:
    from lightrail.store import redact_url

    return redact_url(location)


def _runs(args: argparse.Namespace) -> int:
    async def body(store: Any, console: Any, location: str) -> int:
        from lightrail.inspection.runs import derive_runs, render_runs

        render_runs(derive_runs(await store.query_rollouts(), args.gap * 60), console, store_label=_label(location))
        return 0

    return _with_store("runs", args, body)


def _rollouts(args: argparse.Namespace) -> int:
    from lightrail.types import RolloutStatus

    statuses = None
    if args.status:
        names = [name.strip() for given in args.status for name in given.split(",") if name.strip()]
        try:
            statuses = [RolloutStatus(name) for name in names]
        except ValueError:
            known = ", ".join(s.value for s in RolloutStatus)
            print(f"lightrail rollouts: --status takes {known}; got {names}", file=sys.stderr)
            return 2
    if args.limit < 1 or args.offset < 0:
        print("lightrail rollouts: --limit must be >= 1 and --offset >= 0", file=sys.stderr)
        return 2

    async def body(store: Any, console: Any, location: str) -> int:
        import asyncio

        from lightrail.inspection.runs import last_error, render_rollouts, rollouts_page

        page, total = await rollouts_page(
            store, status=statuses, mode=args.mode, run=args.run, limit=args.limit, offset=args.offset,
            gap_s=args.gap * 60,
        )  # fmt: skip
        failed = [r.rollout_id for r in page if r.attempts > 1 or r.status is not RolloutStatus.SUCCEEDED]
        attempts = await asyncio.gather(*(store.query_attempts(i) for i in failed))
        errors = {i: last_error(a) for i, a in zip(failed, attempts, strict=True)}
        what = " ".join(
            [*(["/".join(s.value for s in statuses)] if statuses else []), *([args.mode] if args.mode else []),
             "rollouts", *([f"of run {args.run}"] if args.run else [])]
        )  # fmt: skip
        render_rollouts(page, errors, console, total=total, offset=args.offset, what=what)
        return 0

    return _with_store("rollouts", args, body)


def _show(args: argparse.Namespace) -> int:
    async def body(store: Any, console: Any, location: str) -> int:
        from lightrail.inspection.runs import render_rollout, rollout_details

        render_rollout(await rollout_details(store, args.rollout_id, args.attempt), console, full=args.full)
        return 0

    return _with_store("show", args, body)


def _failures(args: argparse.Namespace) -> int:
    if args.limit < 0 or (args.since is not None and args.since <= 0):
        print("lightrail failures: --limit must be >= 0 and --since > 0", file=sys.stderr)
        return 2
    since = None if args.since is None else time.time() - 60 * args.since

    async def body(store: Any, console: Any, location: str) -> int:
        from lightrail.inspection.report import render_digest
        from lightrail.inspection.runs import failure_digest, run_stop

        digest, read, candidates = await failure_digest(
            store, run=args.run, limit=args.limit, gap_s=args.gap * 60, since=since
        )
        stopped = await run_stop(store, args.run, args.gap * 60) if args.run else None
        scope = f"run {args.run}" if args.run else _label(location)
        if args.since is not None:
            scope += f", last {args.since:g} minutes"
        render_digest(digest, console, title=f"failure digest of {scope}", stopped=stopped)
        if read < candidates:
            console.print(
                f"(from the newest {read} of {candidates} rollouts that failed or were retried; --limit 0 reads all)"
            )
        return 0

    return _with_store("failures", args, body)
