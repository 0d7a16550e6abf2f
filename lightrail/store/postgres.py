"""`PostgresStore`: the store in one PostgreSQL database, shared by several store server processes.

Scale-out model: any number of ``lightrail store serve --db postgresql://...`` processes (on any hosts) serve one
run from one database. Nothing about the run lives in a server: every decision is a PostgreSQL transaction, so
the servers agree because the database does.

Concurrency model: within a process, one event loop (the one that first uses the store) and a pool of asyncpg
connections. Unlike `SQLiteStore`, calls do await between statements, so their atomicity comes from PostgreSQL
(READ COMMITTED), not from the loop:

* Leasing is one statement: the first queued rollout (retries first, then FIFO by ``queue_key``) is picked with
  ``FOR UPDATE SKIP LOCKED``, marked running and its attempt inserted, so two lessees on any servers never get
  one rollout, and neither waits for the other.
* Every other state change locks the rows it reads before deciding (``FOR UPDATE``), attempt before rollout
  everywhere (a deadlock PostgreSQL still detects is retried), and updates running attempts only where
  ``status = 'running'``: heartbeat, finish, cancel and expiry by any server serialize on the attempt's row and
  each attempt ends exactly once.
* Wake-ups cross servers with ``LISTEN/NOTIFY``: writes ``pg_notify`` the ``lightrail_store`` channel in their
  own transaction (``queued``, ``ended``, ``deadline``), delivered at commit to one dedicated listening
  connection per store, which fires the local `Pulse`s that long polls (`lease`, `wait`) and the `LeaseReaper`
  sleep on. Waiters arm their pulse before checking the database, so a notification landing during the check is
  not lost; after the listening connection drops it reconnects and wakes everyone to re-check. No sleep loops.
* Every server's reaper sleeps until the earliest deadline in the database (it learns about new leases taken
  elsewhere from ``deadline`` notifications); when several wake for one expired attempt, the first locks it and
  ends it, the others skip the locked row and find it no longer expired.

Durability: every method commits before it returns (PostgreSQL's ``synchronous_commit`` decides what a commit
survives: the default ``on`` survives power loss). Store servers keep nothing; killing one loses nothing
acknowledged. Timestamps and deadlines are the servers' wall clocks (``time.time()``), so servers on different
hosts need synchronized clocks (NTP): a skew moves expiries by that much.

Layout: as `SQLiteStore`, in the schema ``lightrail``, created on first open under an advisory lock (two servers
starting at once create it once) and version-checked (`SchemaVersionError`). Spans are stored whole as msgspec
JSON in ``bytea`` next to their key columns and inserted with one statement per batch (``unnest`` arrays).

The driver, asyncpg, is imported when a store opens, never by ``import lightrail``. It was chosen over psycopg 3
by measurement on the span path (a batch of 20 ~2 KB spans: 0.85 ms against 4.2 ms) with equal per-transaction
cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import msgspec

from lightrail._retry import Retry
from lightrail.store._lifecycle import (
    LeaseReaper,
    Pulse,
    attempt_deadline,
    expired_status,
    new_session,
    rollout_status_after,
)
from lightrail.store.base import (
    ConflictError,
    NotFoundError,
    StaleAttemptError,
    StoreUnavailableError,
    WaitResult,
    check_id,
    check_ids,
    check_page,
    check_span_ids,
    check_spec_ids,
    check_token_ids,
    unknown_rollouts,
)
from lightrail.store.sqlite import SchemaVersionError
from lightrail.store.tokens import TokenRecord
from lightrail.types import (
    LLM,
    Attempt,
    AttemptStatus,
    ErrorInfo,
    Lease,
    PromptTemplate,
    Resources,
    RetryPolicy,
    Rollout,
    RolloutPage,
    RolloutSpec,
    RolloutStatus,
    Span,
    Task,
    check_attempt_transition,
    check_rollout_transition,
    new_id,
)

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Stored in ``lightrail.meta``; bump it (and add a migration) whenever the tables change."""

SCHEMA = "lightrail"
CHANNEL = "lightrail_store"
_SCHEMA_LOCK = 0x6C69_6768_7472_6169  # pg_advisory_xact_lock key: 'lightrai' (schema creation)
_RESOURCES_LOCK = _SCHEMA_LOCK + 1  # serializes resources versions
_TX_RETRY = Retry(tries=5, base_s=0.001, cap_s=0.016)
"""Deadlocks and serialization failures: the transaction rolled back (nothing applied), so it runs again."""
_LISTEN_RETRY = Retry(tries=None, base_s=0.05, cap_s=2.0)
"""Reconnecting the notification listener, for as long as the store is open."""

