"""``lightrail token create|list|revoke``: scoped tokens of a store (see `lightrail.store.tokens` for the roles).

A token is minted here, on the machine that runs the command: only its record (role, expiry, the SHA-256 of the
secret) is sent to the store, and the secret is printed once. The store is a server URL (with the admin token) or
the database itself (a SQLite path or a PostgreSQL URL, for a store no server serves yet).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from lightrail.store.options import STORE_ENV, TOKEN_ENV, add_store_arguments

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``token create|list|revoke`` on the main CLI's subparsers."""
    token = subparsers.add_parser(
        "token",
        help="mint, list and revoke scoped tokens (runner, ingest, read) of a store",
        description=(
            "Scoped tokens give each process only the rights it needs:\n"
            "  admin   everything (the store server's --token is this role)\n"
            "  runner  lease rollouts, heartbeat/finish and add spans to the attempts it leased, read resources\n"
            "  ingest  span writes (JSON or OTLP) into the attempts it names (--attempt), feedback on sessions\n"
            "  read    queries: rollouts, attempts, spans, resources, counts (dashboards, inspection)\n"
            "Tokens are stored hashed; a revocation takes effect within 10 s on every server of the store."
        ),
        epilog="example:\n  LIGHTRAIL_TOKEN=s3cret lightrail token create --store http://127.0.0.1:4747 --role runner",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = token.add_subparsers(dest="token_command", metavar="SUBCOMMAND")
    token.set_defaults(handler=lambda args: (token.print_help(), 2)[1])

    def common(parser: argparse.ArgumentParser) -> None:
        add_store_arguments(
            parser,
            store_help="store server URL, SQLite path or PostgreSQL URL",
            token_help="the store server's admin token",
            old_token=True,
        )

    create = commands.add_parser(
        "create",
        help="mint a token and print it (shown once)",
        description="Mint a scoped token, store its record (hashed) and print the secret once.",
        epilog="example:\n  lightrail token create --store http://trainer:4747 --role runner --expires 7d",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(create)
    create.add_argument(
        "--role", required=True, choices=["admin", "runner", "ingest", "read"], help="what the token may do (see above)"
    )
    create.add_argument("--expires", metavar="DURATION", help="lifetime like 90m, 12h, 7d, 2w (default: never)")
    create.add_argument(
        "--attempt",
        action="append",
        default=[],
        metavar="ATTEMPT_ID",
        help="with --role ingest: an attempt it may write spans into (repeat for several)",
    )
    create.add_argument("--note", default="", help="what the token is for, shown by `token list`")
    create.set_defaults(handler=_create)

    listing = commands.add_parser(
        "list",
        help="every scoped token: id, role, expiry, state, note",
        description="List every scoped token of the store: id, role, creation, expiry, state and note (never secrets).",
        epilog="example:\n  LIGHTRAIL_TOKEN=s3cret lightrail token list --store http://127.0.0.1:4747",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(listing)
    listing.set_defaults(handler=_list)

    revoke = commands.add_parser(
        "revoke",
        help="revoke a token by its id (the 12 hex digits after lrt_)",
        description="Revoke a scoped token; every server of the store refuses it within 10 s.",
        epilog="example:\n  LIGHTRAIL_TOKEN=s3cret lightrail token revoke --store http://127.0.0.1:4747 0123456789ab",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(revoke)
    revoke.add_argument("token_id", metavar="TOKEN_ID", help="the token's id, as `token list` shows it")
    revoke.set_defaults(handler=_revoke)


def _with_store(args: argparse.Namespace, work: Any) -> Any:
    """Run ``work(store)`` against the store the arguments name, closing it after."""
    from lightrail.store import check_store, open_store

    if not args.store:
        raise ValueError(f"give --store PATH|URL or set ${STORE_ENV}")

    async def run() -> Any:
        store = open_store(args.store, token=args.store_token)
        try:
            await check_store(store, ("list_tokens",),
                              token_hint=f"the store's admin token with --store-token or ${TOKEN_ENV}")  # fmt: skip
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _fail(command: str, exc: BaseException) -> int:
    print(f"lightrail token {command}: {exc}", file=sys.stderr)
    return 1


def _create(args: argparse.Namespace) -> int:
    from lightrail.store.base import StoreError
    from lightrail.store.tokens import mint, parse_duration

    try:
        expires_s = None if args.expires is None else parse_duration(args.expires)
        bearer, record = mint(args.role, expires_s=expires_s, attempts=args.attempt, note=args.note)
    except ValueError as exc:
        print(f"lightrail token create: {exc}", file=sys.stderr)
        return 2
    try:
        _with_store(args, lambda store: store.put_token(record))
    except (StoreError, OSError, ValueError) as exc:
        return _fail("create", exc)
    expiry = "never expires" if record.expires_at is None else f"expires {_when(record.expires_at)}"
    print(f"{args.role} token {record.token_id} ({expiry}); shown once, keep it secret:", file=sys.stderr)
    print(bearer)
    return 0


def _list(args: argparse.Namespace) -> int:
    from lightrail.store.base import StoreError

    try:
        records = _with_store(args, lambda store: store.list_tokens())
    except (StoreError, OSError, ValueError) as exc:
        return _fail("list", exc)
    now = time.time()
    print(f"{'TOKEN ID':<14}{'ROLE':<8}{'CREATED':<18}{'EXPIRES':<18}{'STATE':<9}NOTE")
    for r in records:
        state = "revoked" if r.revoked_at else "expired" if r.expires_at and r.expires_at <= now else "active"
        expires = "never" if r.expires_at is None else _when(r.expires_at)
        note = " ".join(filter(None, [r.note, f"(attempts: {', '.join(r.attempts)})" if r.attempts else ""]))
        print(f"{r.token_id:<14}{r.role.value:<8}{_when(r.created_at):<18}{expires:<18}{state:<9}{note}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    import msgspec

    from lightrail.store.base import StoreError

    async def revoke(store: Any) -> bool:
        record = await store.get_token(args.token_id)
        if record is None:
            return False
        if record.revoked_at is None:
            await store.put_token(msgspec.structs.replace(record, revoked_at=time.time()))
        return True

    try:
        found = _with_store(args, revoke)
    except (StoreError, OSError, ValueError) as exc:
        return _fail("revoke", exc)
    if not found:
        print(f"lightrail token revoke: no token {args.token_id!r} in {args.store}", file=sys.stderr)
        return 1
    print(f"revoked {args.token_id}", file=sys.stderr)
    return 0


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))
