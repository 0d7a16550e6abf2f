"""`SQLiteStore`: the default durable store, one SQLite file in WAL mode.

Concurrency model: one connection, used from one event loop. Every public method runs its SQL synchronously
inside one transaction (``BEGIN IMMEDIATE`` for writes) and never awaits in between, so each call is atomic,
exactly like `MemoryStore`. Operations take tens of microseconds to about a millisecond, which is cheaper on the
loop thread than a hop to a worker thread. Long-polls (`lease` with ``wait_s``, `wait`) sleep on in-memory
`Pulse` wake-ups fired by this store's own writes, and a `LeaseReaper` ends attempts at their deadline; waiters
live only in memory, everything else is in the file.

Other processes may open the same file: WAL lets them read while this store writes (a second writer would wait
on SQLite's lock for up to ``busy_timeout_s``, blocking its loop, and its writes wake nobody here).

Durability: an acknowledged write (a method that returned) survives a crash of any process, ``kill -9``
included: with ``synchronous=NORMAL`` a commit is in the WAL file before the call returns, only not yet fsynced.
Surviving power loss or an OS crash needs ``synchronous="FULL"`` (an fsync per commit, much slower on most disks).

Restart: opening an existing file resumes everything. Queued rollouts stay queued in their order, running
attempts keep their (wall-clock) deadlines and are expired by the reaper if their runners are gone (the reaper
starts with the first transaction on the loop, whichever method runs it), resources versions continue at the
next number.

Layout: structured columns for what is queried or updated (ids, status, timestamps, reward, indices, versions),
msgspec-JSON for the rest. A span is stored whole as one JSON document next to its key columns, so
`query_spans` decodes a rollout's spans in one call.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import msgspec

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
    StoreError,
    WaitResult,
    check_id,
    check_ids,
    check_page,
    check_span_ids,
    check_spec_ids,
    check_token_ids,
    metadata_path,
    unknown_rollouts,
)
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

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "SchemaVersionError"]

SCHEMA_VERSION = 2
"""Stored in ``PRAGMA user_version``; bump it (and add a migration) whenever the tables change."""

# Invariants the schema enforces itself (CHECK): a rollout has a queue position exactly while it is queued, and an
# attempt has a deadline exactly while it is running. Both positions are the hot-path indexes.
_SCHEMA = f"""
CREATE TABLE rollouts (
    rollout_id        TEXT PRIMARY KEY,
    status            TEXT NOT NULL,
    queue_key         INTEGER,  -- lease order, smallest first (a retry takes a key below every queued one)
    mode              TEXT NOT NULL,
    sample_index      INTEGER NOT NULL,
    resources_version INTEGER,
    created_at        REAL NOT NULL,
    ended_at          REAL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    reward            REAL,
    task              BLOB NOT NULL,
    policy            BLOB NOT NULL,
    metadata          BLOB NOT NULL,
    CHECK ((status = 'queued') = (queue_key IS NOT NULL))
);
CREATE INDEX rollouts_queue ON rollouts (queue_key) WHERE queue_key IS NOT NULL;
CREATE INDEX rollouts_status ON rollouts (status);

CREATE TABLE attempts (
    attempt_id        TEXT PRIMARY KEY,
    rollout_id        TEXT NOT NULL REFERENCES rollouts (rollout_id),
    idx               INTEGER NOT NULL,
    worker_id         TEXT NOT NULL,
    status            TEXT NOT NULL,
    started_at        REAL NOT NULL,
    lease_expires_at  REAL NOT NULL,
    deadline          REAL,  -- when the store ends it on its own (lease or time budget); NULL once ended
    ended_at          REAL,
    reward            REAL,
    error             BLOB,
    CHECK ((status = 'running') = (deadline IS NOT NULL))
);
CREATE UNIQUE INDEX attempts_of_rollout ON attempts (rollout_id, idx);
CREATE INDEX attempts_running ON attempts (deadline) WHERE deadline IS NOT NULL;

CREATE TABLE spans (
    attempt_id TEXT NOT NULL REFERENCES attempts (attempt_id),
    span_id    TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    body       BLOB NOT NULL,  -- the whole Span as msgspec JSON
    UNIQUE (attempt_id, span_id)
);
CREATE INDEX spans_by_seq ON spans (attempt_id, seq);

CREATE TABLE resources (
    version      INTEGER PRIMARY KEY,
    resources_id TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    items        BLOB NOT NULL
);