# Same tables and invariants as SQLite (CHECK: a rollout has a queue position exactly while queued, an attempt a
# deadline exactly while running). Retries take keys from a descending sequence, so a retry sorts before every
# key handed out before it without reading the queue; fresh rollouts take ascending keys.
_DDL = f"""
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE SEQUENCE {SCHEMA}.queue_keys START 1;
CREATE SEQUENCE {SCHEMA}.retry_keys INCREMENT -1 START 0 MINVALUE -9223372036854775808 MAXVALUE 0;
CREATE TABLE {SCHEMA}.rollouts (
    pos               BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,  -- enqueue order (query_rollouts)
    rollout_id        TEXT PRIMARY KEY,
    status            TEXT NOT NULL,
    queue_key         BIGINT,
    mode              TEXT NOT NULL,
    sample_index      INTEGER NOT NULL,
    resources_version INTEGER,
    created_at        DOUBLE PRECISION NOT NULL,
    ended_at          DOUBLE PRECISION,
    attempts          INTEGER NOT NULL DEFAULT 0,
    reward            DOUBLE PRECISION,
    lease_s           DOUBLE PRECISION NOT NULL,  -- from policy: lets lease and heartbeat set deadlines in SQL
    timeout_s         DOUBLE PRECISION,
    task              BYTEA NOT NULL,
    policy            BYTEA NOT NULL,
    metadata          BYTEA NOT NULL,
    CHECK ((status = 'queued') = (queue_key IS NOT NULL))
);
CREATE INDEX rollouts_queue ON {SCHEMA}.rollouts (queue_key) WHERE queue_key IS NOT NULL;
CREATE INDEX rollouts_status ON {SCHEMA}.rollouts (status);
CREATE TABLE {SCHEMA}.attempts (
    attempt_id        TEXT PRIMARY KEY,
    rollout_id        TEXT NOT NULL REFERENCES {SCHEMA}.rollouts (rollout_id),
    idx               INTEGER NOT NULL,
    worker_id         TEXT NOT NULL,
    status            TEXT NOT NULL,
    started_at        DOUBLE PRECISION NOT NULL,
    lease_expires_at  DOUBLE PRECISION NOT NULL,
    deadline          DOUBLE PRECISION,
    ended_at          DOUBLE PRECISION,
    reward            DOUBLE PRECISION,
    error             BYTEA,
    CHECK ((status = 'running') = (deadline IS NOT NULL))
);
CREATE UNIQUE INDEX attempts_of_rollout ON {SCHEMA}.attempts (rollout_id, idx);
CREATE INDEX attempts_running ON {SCHEMA}.attempts (deadline) WHERE deadline IS NOT NULL;
CREATE TABLE {SCHEMA}.spans (
    attempt_id TEXT NOT NULL REFERENCES {SCHEMA}.attempts (attempt_id),
    span_id    TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    body       BYTEA NOT NULL,  -- the whole Span as msgspec JSON
    PRIMARY KEY (attempt_id, span_id)
);
CREATE INDEX spans_by_seq ON {SCHEMA}.spans (attempt_id, seq);
CREATE TABLE {SCHEMA}.resources (
    version      INTEGER PRIMARY KEY,
    resources_id TEXT NOT NULL UNIQUE,
    created_at   DOUBLE PRECISION NOT NULL,
    items        BYTEA NOT NULL
);
CREATE TABLE {SCHEMA}.tokens (
    token_id TEXT PRIMARY KEY,
    body     BYTEA NOT NULL  -- the TokenRecord as msgspec JSON (the secret's SHA-256, never the secret)
);
INSERT INTO {SCHEMA}.meta VALUES ('schema_version', {SCHEMA_VERSION});
"""

# Version N-1 to N, one entry per bump (run in the migration's transaction, under the schema lock).
_MIGRATIONS = {
    2: f"CREATE TABLE {SCHEMA}.tokens (token_id TEXT PRIMARY KEY, body BYTEA NOT NULL)",
}

_ROLLOUT_COLUMNS = (
    "rollout_id, task, mode, sample_index, resources_version, policy, status, created_at, ended_at, attempts, "
    "reward, metadata"
)
_ATTEMPT_COLUMNS = (
    "attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, ended_at, reward, error"
)
_A_COLUMNS = ", ".join(f"a.{c.strip()}" for c in _ATTEMPT_COLUMNS.split(","))

# -- statements (one round trip each; autocommit unless a method says otherwise) ------------------------------

_ENQUEUE = f"""
WITH ins AS (
    INSERT INTO rollouts (rollout_id, status, queue_key, mode, sample_index, resources_version, created_at,
                          lease_s, timeout_s, task, policy, metadata)
    SELECT t.rollout_id, 'queued', nextval('queue_keys'), t.mode, t.sample_index,
           COALESCE(t.resources_version, (SELECT MAX(version) FROM resources)), $1, t.lease_s, t.timeout_s,
           t.task, t.policy, t.metadata
    FROM unnest($2::text[], $3::text[], $4::int[], $5::int[], $6::float8[], $7::float8[], $8::bytea[],
                $9::bytea[], $10::bytea[])
         AS t(rollout_id, mode, sample_index, resources_version, lease_s, timeout_s, task, policy, metadata)
    ON CONFLICT (rollout_id) DO NOTHING
    RETURNING rollout_id, resources_version
)
SELECT rollout_id, resources_version, (SELECT count(*) FROM pg_notify('{CHANNEL}', 'queued')) FROM ins
"""

# Pick, mark running and start the attempt in one statement: SKIP LOCKED makes concurrent lessees (any server)
# take different rollouts without waiting on each other; the deadline is attempt_deadline() in SQL (LEAST skips
# a NULL timeout).
_LEASE = f"""
WITH next AS (
    SELECT rollout_id FROM rollouts WHERE queue_key IS NOT NULL ORDER BY queue_key LIMIT 1 FOR UPDATE SKIP LOCKED
), r AS (
    UPDATE rollouts SET status = 'running', queue_key = NULL, attempts = rollouts.attempts + 1
    FROM next WHERE rollouts.rollout_id = next.rollout_id
    RETURNING rollouts.*
), a AS (
    INSERT INTO attempts (attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, deadline)
    SELECT $1, r.rollout_id, r.attempts, $2, 'running', $3, $3 + r.lease_s, LEAST($3 + r.lease_s, $3 + r.timeout_s)
    FROM r
    RETURNING deadline
)
SELECT {_ROLLOUT_COLUMNS}, (SELECT count(*) FROM pg_notify('{CHANNEL}', 'deadline:' || (SELECT deadline FROM a))) FROM r
"""

_HEARTBEAT = f"""
UPDATE attempts a SET lease_expires_at = $2 + r.lease_s, deadline = LEAST($2 + r.lease_s, a.started_at + r.timeout_s)
FROM rollouts r
WHERE a.attempt_id = $1 AND a.status = 'running' AND r.rollout_id = a.rollout_id
RETURNING {_A_COLUMNS}
"""

