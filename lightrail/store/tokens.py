"""Scoped tokens: who may call which store route, and on which attempts.

A store server has one admin token (``--token``, the trainer's) and any number of scoped tokens minted with
``lightrail token create --role ROLE``. A scoped token reads ``lrt_<token_id>_<secret>``; the store keeps its
`TokenRecord` (role, expiry, revocation) with only the SHA-256 of the secret, so a copy of the database grants
nothing.

Roles (`ROUTE_ROLES` is the table the server enforces and the tests walk):

* ``admin``: everything (the trainer; the single ``--token`` is this role).
* ``runner``: lease, heartbeat and finish its own attempts, add spans to them, read resources. An attempt is a
  runner token's own when its id starts with ``<token_id>.``: the server gives every attempt a runner token leases
  that prefix, so ownership is checked from the id alone, on any server of the store, with no lookup.
* ``ingest``: span writes (JSON or OTLP) into the attempts named when it was minted; feedback on served sessions.
* ``read``: queries (rollouts, attempts, spans, resources, counts), the OpenAPI document.

A request beyond its token's role is a 403 that names the role it needs; an unknown, expired or revoked token a 401.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec

__all__ = [
    "DASHBOARD_ROLES",
    "ROUTE_ROLES",
    "Principal",
    "Role",
    "TokenRecord",
    "TokenVerifier",
    "Verify",
    "mint",
    "owns_attempt",
    "parse_duration",
    "parse_token",
    "runner_attempt_id",
    "token_verifier",
]


class Role(enum.StrEnum):
    ADMIN = "admin"
    RUNNER = "runner"
    INGEST = "ingest"
    READ = "read"


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A scoped token as the store keeps it: never the secret, only its SHA-256."""

    token_id: str
    role: Role
    secret_sha256: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    attempts: list[str] = []
    """``ingest``: the attempts it may write spans into."""
    note: str = ""

    def valid(self, secret: str, now: float) -> bool:
        """Whether ``secret`` is this token's and the token is neither expired nor revoked (constant-time)."""
        digest = hashlib.sha256(secret.encode()).hexdigest()
        if not hmac.compare_digest(digest, self.secret_sha256):
            return False
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


class Principal(msgspec.Struct, frozen=True):
    """Who a request acts as: the admin token (``token_id`` None) or a scoped token."""

    role: Role
    token_id: str | None = None
    attempts: frozenset[str] = frozenset()


ADMIN = Principal(Role.ADMIN)

_ANY_READER = frozenset({Role.ADMIN, Role.READ})
DASHBOARD_ROLES = _ANY_READER
"""Who may open the dashboard's pages (`lightrail.dashboard`): they read everything the store holds."""
ROUTE_ROLES: dict[str, frozenset[Role]] = {
    "enqueue": frozenset({Role.ADMIN}),
    "query_rollouts": _ANY_READER,
    "page_rollouts": _ANY_READER,
    "cancel": frozenset({Role.ADMIN}),
    "wait": _ANY_READER,
    "get_rollout": _ANY_READER,
    "query_attempts": _ANY_READER,
    "query_spans": _ANY_READER,
    "lease": frozenset({Role.ADMIN, Role.RUNNER}),
    "heartbeat": frozenset({Role.ADMIN, Role.RUNNER}),
    "finish": frozenset({Role.ADMIN, Role.RUNNER}),
    "open_session": frozenset({Role.ADMIN}),
    "delete_sessions": frozenset({Role.ADMIN}),
    "feedback": frozenset({Role.ADMIN, Role.INGEST}),
    "add_spans": frozenset({Role.ADMIN, Role.RUNNER, Role.INGEST}),
    "otlp_traces": frozenset({Role.ADMIN, Role.RUNNER, Role.INGEST}),
    "put_resources": frozenset({Role.ADMIN}),
    "get_latest_resources": frozenset({Role.ADMIN, Role.RUNNER, Role.READ}),
    "get_resources": frozenset({Role.ADMIN, Role.RUNNER, Role.READ}),
    "counts": _ANY_READER,
    "openapi": _ANY_READER,
    "whoami": frozenset(Role),
    "put_token": frozenset({Role.ADMIN}),
    "list_tokens": frozenset({Role.ADMIN}),
    "get_token": frozenset({Role.ADMIN}),
}
"""Which roles may call each route (by route name; ``health`` needs no token). Routes that write into attempts
(heartbeat, finish, span writes) also check the attempts themselves: `owns_attempt`."""