CREATE TABLE tokens (
    token_id TEXT PRIMARY KEY,
    body     BLOB NOT NULL  -- the TokenRecord as msgspec JSON (the secret's SHA-256, never the secret)
);

PRAGMA user_version = {SCHEMA_VERSION};
"""

# Version N-1 to N, one entry per bump (statements run in the migration's transaction).
_MIGRATIONS = {
    2: ["CREATE TABLE tokens (token_id TEXT PRIMARY KEY, body BLOB NOT NULL)"],
}

_ROLLOUT_COLUMNS = (
    "rollout_id, task, mode, sample_index, resources_version, policy, status, created_at, ended_at, attempts, "
    "reward, metadata"
)
_ATTEMPT_COLUMNS = (
    "attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, ended_at, reward, error"
)

_ROLLOUT_STATUS = {s.value: s for s in RolloutStatus}
_ATTEMPT_STATUS = {s.value: s for s in AttemptStatus}
_TERMINAL_ROLLOUT = tuple(s.value for s in RolloutStatus if s.terminal)
_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")

_encode = msgspec.json.Encoder().encode
_decode_task = msgspec.json.Decoder(Task).decode
_decode_policy = msgspec.json.Decoder(RetryPolicy).decode
_decode_dict = msgspec.json.Decoder(dict[str, Any]).decode
_decode_error = msgspec.json.Decoder(ErrorInfo).decode
_decode_items = msgspec.json.Decoder(dict[str, LLM | PromptTemplate]).decode
_decode_spans = msgspec.json.Decoder(list[Span]).decode
_decode_token = msgspec.json.Decoder(TokenRecord).decode


class SchemaVersionError(StoreError):
    """The file was written by a newer lightrail (or is not a lightrail store): upgrade lightrail to open it."""


class SQLiteStore:
    """A `Store` in one SQLite file; the default for a single machine.

    >>> store = SQLiteStore("store.db")          # created on first use, resumed on the next
    >>> rollouts = await store.enqueue([RolloutSpec(task=Task(input={"q": "2+2"}))])
    >>> rollouts[0].status
    <RolloutStatus.QUEUED: 'queued'>
    >>> await store.close()

    (Top-level ``await`` as in ``python -m asyncio``; in a script, inside an ``async def``.)

    ``synchronous`` is SQLite's setting: ``"NORMAL"`` (default) loses nothing acknowledged when a process
    crashes; ``"FULL"`` also survives power loss. ``busy_timeout_s`` bounds how long a write waits for another
    process holding the write lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout_s: float = 5.0,
    ) -> None:
        synchronous = synchronous.upper()
        if synchronous not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        self.path = os.fspath(path)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves. check_same_thread=False: a server may build the
        # store in one thread and run it on its loop thread; it is still used from one loop at a time.
        try:
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False, cached_statements=64
            )
        except sqlite3.Error as exc:  # sqlite3 does not say which file
            raise StoreError(f"cannot open the SQLite store {self.path}: {exc}") from None
        try:
            self._configure(synchronous)
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"cannot open the SQLite store {self.path}: {exc}") from None
        except BaseException:
            self._db.close()
            raise
        self._policies: dict[bytes, RetryPolicy] = {}  # decoded policies by their JSON: most rollouts share one
        self._resources: dict[int, Resources] = {}  # versions are immutable once written
        self._queued = Pulse()
        self._ended = Pulse()
        self._reaper = LeaseReaper(self._next_deadline, self._expire)
        self._closed = False

    def _configure(self, synchronous: str) -> None:
        db = self._db
        # 8 KiB pages: a ~2.5 KiB span fits three to a page instead of one to a 4 KiB page (less WAL to write);
        # only takes effect when the file is created.
        db.execute("PRAGMA page_size = 8192")
        db.execute("PRAGMA journal_mode = WAL")  # persistent in the file; readers never block the writer
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("PRAGMA foreign_keys = ON")
        db.execute("PRAGMA temp_store = MEMORY")
        # SQLite's default 2 MiB of page cache: reads go through the map below (the kernel's file pages, which it can
        # drop), so a larger cache only held copies and grew a long-lived server's heap with the file (a 64 MiB
        # cache: +92% anonymous memory over a 10,000-rollout soak, no faster in bench/store.py).
        db.execute("PRAGMA cache_size = -2048")
        db.execute("PRAGMA mmap_size = 268435456")  # reads through a 256 MiB map instead of read() calls
        # Checkpoint the WAL into the file every ~16 MiB of commits (fewer, larger checkpoints than the 4 MiB
        # default), and truncate the WAL back to 64 MiB after a checkpoint so a burst does not leave it huge.
        db.execute("PRAGMA wal_autocheckpoint = 2000")
        db.execute("PRAGMA journal_size_limit = 67108864")

    def _migrate(self) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")  # two processes creating one file: the second sees the first's schema
        try:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.path} has store schema version {version}, newer than the {SCHEMA_VERSION} this lightrail "
                    "understands; upgrade lightrail to open it"
                )
            if version == 0:
                if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone():
                    raise SchemaVersionError(f"{self.path} is an SQLite file but not a lightrail store")
                # statement by statement (executescript would COMMIT our transaction first)
                statement = ""
                for line in _SCHEMA.splitlines(keepends=True):
                    statement += line
                    if sqlite3.complete_statement(statement):
                        db.execute(statement)
                        statement = ""
            else:
                for step in range(version + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS[step]:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {step}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- transactions -----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. IMMEDIATE takes the write lock up front, so a read-then-write never fails
        half-way on a lock upgrade."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            self._reaper.ensure_running()  # after BEGIN: a closed store fails first and starts nothing
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT (disk full, I/O error) may leave the transaction open
                db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: several SELECTs see one snapshot even if another process writes."""
        db = self._db
        db.execute("BEGIN")
        try:
            self._reaper.ensure_running()  # after BEGIN: a closed store fails first and starts nothing
            yield db
        finally:
            db.execute("COMMIT")

    # -- rollouts ---------------------------------------------------------------------------------------------

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Queue rollouts; a spec whose ``rollout_id`` is already stored is returned as stored, not re-queued."""
        for i, spec in enumerate(specs):  # the whole batch first: a refused batch stores nothing
            check_spec_ids(spec, f"specs[{i}]")
        if not specs:
            return []
        now = time.time()
        out: dict[str, Rollout] = {}
        with self._write() as db:
            stored = self._rollouts_by_id(db, [s.rollout_id for s in specs])
            (latest,) = db.execute("SELECT MAX(version) FROM resources").fetchone()
            (tail,) = db.execute("SELECT MAX(queue_key) FROM rollouts WHERE queue_key IS NOT NULL").fetchone()
            key = tail or 0
            rows = []
            for spec in specs:
                if spec.rollout_id in stored or spec.rollout_id in out:
                    continue
                version = spec.resources_version if spec.resources_version is not None else latest
                key += 1
                rows.append(
                    (
                        spec.rollout_id,
                        key,
                        spec.mode,
                        spec.sample_index,
                        version,
                        now,
                        _encode(spec.task),
                        _encode(spec.policy),
                        _encode(spec.metadata),
                    )
                )
                out[spec.rollout_id] = Rollout(
                    rollout_id=spec.rollout_id,
                    task=spec.task,
                    mode=spec.mode,
                    sample_index=spec.sample_index,
                    resources_version=version,
                    policy=spec.policy,
                    status=RolloutStatus.QUEUED,
                    created_at=now,
                    metadata=spec.metadata,
                )
            db.executemany(
                "INSERT INTO rollouts (rollout_id, status, queue_key, mode, sample_index, resources_version, "
                "created_at, task, policy, metadata) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        if rows:
            self._queued.fire()
        stored.update(out)
        # copies, so a caller mutating one result does not change another (a spec may be listed twice)
        return [msgspec.structs.replace(stored[s.rollout_id]) for s in specs]

    async def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        """Start an attempt on the first queued rollout (retries first, then FIFO), waiting up to ``wait_s``."""
        check_id("worker_id", worker_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
            with self._read() as db:
                attempt = self._attempt_or_none(db, attempt_id)
                if attempt is not None:  # a retried lease request: hand back the same lease
                    return Lease(rollout=self._rollout(db, attempt.rollout_id), attempt=attempt)
        deadline = time.monotonic() + wait_s
        while True:
            lease = self._start_attempt(worker_id, attempt_id or new_id("at"))
            if lease is not None:
                return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._queued.wait(remaining)

    def _start_attempt(self, worker_id: str, attempt_id: str) -> Lease | None:
        now = time.time()
        with self._write() as db:
            rows = db.execute(
                f"UPDATE rollouts SET status = 'running', queue_key = NULL, attempts = attempts + 1 "
                f"WHERE rollout_id = (SELECT rollout_id FROM rollouts WHERE queue_key IS NOT NULL "
                f"ORDER BY queue_key LIMIT 1) RETURNING {_ROLLOUT_COLUMNS}"
            ).fetchall()  # fetch every row: a RETURNING statement still stepping would block COMMIT
            if not rows:
                return None
            rollout = self._to_rollout(rows[0])
            policy = rollout.policy
            attempt = Attempt(
                attempt_id=attempt_id,
                rollout_id=rollout.rollout_id,
                index=rollout.attempts,
                worker_id=worker_id,
                status=AttemptStatus.RUNNING,
                started_at=now,
                lease_expires_at=now + policy.lease_s,
            )
            db.execute(
                "INSERT INTO attempts (attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, "
                "deadline) VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
                (
                    attempt_id,
                    rollout.rollout_id,
                    attempt.index,
                    worker_id,
                    now,
                    attempt.lease_expires_at,
                    attempt_deadline(now, attempt.lease_expires_at, policy),
                ),
            )
        self._reaper.reschedule()
        return Lease(rollout=rollout, attempt=attempt)

    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Renew the attempt's lease; a status other than `running` tells the runner to stop."""
        check_id("attempt_id", attempt_id)
        with self._write() as db:
            attempt = self._attempt(db, attempt_id)
            if attempt.status is AttemptStatus.RUNNING:
                (policy_json,) = db.execute(
                    "SELECT policy FROM rollouts WHERE rollout_id = ?", (attempt.rollout_id,)
                ).fetchone()
                policy = self._policy(policy_json)
                attempt.lease_expires_at = time.time() + policy.lease_s
                db.execute(
                    "UPDATE attempts SET lease_expires_at = ?, deadline = ? WHERE attempt_id = ?",
                    (
                        attempt.lease_expires_at,
                        attempt_deadline(attempt.started_at, attempt.lease_expires_at, policy),
                        attempt_id,
                    ),
                )
        return attempt

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
        with self._write() as db:
            attempt = self._attempt(db, attempt_id)
            if attempt.status.terminal:
                if attempt.status is status and attempt.reward == reward:
                    return attempt  # a retried report of the same outcome
                raise StaleAttemptError(
                    f"attempt {attempt_id} already ended as {attempt.status.value!r}; cannot report {status.value!r}"
                )
            if status is AttemptStatus.LOST:
                raise ConflictError("only the store marks an attempt 'lost' (when its lease expires)")
            moved = self._end_attempt(db, attempt, status, time.time(), reward=reward, error=error)
        self._fire(moved)
        return attempt

    def _end_attempt(
        self,
        db: sqlite3.Connection,
        attempt: Attempt,
        status: AttemptStatus,
        now: float,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> RolloutStatus | None:
        """End ``attempt`` (updated in place) inside the caller's transaction; returns where its rollout went,
        or None if the rollout was already terminal. The caller fires the wake-ups after committing."""
        check_attempt_transition(attempt.status, status)
        attempt.status, attempt.ended_at, attempt.reward, attempt.error = status, now, reward, error
        db.execute(
            "UPDATE attempts SET status = ?, ended_at = ?, reward = ?, error = ?, deadline = NULL WHERE attempt_id = ?",
            (status.value, now, reward, None if error is None else _encode(error), attempt.attempt_id),
        )
        old, started, policy_json = db.execute(
            "SELECT status, attempts, policy FROM rollouts WHERE rollout_id = ?", (attempt.rollout_id,)
        ).fetchone()
        old = _ROLLOUT_STATUS[old]
        if old.terminal:  # e.g. cancelled while this attempt ran
            return None
        after = rollout_status_after(status, started, self._policy(policy_json))
        check_rollout_transition(old, after)
        if after is RolloutStatus.QUEUED:
            # A retry goes to the front of the queue: its task's group is waiting for it.
            db.execute(
                "UPDATE rollouts SET status = 'queued', queue_key = "
                "(SELECT COALESCE(MIN(queue_key), 0) - 1 FROM rollouts WHERE queue_key IS NOT NULL) "
                "WHERE rollout_id = ?",
                (attempt.rollout_id,),
            )
        else:
            db.execute(
                "UPDATE rollouts SET status = ?, ended_at = ?, reward = ? WHERE rollout_id = ?",
                (after.value, now, reward, attempt.rollout_id),
            )
        return after

    def _fire(self, *moved: RolloutStatus | None) -> None:
        if RolloutStatus.QUEUED in moved:
            self._queued.fire()
        if any(m is not None and m.terminal for m in moved):
            self._ended.fire()

    async def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        """Cancel queued or running rollouts (running attempts learn it at their next heartbeat). All or nothing:
        an unknown id cancels none."""
        now = time.time()
        ids = check_ids("rollout_ids", rollout_ids)
        cancelled = False
        with self._write() as db:
            for rollout_id in ids:
                row = db.execute("SELECT status FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
                if row is None:
                    raise NotFoundError(f"unknown rollout {rollout_id!r}")
                status = _ROLLOUT_STATUS[row[0]]
                if status.terminal:
                    continue
                check_rollout_transition(status, RolloutStatus.CANCELLED)
                db.execute(
                    "UPDATE rollouts SET status = 'cancelled', queue_key = NULL, ended_at = ? WHERE rollout_id = ?",
                    (now, rollout_id),
                )
                db.execute(
                    "UPDATE attempts SET status = 'cancelled', ended_at = ?, deadline = NULL "
                    "WHERE rollout_id = ? AND status = 'running'",
                    (now, rollout_id),
                )
                cancelled = True
            stored = self._rollouts_by_id(db, ids)
        if cancelled:
            self._ended.fire()
        return [msgspec.structs.replace(stored[r]) for r in ids]

    # -- served sessions --------------------------------------------------------------------------------------

    async def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        """Record a served session (a running rollout and its one attempt, never leased, never expired)."""
        check_spec_ids(spec)
        check_id("attempt_id", attempt_id)
        check_id("worker_id", worker_id)
        with self._write() as db:
            row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (spec.rollout_id,))
            row = row.fetchone()
            if row is not None:
                rollout = self._to_rollout(row)
                if rollout.mode != "served":
                    raise ConflictError(f"rollout {spec.rollout_id!r} exists and is not a served session")
                first = db.execute(
                    f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? AND idx = 1", (spec.rollout_id,)
                ).fetchone()
                return Lease(rollout=rollout, attempt=self._to_attempt(first))
            if self._attempt_or_none(db, attempt_id) is not None:
                raise ConflictError(f"attempt {attempt_id!r} already exists")
            (latest,) = db.execute("SELECT MAX(version) FROM resources").fetchone()
            lease = new_session(spec, attempt_id, worker_id, time.time(), latest)
            rollout, attempt = lease.rollout, lease.attempt
            db.execute(
                "INSERT INTO rollouts (rollout_id, status, queue_key, mode, sample_index, resources_version, "
                "created_at, attempts, task, policy, metadata) VALUES (?, 'running', NULL, 'served', ?, ?, ?, 1, ?, ?, ?)",
                (
                    rollout.rollout_id,
                    rollout.sample_index,
                    rollout.resources_version,
                    rollout.created_at,
                    _encode(rollout.task),
                    _encode(rollout.policy),
                    _encode(rollout.metadata),
                ),
            )
            db.execute(
                "INSERT INTO attempts (attempt_id, rollout_id, idx, worker_id, status, started_at, lease_expires_at, "
                "deadline) VALUES (?, ?, 1, ?, 'running', ?, ?, ?)",
                (
                    attempt_id,
                    rollout.rollout_id,
                    worker_id,
                    attempt.started_at,
                    attempt.lease_expires_at,
                    attempt.lease_expires_at,
                ),
            )
        return lease

    async def delete_sessions(self, *, created_before: float) -> int:
        """Delete served sessions created before ``created_before`` with their attempts and spans."""
        old = "SELECT rollout_id FROM rollouts WHERE mode = 'served' AND created_at < ?"
        with self._write() as db:
            db.execute(
                f"DELETE FROM spans WHERE attempt_id IN (SELECT attempt_id FROM attempts WHERE rollout_id IN ({old}))",
                (created_before,),
            )
            db.execute(f"DELETE FROM attempts WHERE rollout_id IN ({old})", (created_before,))
            deleted = db.execute(
                "DELETE FROM rollouts WHERE mode = 'served' AND created_at < ?", (created_before,)
            ).rowcount
        return deleted

    def _next_deadline(self) -> float | None:
        (deadline,) = self._db.execute("SELECT MIN(deadline) FROM attempts WHERE deadline IS NOT NULL").fetchone()
        return deadline

    async def _expire(self, now: float) -> None:
        moved = []
        with self._write() as db:
            rows = db.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE deadline IS NOT NULL AND deadline <= ?", (now,)
            ).fetchall()
            for row in rows:
                attempt = self._to_attempt(row)
                (policy_json,) = db.execute(
                    "SELECT policy FROM rollouts WHERE rollout_id = ?", (attempt.rollout_id,)
                ).fetchone()
                status = expired_status(attempt.started_at, self._policy(policy_json), now)
                moved.append(self._end_attempt(db, attempt, status, now))
        self._fire(*moved)

    # -- spans ------------------------------------------------------------------------------------------------

    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Store spans in one transaction, ignoring ones already stored (same attempt and span id); returns how
        many were new. The batch is validated first, so a rejected batch stores nothing."""
        check_span_ids(spans)
        if not spans:
            return 0
        db = self._db
        with self._write():
            attempt_ids = {s.attempt_id for s in spans}
            if len(attempt_ids) == 1:
                owner = dict(
                    db.execute("SELECT attempt_id, rollout_id FROM attempts WHERE attempt_id = ?", tuple(attempt_ids))
                )
            else:
                owner = dict(
                    db.execute(
                        "SELECT attempt_id, rollout_id FROM attempts "
                        "WHERE attempt_id IN (SELECT value FROM json_each(?))",
                        (_encode(list(attempt_ids)),),
                    )
                )
            for span in spans:
                rollout_id = owner.get(span.attempt_id)
                if rollout_id is None:
                    raise NotFoundError(f"span {span.span_id}: unknown attempt {span.attempt_id!r}")
                if rollout_id != span.rollout_id:
                    raise ConflictError(f"span {span.span_id}: attempt {span.attempt_id} is not of {span.rollout_id}")
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO spans (attempt_id, span_id, seq, body) VALUES (?, ?, ?, ?)",
                [(s.attempt_id, s.span_id, s.seq, _encode(s)) for s in spans],
            )
            return db.total_changes - before

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (all attempts, or one), ordered by attempt then ``seq``."""
        check_id("rollout_id", rollout_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
        with self._read() as db:
            if attempt_id is None:
                rows = db.execute(
                    "SELECT s.body FROM attempts a JOIN spans s ON s.attempt_id = a.attempt_id "
                    "WHERE a.rollout_id = ? ORDER BY a.idx, s.seq",
                    (rollout_id,),
                ).fetchall()
                if not rows:  # no spans yet, or no such rollout
                    self._require_rollout(db, rollout_id)
            else:
                owner = db.execute("SELECT rollout_id FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
                if owner is None or owner[0] != rollout_id:
                    self._require_rollout(db, rollout_id)
                    raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
                rows = db.execute("SELECT body FROM spans WHERE attempt_id = ? ORDER BY seq", (attempt_id,)).fetchall()
        # one decode call for the whole list: the stored documents joined into a JSON array
        return _decode_spans(b"[" + b",".join([r[0] for r in rows]) + b"]")

    # -- resources --------------------------------------------------------------------------------------------

    async def put_resources(self, resources: Resources) -> Resources:
        """Store a new version of the resources; a retried put (same ``resources_id``) returns the stored one."""
        check_id("resources_id", resources.resources_id)
        with self._write() as db:
            row = db.execute(
                "SELECT version, resources_id, created_at, items FROM resources WHERE resources_id = ?",
                (resources.resources_id,),
            ).fetchone()
            if row is not None:
                stored = self._to_resources(row)
                if stored.items != resources.items:
                    raise ConflictError(f"resources {resources.resources_id} already stored with different items")
                return stored
            now = time.time()
            (version,) = db.execute(
                "INSERT INTO resources (version, resources_id, created_at, items) "
                "VALUES ((SELECT COALESCE(MAX(version), 0) + 1 FROM resources), ?, ?, ?) RETURNING version",
                (resources.resources_id, now, _encode(resources.items)),
            ).fetchall()[0]
        stored = msgspec.structs.replace(resources, version=version, created_at=now)
        self._resources[version] = stored
        return stored

    async def get_resources(self, version: int | None = None) -> Resources | None:
        """A version of the resources, or the latest when ``version`` is None (None if there are none yet)."""
        if version is None:
            (version,) = self._db.execute("SELECT MAX(version) FROM resources").fetchone()
            if version is None:
                return None
        cached = self._resources.get(version)
        if cached is not None:
            return cached
        row = self._db.execute(
            "SELECT version, resources_id, created_at, items FROM resources WHERE version = ?", (version,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"unknown resources version {version}")
        return self._to_resources(row)

    # -- scoped tokens ----------------------------------------------------------------------------------------

    async def put_token(self, record: TokenRecord) -> None:
        check_token_ids(record)
        with self._write() as db:
            db.execute(
                "INSERT INTO tokens (token_id, body) VALUES (?, ?) "
                "ON CONFLICT (token_id) DO UPDATE SET body = excluded.body",
                (record.token_id, _encode(record)),
            )

    async def get_token(self, token_id: str) -> TokenRecord | None:
        check_id("token_id", token_id)
        row = self._db.execute("SELECT body FROM tokens WHERE token_id = ?", (token_id,)).fetchone()
        return None if row is None else _decode_token(row[0])

    async def list_tokens(self) -> list[TokenRecord]:
        records = [_decode_token(body) for (body,) in self._db.execute("SELECT body FROM tokens")]
        return sorted(records, key=lambda r: r.created_at)

    def _to_resources(self, row: tuple[Any, ...]) -> Resources:
        version, resources_id, created_at, items = row
        stored = Resources(
            items=_decode_items(items), version=version, resources_id=resources_id, created_at=created_at
        )
        self._resources[version] = stored
        return stored

    # -- queries ----------------------------------------------------------------------------------------------

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout as stored now; `NotFoundError` for an unknown id."""
        return self._rollout(self._db, check_id("rollout_id", rollout_id))

    async def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]:
        """Rollouts in any of ``status`` (all when None), among ``rollout_ids`` (all when None; an unknown id
        raises `NotFoundError`). Listed ids come back in the order given, otherwise in enqueue order."""
        wanted = None if status is None else {RolloutStatus(s) for s in status}
        with self._read() as db:
            if rollout_ids is not None:
                ids = check_ids("rollout_ids", rollout_ids)
                stored = self._rollouts_by_id(db, ids)
                out = []
                for rollout_id in ids:
                    rollout = stored.get(rollout_id)
                    if rollout is None:
                        raise NotFoundError(f"unknown rollout {rollout_id!r}")
                    if wanted is None or rollout.status in wanted:
                        out.append(msgspec.structs.replace(rollout))
                return out
            if wanted is None:
                rows = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts ORDER BY rowid").fetchall()
            else:
                rows = db.execute(
                    f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE status IN (SELECT value FROM json_each(?)) "
                    "ORDER BY rowid",
                    (_encode([s.value for s in wanted]),),
                ).fetchall()
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
        """See `Store.query_rollouts_page`; positions are rowids (enqueue order). A single status reads the status
        index in rowid order, so the first page costs the same at any store size."""
        check_page(limit, offset, before, metadata)
        where: list[str] = ["1"]
        params: list[Any] = []
        if status is not None:
            where.append("status IN (SELECT value FROM json_each(?))")
            params.append(_encode(sorted({RolloutStatus(s).value for s in status})))
        if mode is not None:
            where.append("mode = ?")
            params.append(mode)
        for key, value in (metadata or {}).items():
            where.append("json_extract(CAST(metadata AS TEXT), ?) = ?")
            params += [metadata_path(key), value]
        condition = " AND ".join(where)
        page_where, page_params = list(where), list(params)
        if before is not None:
            page_where.append("rowid < ?")
            page_params.append(before)
        with self._read() as db:
            total = db.execute(f"SELECT count(*) FROM rollouts WHERE {condition}", params).fetchone()[0]
            rows = db.execute(
                f"SELECT rowid, {_ROLLOUT_COLUMNS} FROM rollouts WHERE {' AND '.join(page_where)} "
                "ORDER BY rowid DESC LIMIT ? OFFSET ?",
                [*page_params, limit + 1, offset],
            ).fetchall()
        page = [self._to_rollout(row[1:]) for row in rows[:limit]]
        return RolloutPage(rollouts=page, total=total, next_before=rows[limit - 1][0] if len(rows) > limit else None)

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""
        check_id("rollout_id", rollout_id)
        with self._read() as db:
            self._require_rollout(db, rollout_id)
            rows = db.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY idx", (rollout_id,)
            ).fetchall()
        return [self._to_attempt(row) for row in rows]

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        """Block until every listed rollout is terminal or the timeout passes; returns the terminal ones in the
        order listed, with the others' current states (`WaitResult`)."""
        ids = check_ids("rollout_ids", rollout_ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = set(ids)
        with self._read() as db:
            missing = pending - self._existing(db, pending)
        if missing:
            raise unknown_rollouts(r for r in ids if r in missing)
        while True:
            # Only rollouts still pending are re-read after a wake-up: a trainer waiting on a large batch costs
            # O(pending) per finished rollout, not O(batch).
            pending -= self._terminal_among(pending)
            remaining = None if deadline is None else deadline - time.monotonic()
            if not pending or (remaining is not None and remaining <= 0):
                break
            await self._ended.wait(remaining)
        with self._read() as db:
            stored = self._rollouts_by_id(db, ids)
        return WaitResult(msgspec.structs.replace(stored[r]) for r in ids)

    async def counts(self) -> dict[RolloutStatus, int]:
        """How many rollouts are in each status."""
        out = dict.fromkeys(RolloutStatus, 0)
        for status, n in self._db.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status"):
            out[_ROLLOUT_STATUS[status]] = n
        return out

    async def close(self) -> None:
        """Stop the reaper and close the file (SQLite checkpoints the WAL into it). Waiters are not resumed."""
        if self._closed:
            return
        self._closed = True
        await self._reaper.close()
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA optimize")
        self._db.close()

    # -- helpers ----------------------------------------------------------------------------------------------

    def _policy(self, blob: bytes) -> RetryPolicy:
        policy = self._policies.get(blob)
        if policy is None:
            if len(self._policies) >= 256:
                self._policies.clear()
            policy = self._policies[blob] = _decode_policy(blob)
        return policy

    def _to_rollout(self, row: tuple[Any, ...]) -> Rollout:
        (rollout_id, task, mode, sample_index, version, policy, status, created, ended, attempts, reward, meta) = row
        return Rollout(
            rollout_id=rollout_id,
            task=_decode_task(task),
            mode=mode,
            sample_index=sample_index,
            resources_version=version,
            policy=self._policy(policy),
            status=_ROLLOUT_STATUS[status],
            created_at=created,
            ended_at=ended,
            attempts=attempts,
            reward=reward,
            metadata=_decode_dict(meta),
        )

    @staticmethod
    def _to_attempt(row: tuple[Any, ...]) -> Attempt:
        attempt_id, rollout_id, index, worker_id, status, started, lease_expires, ended, reward, error = row
        return Attempt(
            attempt_id=attempt_id,
            rollout_id=rollout_id,
            index=index,
            worker_id=worker_id,
            status=_ATTEMPT_STATUS[status],
            started_at=started,
            lease_expires_at=lease_expires,
            ended_at=ended,
            reward=reward,
            error=None if error is None else _decode_error(error),
        )

    def _rollout(self, db: sqlite3.Connection, rollout_id: str) -> Rollout:
        row = db.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")
        return self._to_rollout(row)

    def _rollouts_by_id(self, db: sqlite3.Connection, ids: list[str]) -> dict[str, Rollout]:
        # json_each: one statement for any number of ids (no bound-parameter limit, no SQL built per call)
        rows = db.execute(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))",
            (_encode(ids),),
        ).fetchall()
        return {row[0]: self._to_rollout(row) for row in rows}

    def _existing(self, db: sqlite3.Connection, ids: set[str]) -> set[str]:
        rows = db.execute(
            "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))", (_encode(ids),)
        )
        return {row[0] for row in rows}

    def _terminal_among(self, ids: set[str]) -> set[str]:
        rows = self._db.execute(
            "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?)) "
            "AND status IN (SELECT value FROM json_each(?))",
            (_encode(ids), _encode(_TERMINAL_ROLLOUT)),
        )
        return {row[0] for row in rows}

    @staticmethod
    def _require_rollout(db: sqlite3.Connection, rollout_id: str) -> None:
        if db.execute("SELECT 1 FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone() is None:
            raise NotFoundError(f"unknown rollout {rollout_id!r}")

    def _attempt_or_none(self, db: sqlite3.Connection, attempt_id: str) -> Attempt | None:
        row = db.execute(f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return None if row is None else self._to_attempt(row)

    def _attempt(self, db: sqlite3.Connection, attempt_id: str) -> Attempt:
        attempt = self._attempt_or_none(db, attempt_id)
        if attempt is None:
            raise NotFoundError(f"unknown attempt {attempt_id!r}")
        return attempt