# Row locks in one order everywhere: the attempt, then its rollout (FOR UPDATE OF a, r locks in that order).
_LOCK_ATTEMPT = f"""
SELECT {_A_COLUMNS}, r.status AS rollout_status, r.attempts AS started, r.policy
FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id
WHERE a.attempt_id = $1 FOR UPDATE OF a, r
"""
_LOCK_EXPIRED = f"""
SELECT {_A_COLUMNS}, r.status AS rollout_status, r.attempts AS started, r.policy
FROM attempts a JOIN rollouts r ON r.rollout_id = a.rollout_id
WHERE a.deadline <= $1 ORDER BY a.attempt_id FOR UPDATE OF a, r SKIP LOCKED
"""
_END_ATTEMPT = (
    "UPDATE attempts SET status = $2, ended_at = $3, reward = $4, error = $5, deadline = NULL "
    "WHERE attempt_id = $1 AND status = 'running' RETURNING rollout_id"
)
# The rollout moves only if the attempt was still running (the statement is atomic): an attempt ended meanwhile
# by another server changes nothing and returns no row.
_END_AND_REQUEUE = f"""
WITH a AS ({_END_ATTEMPT})
UPDATE rollouts SET status = 'queued', queue_key = nextval('retry_keys') FROM a WHERE rollouts.rollout_id = a.rollout_id
RETURNING (SELECT count(*) FROM pg_notify('{CHANNEL}', 'queued'))
"""
_END_AND_CLOSE = f"""
WITH a AS ({_END_ATTEMPT})
UPDATE rollouts SET status = $6, ended_at = $3, reward = $4 FROM a WHERE rollouts.rollout_id = a.rollout_id
RETURNING (SELECT count(*) FROM pg_notify('{CHANNEL}', 'ended'))
"""
_READ_ATTEMPT = _LOCK_ATTEMPT.replace(" FOR UPDATE OF a, r", "")

# Validate the whole batch and insert it in one statement: a batch with a bad span inserts nothing, and the first
# bad span (in batch order) is reported.
_ADD_SPANS = """
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bytea[])
             WITH ORDINALITY AS t(attempt_id, rollout_id, span_id, seq, body, ord)
), owners AS (
    SELECT attempt_id, rollout_id FROM attempts WHERE attempt_id = ANY($6::text[])
), bad AS (
    SELECT i.span_id, i.attempt_id, i.rollout_id, o.rollout_id AS owner
    FROM input i LEFT JOIN owners o ON o.attempt_id = i.attempt_id
    WHERE o.rollout_id IS DISTINCT FROM i.rollout_id ORDER BY i.ord LIMIT 1
), ins AS (
    INSERT INTO spans (attempt_id, span_id, seq, body)
    SELECT attempt_id, span_id, seq, body FROM input WHERE NOT EXISTS (SELECT 1 FROM bad)
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT (SELECT count(*) FROM ins) AS added, bad.span_id, bad.attempt_id, bad.owner
FROM (SELECT 1) AS one LEFT JOIN bad ON true
"""

_TERMINAL_AMONG = "SELECT rollout_id FROM rollouts WHERE rollout_id = ANY($1::text[]) AND status = ANY($2::text[])"

_ROLLOUT_STATUS = {s.value: s for s in RolloutStatus}
_ATTEMPT_STATUS = {s.value: s for s in AttemptStatus}
_TERMINAL_ROLLOUT = [s.value for s in RolloutStatus if s.terminal]
_QUEUED = RolloutStatus.QUEUED
_RACED = object()  # _end_attempt: the attempt was no longer running

_encode = msgspec.json.Encoder().encode
_decode_task = msgspec.json.Decoder(Task).decode
_decode_policy = msgspec.json.Decoder(RetryPolicy).decode
_decode_dict = msgspec.json.Decoder(dict[str, Any]).decode
_decode_error = msgspec.json.Decoder(ErrorInfo).decode
_decode_items = msgspec.json.Decoder(dict[str, LLM | PromptTemplate]).decode
_decode_spans = msgspec.json.Decoder(list[Span]).decode
_decode_token = msgspec.json.Decoder(TokenRecord).decode

T = TypeVar("T")


