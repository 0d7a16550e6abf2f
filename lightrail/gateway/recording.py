"""Recording served traffic: the calls that reach the gateway without a per-attempt route, filed under sessions.

``lightrail gateway serve --record`` (or ``create_gateway_app(..., sessions=SessionRecorder(...))``) records every
served call as it records a training call (one LLM-call span with prompt and response token ids, logprobs, the
policy version), under a *session*: a rollout in mode ``served`` (`Store.open_session`) that feedback rewards later
(`lightrail.feedback`, ``POST /v1/feedback`` on the store). The session of a call is, first found:

1. the ``x-lightrail-session`` header (refused with a 400 unless it matches `SESSION_ID_PATTERN`);
2. OpenAI's ``user`` field, or Anthropic's ``metadata.user_id``;
3. ``metadata.session_id`` (OpenAI's ``metadata`` object);
4. else the call is a session of its own, named by its response id (so feedback by response id finds it).

Ids from 2 and 3 that are not valid session ids are replaced by a digest (``h-`` + 24 hex characters of their
SHA-256). The gateway answers every recorded call with an ``x-lightrail-session`` header naming its session, so the
application knows what to send feedback for.

The serving path never waits for the store: a session's first call opens it in a background task (then cached),
and its spans are handed to the span batcher once the session exists. ``redact`` (a function of a `Span`,
returning the span to store or None to store nothing) runs before a span leaves the process; the prompt and
response token ids are part of the span, so a redactor that removes text must drop or rewrite those too (the call
then cannot be trained on). ``retention_s`` deletes sessions older than that, hourly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightrail._retry import Retry
from lightrail.gateway.openai_api import InvalidRequest
from lightrail.store.base import Store, StoreError, StoreUnavailableError
from lightrail.store.sessions import SESSION_ID_PATTERN, session_rollout_id
from lightrail.tracing import SpanBatcher
from lightrail.types import Attr, RolloutSpec, Span, Task

__all__ = ["SESSION_HEADER", "Redactor", "SessionRecorder", "load_redactor"]

log = logging.getLogger(__name__)

SESSION_HEADER = "x-lightrail-session"

Redactor = Callable[[Span], "Span | None"]

_RETENTION_EVERY_S = 3600.0
_OPEN_RETRY = Retry(tries=None, base_s=0.05, cap_s=5.0)


def load_redactor(target: str) -> Redactor:
    """The function named ``module:function`` or ``file.py:function`` (the working folder imports, see
    `lightrail._imports`), checked to be callable."""
    from lightrail._imports import import_object

    function = import_object(target)
    if not callable(function):
        raise ValueError(f"{target!r} is not a function")
    return function


class SessionRecorder:
    """Files served calls under sessions in ``store`` (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        redact: Redactor | None = None,
        retention_s: float | None = None,
        max_cached_sessions: int = 100_000,
    ) -> None:
        if retention_s is not None and retention_s <= 0:
            raise ValueError("retention_s must be > 0")
        self.store = store
        self.redact = redact
        self.retention_s = retention_s
        self.max_cached_sessions = max_cached_sessions
        self.sessions_opened = 0
        self._opened: dict[str, asyncio.Future[bool]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retention: asyncio.Task[None] | None = None
        self._closing = False

    # -- which session ------------------------------------------------------------------------------------------

    @staticmethod
    def session_of(headers: Mapping[str, str], data: Any) -> tuple[str | None, str]:
        """``(session id, source)`` of a call; the id is None for a call that is a session of its own (named by
        its response id once answered). Raises `InvalidRequest` for a malformed header."""
        header = headers.get(SESSION_HEADER)
        if header is not None:
            if not SESSION_ID_PATTERN.fullmatch(header):
                raise InvalidRequest(
                    f"The {SESSION_HEADER} header must be 1-200 characters of letters, digits and . _ : @ + = -.",
                    param=SESSION_HEADER,
                    code="invalid_session",
                )
            return header, "header"
        if isinstance(data, dict):
            metadata = data.get("metadata")
            user = data.get("user")
            if not isinstance(user, str) and isinstance(metadata, dict):
                user = metadata.get("user_id")  # Anthropic's Messages API
            if isinstance(user, str) and user:
                return _as_session_id(user), "user"
            if isinstance(metadata, dict):
                session = metadata.get("session_id")
                if isinstance(session, str) and session:
                    return _as_session_id(session), "metadata"
        return None, "call"

    # -- recording ----------------------------------------------------------------------------------------------

    @staticmethod
    def attempt_of(session_id: str) -> tuple[str, str]:
        """The rollout and attempt ids of a session (the attempt id is fixed, so spans can be made before the
        session exists)."""
        rollout_id = session_rollout_id(session_id)
        return rollout_id, "at-" + rollout_id

    def record(self, span: Span, session_id: str, source: str, batcher: SpanBatcher) -> None:
        """Hand ``span`` (already redacted) to ``batcher`` once its session exists; returns at once."""
        rollout_id = span.rollout_id
        opened = self._opened.get(rollout_id)
        if opened is None:
            if len(self._opened) >= self.max_cached_sessions:
                self._opened = {k: f for k, f in self._opened.items() if not f.done()}  # a miss costs one open
            opened = self._opened[rollout_id] = asyncio.get_running_loop().create_future()
            self._spawn(self._open(session_id, source, span.attempt_id, opened))
        if opened.done():
            if opened.result():
                batcher.submit(span)
            return
        self._spawn(self._submit_when_open(opened, span, batcher))

    async def _open(self, session_id: str, source: str, attempt_id: str, opened: asyncio.Future[bool]) -> None:
        spec = RolloutSpec(
            rollout_id=session_rollout_id(session_id),
            task=Task(input={"session": session_id}, task_id=session_id),
            mode="served",
            metadata={"session_source": source},
        )
        pauses = _OPEN_RETRY.delays()  # between opens while the store stays down (the client retried each one)
        while True:
            delay = 0.0
            try:
                await self.store.open_session(spec, attempt_id=attempt_id)
                self.sessions_opened += 1
                opened.set_result(True)
                return
            except StoreUnavailableError as exc:
                if self._closing:
                    log.warning("store unavailable at shutdown: session %s not recorded (%s)", session_id, exc)
                    break
                delay = next(pauses)
                log.warning("store unavailable opening session %s; retrying in %.2f s", session_id, delay)
            except StoreError as exc:  # e.g. a training rollout of that id: never record into it
                log.warning("session %s not recorded: %s", session_id, exc)
                break
            except Exception:
                if self._closing:
                    break
                delay = next(pauses)
                log.exception("opening session %s failed; retrying in %.2f s", session_id, delay)
            await asyncio.sleep(delay)
        opened.set_result(False)
        self._opened.pop(spec.rollout_id, None)

    @staticmethod
    async def _submit_when_open(opened: asyncio.Future[bool], span: Span, batcher: SpanBatcher) -> None:
        if await asyncio.shield(opened):
            batcher.submit(span)

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.retention_s is not None and self._retention is None:
            self._retention = asyncio.get_running_loop().create_task(self._retention_loop())

    async def prune(self) -> int:
        """Delete sessions older than ``retention_s`` now; returns how many."""
        if self.retention_s is None:
            return 0
        deleted = await self.store.delete_sessions(created_before=time.time() - self.retention_s)
        if deleted:
            log.info("retention: deleted %d served sessions older than %.0f s", deleted, self.retention_s)
        return deleted

    async def _retention_loop(self) -> None:
        while True:
            try:
                await self.prune()
            except Exception:
                log.exception("retention pass failed; next in %.0f s", _RETENTION_EVERY_S)
            await asyncio.sleep(_RETENTION_EVERY_S)

    async def close(self) -> None:
        """Wait for sessions being opened (their spans then reach the batcher) and stop retention."""
        self._closing = True
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=30.0)


def _as_session_id(value: str) -> str:
    if SESSION_ID_PATTERN.fullmatch(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:24]


def session_attributes(session_id: str, source: str) -> dict[str, Any]:
    return {Attr.SESSION_ID: session_id, Attr.SESSION_SOURCE: source}