_TOKEN_RE = re.compile(r"lrt_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})")


def mint(
    role: Role | str,
    *,
    expires_s: float | None = None,
    attempts: Iterable[str] = (),
    note: str = "",
    now: float | None = None,
) -> tuple[str, TokenRecord]:
    """A new scoped token: the bearer string (shown once) and the record to store."""
    role = Role(role)
    attempts = sorted(set(attempts))
    if attempts and role is not Role.INGEST:
        raise ValueError("only ingest tokens name attempts")
    if expires_s is not None and expires_s <= 0:
        raise ValueError(f"expiry must be in the future, got {expires_s} s")
    now = time.time() if now is None else now
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(24)
    record = TokenRecord(
        token_id=token_id,
        role=role,
        secret_sha256=hashlib.sha256(secret.encode()).hexdigest(),
        created_at=now,
        expires_at=None if expires_s is None else now + expires_s,
        attempts=attempts,
        note=note,
    )
    return f"lrt_{token_id}_{secret}", record


def parse_token(bearer: str) -> tuple[str, str] | None:
    """``(token_id, secret)`` of a scoped token, or None for anything else (the admin token, garbage)."""
    m = _TOKEN_RE.fullmatch(bearer)
    return (m.group(1), m.group(2)) if m else None


def runner_attempt_id(token_id: str, requested: str | None) -> str:
    """The id of an attempt a runner token leases: its own prefix, then the id it asked for (so a retried lease
    with the same ``attempt_id`` names the same attempt) or a fresh one."""
    prefix = f"{token_id}."
    if requested is None:
        return prefix + secrets.token_hex(8)
    return requested if requested.startswith(prefix) else prefix + requested


def owns_attempt(principal: Principal, attempt_id: str) -> bool:
    """Whether ``principal`` may write into ``attempt_id`` (heartbeat, finish, spans)."""
    if principal.role is Role.ADMIN:
        return True
    if principal.role is Role.RUNNER:
        return attempt_id.startswith(f"{principal.token_id}.")
    if principal.role is Role.INGEST:
        return attempt_id in principal.attempts
    return False


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (or plain seconds) as seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"a duration is a positive number with s, m, h, d or w (like 7d), got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


class TokenVerifier:
    """Who a bearer acts as, for any server that shares a store (the store server, the gateway): scoped tokens'
    records are read from the store on first use and trusted for `TTL_S` seconds, so a revocation or expiry takes
    effect within that on every server (at once on the one that stored it, which calls `forget`)."""

    TTL_S = 10.0
    MAX_CACHED = 10_000  # unknown ids are cached too (as None): a flood of made-up tokens cannot grow it further

    def __init__(self, get_store: Callable[[], Any]):
        self._get_store = get_store
        self._cache: dict[str, tuple[TokenRecord | None, float]] = {}

    async def principal(self, bearer: str) -> Principal | None:
        """Who a scoped token acts as, or None when it is not a valid one (unknown, wrong secret, expired,
        revoked)."""
        parsed = parse_token(bearer)
        if parsed is None:
            return None
        token_id, secret = parsed
        now = time.monotonic()
        hit = self._cache.get(token_id)
        if hit is None or now - hit[1] > self.TTL_S:
            if len(self._cache) >= self.MAX_CACHED:
                self._cache.clear()
            hit = self._cache[token_id] = (await self._get_store().get_token(token_id), now)
        record = hit[0]
        if record is None or not record.valid(secret, time.time()):
            return None
        return Principal(record.role, record.token_id, frozenset(record.attempts))

    def forget(self, token_id: str) -> None:
        self._cache.pop(token_id, None)


Verify = Callable[[str], Awaitable[Principal | None]]
"""Who a bearer token is (None: nobody). A server without a token passes no verifier: everyone is admin."""


def token_verifier(admin_token: str | None, scoped: Verify | None = None) -> Verify | None:
    """The admin token compared in constant time, then (if given) the store's scoped tokens
    (`TokenVerifier.principal`). None without an admin token."""
    if admin_token is None:
        return None
    expected = admin_token.encode()

    async def verify(token: str) -> Principal | None:
        if hmac.compare_digest(token.encode(), expected):
            return ADMIN
        return await scoped(token) if scoped is not None else None

    return verify