def check_url(url: str) -> str:
    """Return ``url`` if it names a PostgreSQL database, else raise a one-line `ValueError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {url!r} (expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)")
    try:
        parts.port  # noqa: B018 - raises ValueError on a non-numeric port
    except ValueError:
        raise ValueError(f"bad port in PostgreSQL URL {redact(url)!r}") from None
    return url


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class PostgresStore:
    """A `Store` in a PostgreSQL database; several store servers may serve one database at once.

    >>> store = PostgresStore("postgresql://lightrail:s3cret@db.internal:5432/runs")
    >>> rollouts = await store.enqueue([RolloutSpec(task=Task(input={"q": "2+2"}))])   # doctest: +SKIP

    Connections open on first use (or `open`), inside the running event loop, which the store is then bound to.
    The schema ``lightrail`` is created in the database on first open. ``pool_size`` bounds the connections a
    store uses for calls; long polls hold none while they wait (one more connection listens for wake-ups).
    """

    def __init__(self, url: str, *, pool_size: int = 10, connect_timeout_s: float = 10.0) -> None:
        self.url = check_url(url)
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._pool: Any = None
        self._listener: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False
        self._policies: dict[bytes, RetryPolicy] = {}  # decoded policies by their JSON: most rollouts share one
        self._resources: dict[int, Resources] = {}  # versions are immutable once written
        self._queued = Pulse()
        self._ended = Pulse()
        self._reaper = LeaseReaper(self._next_deadline, self._expire)
        self._relisten: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"

    # -- connections ------------------------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create or check the schema, start listening and the reaper. Idempotent; every method calls
        it, so calling it is only needed to fail early (a server at startup)."""
        if self._pool is not None:
            if asyncio.get_running_loop() is not self._loop:
                raise RuntimeError("a PostgresStore is bound to the event loop that opened it; open another store")
            return
        if self._closed:
            raise RuntimeError("the store is closed")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is not None:
                return
            import asyncpg

            try:
                pool = await asyncpg.create_pool(
                    self.url,
                    min_size=1,
                    max_size=self._pool_size,
                    timeout=self._connect_timeout_s,
                    server_settings={"search_path": SCHEMA, "application_name": "lightrail-store"},
                    reset=_rollback_if_in_transaction,  # the default reset costs a round trip per call
                )
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise StoreUnavailableError(f"cannot connect to PostgreSQL at {_where(self.url)}: {exc}") from None
            try:
                await _migrate(pool, self.url)
                self._loop = asyncio.get_running_loop()
                await self._listen()
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            self._reaper.ensure_running()

    async def _listen(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.url, timeout=self._connect_timeout_s)
        await conn.add_listener(CHANNEL, self._on_notify)
        conn.add_termination_listener(self._on_listener_lost)
        self._listener = conn

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if payload == "queued":
            self._queued.fire()
        elif payload == "ended":
            self._ended.fire()
        elif payload.startswith("deadline:"):  # a lease taken by any server: wake the reaper if it is earlier
            self._reaper.reschedule(float(payload[9:]))

    def _on_listener_lost(self, conn: Any) -> None:
        if self._closed or (self._relisten is not None and not self._relisten.done()):
            return
        self._relisten = asyncio.get_running_loop().create_task(self._reconnect_listener(), name="lightrail-relisten")

    async def _reconnect_listener(self) -> None:
        pauses = _LISTEN_RETRY.delays()
        while not self._closed:
            try:
                await self._listen()
            except Exception as exc:
                delay = next(pauses)
                log.warning("lost the PostgreSQL notification connection (%s); reconnecting in %.2f s", exc, delay)
                await asyncio.sleep(delay)
                continue
            # Notifications sent while we were away are gone: everyone re-checks the database.
            self._queued.fire()
            self._ended.fire()
            self._reaper.reschedule()
            return

    async def _run(self, work: Callable[[Any], Awaitable[T]], *, transaction: bool = False) -> T:
        """Run ``work(connection)`` (in one transaction if asked), retrying deadlocks and serialization failures;
        a lost database becomes `StoreUnavailableError` (HTTP 503, which clients retry)."""
        await self.open()
        import asyncpg

        delays = None
        while True:
            try:
                async with self._pool.acquire() as conn:
                    if not transaction:
                        return await work(conn)
                    async with conn.transaction():
                        return await work(conn)
            except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError):
                delays = delays or _TX_RETRY.delays()
                delay = next(delays, None)
                if delay is None:
                    raise
                await asyncio.sleep(delay)
            except (TimeoutError, OSError, asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError) as exc:
                raise StoreUnavailableError(f"PostgreSQL at {_where(self.url)}: {exc}") from exc

    # -- rollouts ---------------------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Queue rollouts; a spec whose ``rollout_id`` is already stored is returned as stored, not re-queued."""
        for i, spec in enumerate(specs):  # the whole batch first: a refused batch stores nothing
            check_spec_ids(spec, f"specs[{i}]")
        if not specs:
            return []
        now = time.time()
        fresh: dict[str, RolloutSpec] = {}
        for spec in specs:
            fresh.setdefault(spec.rollout_id, spec)
        batch = list(fresh.values())
        columns: tuple[list[Any], ...] = ([], [], [], [], [], [], [], [], [])
        for spec in batch:
            for column, value in zip(
                columns,
                (
                    spec.rollout_id,
                    spec.mode,
                    spec.sample_index,
                    spec.resources_version,
                    spec.policy.lease_s,
                    spec.policy.timeout_s,
                    _encode(spec.task),
                    _encode(spec.policy),
                    _encode(spec.metadata),
                ),
                strict=True,
            ):
                column.append(value)

        async def work(conn: Any) -> dict[str, Rollout]:
            inserted = await conn.fetch(_ENQUEUE, now, *columns)
            out = {}
            for rollout_id, version, _ in inserted:
                spec = fresh[rollout_id]
                out[rollout_id] = Rollout(
                    rollout_id=rollout_id,
                    task=spec.task,
                    mode=spec.mode,
                    sample_index=spec.sample_index,
                    resources_version=version,
                    policy=spec.policy,
                    status=RolloutStatus.QUEUED,
                    created_at=now,
                    metadata=spec.metadata,
                )
            if len(out) < len(fresh):  # some were stored before: return them as stored
                out.update(await self._rollouts_by_id(conn, [r for r in fresh if r not in out]))
            return out

        stored = await self._run(work)
        if len(stored) < len(fresh):
            raise AssertionError("enqueue: a rollout was neither inserted nor found")  # pragma: no cover
        self._queued.fire()
        return [msgspec.structs.replace(stored[s.rollout_id]) for s in specs]

    async def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        """Start an attempt on the first queued rollout (retries first, then FIFO), waiting up to ``wait_s``."""
        check_id("worker_id", worker_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
            lease = await self._existing_lease(attempt_id)
            if lease is not None:  # a retried lease request: hand back the same lease
                return lease
        deadline = time.monotonic() + wait_s
        while True:
            armed = self._queued.arm()  # before looking: an enqueue committed meanwhile wakes the wait below
            lease = await self._start_attempt(worker_id, attempt_id or new_id("at"))
            if lease is not None:
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._queued.wait(remaining, armed)

    async def _existing_lease(self, attempt_id: str) -> Lease | None:
        async def work(conn: Any) -> Lease | None:
            row = await conn.fetchrow(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = $1", attempt_id)
            if row is None:
                return None
            return Lease(rollout=await self._rollout(conn, row["rollout_id"]), attempt=_to_attempt(row))

        return await self._run(work)

    async def _start_attempt(self, worker_id: str, attempt_id: str) -> Lease | None:
        import asyncpg

        now = time.time()
        try:
            rows = await self._run(lambda conn: conn.fetch(_LEASE, attempt_id, worker_id, now))
        except asyncpg.UniqueViolationError:  # the same attempt_id leased concurrently (a retried request)
            lease = await self._existing_lease(attempt_id)
            if lease is None:
                raise
            return lease
        if not rows:
            return None
        rollout = self._to_rollout(rows[0])
        lease_expires_at = now + rollout.policy.lease_s
        self._reaper.reschedule(attempt_deadline(now, lease_expires_at, rollout.policy))
        return Lease(
            rollout=rollout,
            attempt=Attempt(
                attempt_id=attempt_id,
                rollout_id=rollout.rollout_id,
                index=rollout.attempts,
                worker_id=worker_id,
                status=AttemptStatus.RUNNING,
                started_at=now,
                lease_expires_at=lease_expires_at,
            ),
        )

    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Renew the attempt's lease; a status other than `running` tells the runner to stop."""
        check_id("attempt_id", attempt_id)

        async def work(conn: Any) -> Attempt:
            row = await conn.fetchrow(_HEARTBEAT, attempt_id, time.time())
            if row is None:  # not running (or unknown): report it as it is
                row = await conn.fetchrow(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = $1", attempt_id)
                if row is None:
                    raise NotFoundError(f"unknown attempt {attempt_id!r}")
            return _to_attempt(row)

        return await self._run(work)

    async def finish(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Attempt:
        """End a running attempt and move its rollout (requeued when the policy retries this outcome)."""
        check_id("attempt_id", attempt_id)

        async def optimistic(conn: Any) -> tuple[Attempt, RolloutStatus | None] | None:
            # The common case in two statements and no transaction: read, decide, then one conditional write that
            # applies only if the attempt is still running (nothing else about it changes while it runs).
            row = await conn.fetchrow(_READ_ATTEMPT, attempt_id)
            if row is None or row[4] != "running" or status is AttemptStatus.LOST:
                return None  # the locked path below reports it
            attempt = _to_attempt(row)
            moved = await self._end_attempt(conn, row, attempt, status, time.time(), reward=reward, error=error)
            return None if moved is _RACED else (attempt, moved)

        async def locked(conn: Any) -> tuple[Attempt, RolloutStatus | None]:
            row = await conn.fetchrow(_LOCK_ATTEMPT, attempt_id)
            if row is None:
                raise NotFoundError(f"unknown attempt {attempt_id!r}")
            attempt = _to_attempt(row)
            if attempt.status.terminal:
                if attempt.status is status and attempt.reward == reward:
                    return attempt, None  # a retried report of the same outcome
                raise StaleAttemptError(
                    f"attempt {attempt_id} already ended as {attempt.status.value!r}; cannot report {status.value!r}"
                )
            if status is AttemptStatus.LOST:
                raise ConflictError("only the store marks an attempt 'lost' (when its lease expires)")
            moved = await self._end_attempt(conn, row, attempt, status, time.time(), reward=reward, error=error)
            assert moved is not _RACED  # the rows are locked
            return attempt, moved

        done = await self._run(optimistic)
        attempt, moved = done if done is not None else await self._run(locked, transaction=True)
        self._fire(moved)
        return attempt

    async def _end_attempt(
        self,
        conn: Any,
        row: Any,
        attempt: Attempt,
        status: AttemptStatus,
        now: float,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Any:
        """End the running ``attempt`` (updated in place) as read in ``row`` (with its rollout's status, attempts
        and policy). Returns where the rollout went, None if it was already terminal, or `_RACED` if the attempt
        had stopped running since ``row`` was read (then nothing was written)."""
        check_attempt_transition(attempt.status, status)
        args = (attempt.attempt_id, status.value, now, reward, None if error is None else _encode(error))
        old = _ROLLOUT_STATUS[row["rollout_status"]]
        if old.terminal:  # e.g. cancelled while this attempt ran
            after, written = None, await conn.fetch(_END_ATTEMPT, *args)
        else:
            after = rollout_status_after(status, row["started"], self._policy(row["policy"]))
            check_rollout_transition(old, after)
            if after is _QUEUED:  # a retry goes to the front of the queue: its task's group is waiting for it
                written = await conn.fetch(_END_AND_REQUEUE, *args)
            else:
                written = await conn.fetch(_END_AND_CLOSE, *args, after.value)
        if not written:
            return _RACED
        attempt.status, attempt.ended_at, attempt.reward, attempt.error = status, now, reward, error
        return after

    def _fire(self, *moved: RolloutStatus | None) -> None:
        if _QUEUED in moved:
            self._queued.fire()
        if any(m is not None and m.terminal for m in moved):
            self._ended.fire()

    async def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        """Cancel queued or running rollouts (running attempts learn it at their next heartbeat). All or nothing:
        an unknown id cancels none."""
        ids = check_ids("rollout_ids", rollout_ids)

        async def work(conn: Any) -> tuple[dict[str, Rollout], bool]:
            now = time.time()
            # attempts before rollouts, like every other writer
            await conn.execute(
                "SELECT 1 FROM attempts WHERE rollout_id = ANY($1::text[]) AND status = 'running' "
                "ORDER BY attempt_id FOR UPDATE",
                ids,
            )
            rows = await conn.fetch(
                "SELECT rollout_id, status FROM rollouts WHERE rollout_id = ANY($1::text[]) "
                "ORDER BY rollout_id FOR UPDATE",
                ids,
            )
            status_of = {r["rollout_id"]: _ROLLOUT_STATUS[r["status"]] for r in rows}
            for rollout_id in ids:
                if rollout_id not in status_of:
                    raise NotFoundError(f"unknown rollout {rollout_id!r}")
            live = [r for r, s in status_of.items() if not s.terminal]
            for rollout_id in live:
                check_rollout_transition(status_of[rollout_id], RolloutStatus.CANCELLED)
            if live:
                await conn.execute(
                    f"""WITH a AS (
                        UPDATE attempts SET status = 'cancelled', ended_at = $2, deadline = NULL
                        WHERE rollout_id = ANY($1::text[]) AND status = 'running'
                    )
                    UPDATE rollouts SET status = 'cancelled', queue_key = NULL, ended_at = $2
                    WHERE rollout_id = ANY($1::text[])
                    RETURNING pg_notify('{CHANNEL}', 'ended')""",
                    live,
                    now,
                )
            return await self._rollouts_by_id(conn, ids), bool(live)

        stored, cancelled = await self._run(work, transaction=True)
        if cancelled:
            self._ended.fire()
        return [msgspec.structs.replace(stored[r]) for r in ids]

    # -- served sessions --------------------------------------------------------------------------------------

    async def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        """Record a served session (a running rollout and its one attempt, never leased, never expired)."""
        check_spec_ids(spec)
        check_id("attempt_id", attempt_id)
        check_id("worker_id", worker_id)

        async def work(conn: Any) -> Lease:
            inserted = await conn.fetchrow(
                "INSERT INTO rollouts (rollout_id, status, queue_key, mode, sample_index, resources_version, "
                "created_at, attempts, lease_s, timeout_s, task, policy, metadata) "
                "VALUES ($1, 'running', NULL, 'served', $2, COALESCE($3, (SELECT MAX(version) FROM resources)), $4, "
                "1, $5, NULL, $6, $7, $8) ON CONFLICT (rollout_id) DO NOTHING RETURNING resources_version",
                spec.rollout_id,
                spec.sample_index,
                spec.resources_version,
                now,
                spec.policy.lease_s,
                _encode(spec.task),
                _encode(spec.policy),
                _encode(spec.metadata),
            )
            if inserted is None:  # stored before (a retried request, or the session's next call)
                rollout = await self._rollout(conn, spec.rollout_id)
                if rollout.mode != "served":
                    raise ConflictError(f"rollout {spec.rollout_id!r} exists and is not a served session")
                row = await conn.fetchrow(
                    f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = $1 AND idx = 1", spec.rollout_id
                )
                return Lease(rollout=rollout, attempt=_to_attempt(row))
            lease = new_session(spec, attempt_id, worker_id, now, None)
            lease.rollout.resources_version = inserted["resources_version"]
            if await conn.fetchval("SELECT 1 FROM attempts WHERE attempt_id = $1", attempt_id):
                raise ConflictError(f"attempt {attempt_id!r} already exists")
            await conn.execute(
                "INSERT INTO attempts (attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, "
                "deadline) VALUES ($1, $2, 1, $3, 'running', $4, $5, $5)",
                attempt_id,
                spec.rollout_id,
                worker_id,
                now,
                lease.attempt.lease_expires_at,
            )
            return lease

        if spec.mode != "served":
            new_session(spec, attempt_id, worker_id, 0.0, None)  # raises the ValueError every store raises
        now = time.time()
        return await self._run(work, transaction=True)

    async def delete_sessions(self, *, created_before: float) -> int:
        """Delete served sessions created before ``created_before`` with their attempts and spans."""
        old = "SELECT rollout_id FROM rollouts WHERE mode = 'served' AND created_at < $1"

        async def work(conn: Any) -> int:
            await conn.execute(
                f"DELETE FROM spans WHERE attempt_id IN (SELECT attempt_id FROM attempts WHERE rollout_id IN ({old}))",
                created_before,
            )
            await conn.execute(f"DELETE FROM attempts WHERE rollout_id IN ({old})", created_before)
            status = await conn.execute(
                "DELETE FROM rollouts WHERE mode = 'served' AND created_at < $1", created_before
            )
            return int(status.split()[-1])

        return await self._run(work, transaction=True)

    async def _next_deadline(self) -> float | None:
        return await self._run(
            lambda conn: conn.fetchval("SELECT MIN(deadline) FROM attempts WHERE deadline IS NOT NULL")
        )

    async def _expire(self, now: float) -> None:
        async def work(conn: Any) -> list[RolloutStatus | None]:
            moved = []
            for row in await conn.fetch(_LOCK_EXPIRED, now):
                attempt = _to_attempt(row)
                status = expired_status(attempt.started_at, self._policy(row["policy"]), now)
                moved.append(await self._end_attempt(conn, row, attempt, status, now))
            return moved

        self._fire(*await self._run(work, transaction=True))

    # -- spans ------------------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Store spans in one statement, ignoring ones already stored (same attempt and span id); returns how
        many were new. The batch is validated first, so a rejected batch stores nothing."""
        check_span_ids(spans)
        if not spans:
            return 0
        attempt_ids = [s.attempt_id for s in spans]
        args = (
            attempt_ids,
            [s.rollout_id for s in spans],
            [s.span_id for s in spans],
            [s.seq for s in spans],
            [_encode(s) for s in spans],
            list(set(attempt_ids)),
        )
        row = await self._run(lambda conn: conn.fetchrow(_ADD_SPANS, *args))
        added, span_id, attempt_id, owner = row
        if span_id is not None:
            if owner is None:
                raise NotFoundError(f"span {span_id}: unknown attempt {attempt_id!r}")
            rollout_id = next(s.rollout_id for s in spans if s.span_id == span_id and s.attempt_id == attempt_id)
            raise ConflictError(f"span {span_id}: attempt {attempt_id} is not of {rollout_id}")
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (all attempts, or one), ordered by attempt then ``seq``."""
        check_id("rollout_id", rollout_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)

        async def work(conn: Any) -> list[bytes]:
            if attempt_id is None:
                bodies = await conn.fetchval(
                    "SELECT array(SELECT s.body FROM attempts a JOIN spans s ON s.attempt_id = a.attempt_id "
                    "WHERE a.rollout_id = $1 ORDER BY a.idx, s.seq)",
                    rollout_id,
                )
                if not bodies:  # no spans yet, or no such rollout
                    await self._require_rollout(conn, rollout_id)
                return bodies
            owner, bodies = await conn.fetchrow(
                "SELECT (SELECT rollout_id FROM attempts WHERE attempt_id = $1), "
                "array(SELECT body FROM spans WHERE attempt_id = $1 ORDER BY seq)",
                attempt_id,
            )
            if owner != rollout_id:
                await self._require_rollout(conn, rollout_id)
                raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
            return bodies

        bodies = await self._run(work)
        # one decode call for the whole list: the stored documents joined into a JSON array
        return _decode_spans(b"[" + b",".join(bodies) + b"]")

    # -- resources --------------------------------------------------------------------------------------------

    async def put_resources(self, resources: Resources) -> Resources:
        """Store a new version of the resources; a retried put (same ``resources_id``) returns the stored one."""
        check_id("resources_id", resources.resources_id)

        async def work(conn: Any) -> Resources:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _RESOURCES_LOCK)  # versions: one writer at a time
            row = await conn.fetchrow(
                "SELECT version, resources_id, created_at, items FROM resources WHERE resources_id = $1",
                resources.resources_id,
            )
            if row is not None:
                stored = self._to_resources(row)
                if stored.items != resources.items:
                    raise ConflictError(f"resources {resources.resources_id} already stored with different items")
                return stored
            now = time.time()
            version = await conn.fetchval(
                "INSERT INTO resources (version, resources_id, created_at, items) "
                "VALUES ((SELECT COALESCE(MAX(version), 0) + 1 FROM resources), $1, $2, $3) RETURNING version",
                resources.resources_id,
                now,
                _encode(resources.items),
            )
            return msgspec.structs.replace(resources, version=version, created_at=now)

        stored = await self._run(work, transaction=True)
        self._resources[stored.version] = stored
        return stored

    async def get_resources(self, version: int | None = None) -> Resources | None:
        """A version of the resources, or the latest when ``version`` is None (None if there are none yet)."""
        if version is not None and version in self._resources:
            return self._resources[version]

        async def work(conn: Any) -> Resources | None:
            if version is None:
                row = await conn.fetchrow(
                    "SELECT version, resources_id, created_at, items FROM resources ORDER BY version DESC LIMIT 1"
                )
                return None if row is None else self._to_resources(row)
            row = await conn.fetchrow(
                "SELECT version, resources_id, created_at, items FROM resources WHERE version = $1", version
            )
            if row is None:
                raise NotFoundError(f"unknown resources version {version}")
            return self._to_resources(row)

        return await self._run(work)

    # -- scoped tokens ----------------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        check_token_ids(record)

        async def work(conn: Any) -> None:
            await conn.execute(
                "INSERT INTO tokens (token_id, body) VALUES ($1, $2) "
                "ON CONFLICT (token_id) DO UPDATE SET body = excluded.body",
                record.token_id,
                _encode(record),
            )

        await self._run(work)

    async def get_token(self, token_id: str) -> TokenRecord | None:
        check_id("token_id", token_id)

        async def work(conn: Any) -> TokenRecord | None:
            body = await conn.fetchval("SELECT body FROM tokens WHERE token_id = $1", token_id)
            return None if body is None else _decode_token(body)

        return await self._run(work)

    async def list_tokens(self) -> list[TokenRecord]:
        async def work(conn: Any) -> list[TokenRecord]:
            return [_decode_token(row[0]) for row in await conn.fetch("SELECT body FROM tokens")]

        return sorted(await self._run(work), key=lambda r: r.created_at)

    def _to_resources(self, row: Any) -> Resources:
        version, resources_id, created_at, items = row
        stored = self._resources.get(version)
        if stored is None:
            stored = self._resources[version] = Resources(
                items=_decode_items(items), version=version, resources_id=resources_id, created_at=created_at
            )
        return stored

    # -- queries ----------------------------------------------------------------------------------------------

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout as stored now; `NotFoundError` for an unknown id."""
        check_id("rollout_id", rollout_id)
        return await self._run(lambda conn: self._rollout(conn, rollout_id))

    async def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]:
        """Rollouts in any of ``status`` (all when None), among ``rollout_ids`` (all when None; an unknown id
        raises `NotFoundError`). Listed ids come back in the order given, otherwise in enqueue order."""
        wanted = None if status is None else {RolloutStatus(s) for s in status}
        if rollout_ids is not None:
            ids = check_ids("rollout_ids", rollout_ids)
            stored = await self._run(lambda conn: self._rollouts_by_id(conn, ids))
            out = []
            for rollout_id in ids:
                rollout = stored.get(rollout_id)
                if rollout is None:
                    raise NotFoundError(f"unknown rollout {rollout_id!r}")
                if wanted is None or rollout.status in wanted:
                    out.append(msgspec.structs.replace(rollout))
            return out
        if wanted is None:
            rows = await self._run(lambda conn: conn.fetch(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts ORDER BY pos"))
        else:
            values = [s.value for s in wanted]
            rows = await self._run(
                lambda conn: conn.fetch(
                    f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE status = ANY($1::text[]) ORDER BY pos", values
                )
            )
        return [self._to_rollout(row) for row in rows]

    async def query_rollouts_page(
        self,
        *,
        status: Iterable[RolloutStatus] | None = None,
        mode: str | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        offset: int = 0,
        before: int | None = None,
    ) -> RolloutPage:
        """See `Store.query_rollouts_page`; positions are ``pos`` (enqueue order)."""
        check_page(limit, offset, before, metadata)
        where: list[str] = ["true"]
        params: list[Any] = []
        if status is not None:
            params.append(sorted({RolloutStatus(s).value for s in status}))
            where.append(f"status = ANY(${len(params)}::text[])")
        if mode is not None:
            params.append(mode)
            where.append(f"mode = ${len(params)}")
        for key, value in (metadata or {}).items():
            params += [key, value]
            where.append(f"(convert_from(metadata, 'UTF8')::jsonb ->> ${len(params) - 1}) = ${len(params)}")
        condition = " AND ".join(where)
        page_where, page_params = list(where), list(params)
        if before is not None:
            page_params.append(before)
            page_where.append(f"pos < ${len(page_params)}")
        page_params += [limit + 1, offset]
        page_sql = (
            f"SELECT {_ROLLOUT_COLUMNS}, pos FROM rollouts WHERE {' AND '.join(page_where)} "
            f"ORDER BY pos DESC LIMIT ${len(page_params) - 1} OFFSET ${len(page_params)}"
        )

        async def read(conn: Any) -> tuple[int, list[Any]]:
            total = await conn.fetchval(f"SELECT count(*) FROM rollouts WHERE {condition}", *params)
            return total, await conn.fetch(page_sql, *page_params)

        total, rows = await self._run(read, transaction=True)
        page = [self._to_rollout(row) for row in rows[:limit]]
        return RolloutPage(
            rollouts=page, total=total, next_before=rows[limit - 1]["pos"] if len(rows) > limit else None
        )

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""
        check_id("rollout_id", rollout_id)

        async def work(conn: Any) -> list[Any]:
            rows = await conn.fetch(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = $1 ORDER BY idx", rollout_id
            )
            if not rows:
                await self._require_rollout(conn, rollout_id)
            return rows

        return [_to_attempt(row) for row in await self._run(work)]

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        """Block until every listed rollout is terminal or the timeout passes; returns the terminal ones in the
        order listed, with the others' current states (`WaitResult`). Woken by rollouts ending on any server."""
        ids = check_ids("rollout_ids", rollout_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = set(ids)
        existing = await self._run(
            lambda conn: conn.fetch("SELECT rollout_id FROM rollouts WHERE rollout_id = ANY($1::text[])", list(pending))
        )
        missing = pending - {r[0] for r in existing}
        if missing:
            raise unknown_rollouts(r for r in ids if r in missing)
        while True:
            armed = self._ended.arm()  # before reading: a rollout ending meanwhile wakes the wait below
            # Only rollouts still pending are re-read after a wake-up: O(pending) per finished rollout.
            still = list(pending)

            async def terminal(conn: Any, ids: list[str] = still) -> list[Any]:
                return await conn.fetch(_TERMINAL_AMONG, ids, _TERMINAL_ROLLOUT)

            ended = await self._run(terminal)
            pending -= {r[0] for r in ended}
            remaining = None if deadline is None else deadline - time.monotonic()
            if not pending or (remaining is not None and remaining <= 0):
                break
            await self._ended.wait(remaining, armed)
        stored = await self._run(lambda conn: self._rollouts_by_id(conn, ids))
        return WaitResult(msgspec.structs.replace(stored[r]) for r in ids)

    async def counts(self) -> dict[RolloutStatus, int]:
        """How many rollouts are in each status."""
        out = dict.fromkeys(RolloutStatus, 0)
        rows = await self._run(lambda conn: conn.fetch("SELECT status, COUNT(*) FROM rollouts GROUP BY status"))
        for status, n in rows:
            out[_ROLLOUT_STATUS[status]] = n
        return out

    async def close(self) -> None:
        """Stop the reaper and the listener and close the connections. Waiters are not resumed."""
        if self._closed:
            return
        self._closed = True
        await self._reaper.close()
        if self._relisten is not None:
            self._relisten.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relisten
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=5)
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 5)

    # -- helpers ----------------------------------------------------------------------------------------------

    def _policy(self, blob: bytes) -> RetryPolicy:
        policy = self._policies.get(blob)
        if policy is None:
            if len(self._policies) >= 256:
                self._policies.clear()
            policy = self._policies[blob] = _decode_policy(blob)
        return policy

    def _to_rollout(self, row: Any) -> Rollout:
        return Rollout(
            rollout_id=row[0],
            task=_decode_task(row[1]),
            mode=row[2],
            sample_index=row[3],
            resources_version=row[4],
            policy=self._policy(row[5]),
            status=_ROLLOUT_STATUS[row[6]],
            created_at=row[7],
            ended_at=row[8],
            attempts=row[9],
            reward=row[10],
            metadata=_decode_dict(row[11]),
        )

    async def _rollout(self, conn: Any, rollout_id: str) -> Rollout:
        row = await conn.fetchrow(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = $1", rollout_id)
        if row is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")
        return self._to_rollout(row)

    async def _rollouts_by_id(self, conn: Any, ids: list[str]) -> dict[str, Rollout]:
        rows = await conn.fetch(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY($1::text[])", ids)
        return {row[0]: self._to_rollout(row) for row in rows}

    @staticmethod
    async def _require_rollout(conn: Any, rollout_id: str) -> None:
        if await conn.fetchval("SELECT 1 FROM rollouts WHERE rollout_id = $1", rollout_id) is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")


def _to_attempt(row: Any) -> Attempt:
    return Attempt(
        attempt_id=row[0],
        rollout_id=row[1],
        index=row[2],
        worker_id=row[3],
        status=_ATTEMPT_STATUS[row[4]],
        started_at=row[5],
        lease_expires_at=row[6],
        ended_at=row[7],
        reward=row[8],
        error=None if row[9] is None else _decode_error(row[9]),
    )


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}/{parts.path.lstrip('/')}"


async def _rollback_if_in_transaction(conn: Any) -> None:
    if conn.is_in_transaction():  # only after a cancelled call: never hand the next one a half-done transaction
        await conn.execute("ROLLBACK")


async def _migrate(pool: Any, url: str) -> None:
    """Create the schema on first open or check its version; the advisory lock makes concurrent first opens (two
    servers starting together) create it once."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
        if await conn.fetchval("SELECT to_regnamespace($1)", SCHEMA) is None:
            await conn.execute(_DDL)
            return
        if await conn.fetchval("SELECT to_regclass($1)", f"{SCHEMA}.meta") is None:
            raise SchemaVersionError(f"{_where(url)} has a schema {SCHEMA!r} that is not a lightrail store")
        version = await conn.fetchval(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'schema_version'")
        if version is None or version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{_where(url)} has store schema version {version}, newer than the {SCHEMA_VERSION} this lightrail "
                "understands; upgrade lightrail to open it"
            )
        for step in range(version + 1, SCHEMA_VERSION + 1):
            await conn.execute(_MIGRATIONS[step])
            await conn.execute(f"UPDATE {SCHEMA}.meta SET value = $1 WHERE key = 'schema_version'", step)
