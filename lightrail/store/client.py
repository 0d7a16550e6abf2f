"""`StoreClient`: the `Store` protocol over HTTP to a ``lightrail store serve`` process (`SyncStoreClient`: the
same methods without an event loop).

Every operation is written once, as a generator that yields the HTTP calls it needs (`_Call`) and receives
their decoded answers; `StoreClient` drives it with ``httpx.AsyncClient``, `SyncStoreClient` with
``httpx.Client``. Long polls (`lease`, `wait`) are split into requests of at most `MAX_WAIT_S` each.

Retries without duplicates: transient failures (connection refused/reset, read timeouts, 502/503/504) are
retried with short exponential backoff and full jitter (`lightrail._retry`). That is safe because every write
carries an id chosen here or by the caller before the first try: ``rollout_id`` (enqueue), ``attempt_id`` (lease; generated before the first try
when the caller gives none), span ids, ``resources_id``; `finish` with the same outcome is accepted again.
(A retried `add_spans` whose first try was stored reports 0 added: the spans are there once.)
Errors are raised, never swallowed: 4xx answers become the matching lightrail exception, and a server that
stays unreachable raises `StoreUnavailableError` naming the URL.

Concurrency model: `StoreClient` keeps one ``httpx.AsyncClient`` (HTTP/1.1 keep-alive pool, `LeanHTTPTransport`)
for the event loop it is used from, made on first use; any number of tasks of that loop may share it, and using
the client from a new loop (a later ``asyncio.run``) replaces it. `SyncStoreClient` is thread-safe as far as
``httpx.Client`` is.

Path ids are percent-encoded; ids containing ``/`` are not supported over HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from lightrail._http import (
    ConnectFailedError,
    ConnectTimeoutError,
    HTTPPool,
    PoolTimeoutError,
    StaleConnectionError,
)
from lightrail._retry import Retry
from lightrail.store._wire import (
    MAX_WAIT_S,
    ROUTES,
    AddedResponse,
    AddSpansRequest,
    AttemptsResponse,
    CountsResponse,
    DeletedResponse,
    DeleteSessionsRequest,
    EnqueueRequest,
    ErrorResponse,
    FinishRequest,
    LeaseRequest,
    LeaseResponse,
    OpenSessionRequest,
    PageRolloutsRequest,
    QueryRolloutsRequest,
    ResourcesResponse,
    RolloutIdsRequest,
    RolloutsResponse,
    SpansResponse,
    TokenResponse,
    TokensResponse,
    WaitRequest,
    WaitResponse,
    WhoamiResponse,
)
from lightrail.store.base import (
    ConflictError,
    ForbiddenError,
    InvalidIdError,
    NotFoundError,
    StaleAttemptError,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
    WaitResult,
    check_id,
    check_page,
)
from lightrail.store.sessions import Feedback, FeedbackResult
from lightrail.store.tokens import TokenRecord
from lightrail.types import (
    Attempt,
    AttemptStatus,
    ErrorInfo,
    IllegalTransitionError,
    Lease,
    Resources,
    Rollout,
    RolloutPage,
    RolloutSpec,
    RolloutStatus,
    Span,
    new_id,
)

__all__ = ["LeanHTTPTransport", "StoreClient", "StoreUnavailableError", "SyncStoreClient", "feedback"]

T = TypeVar("T")


_encode = msgspec.json.Encoder().encode
_LONG_POLL_SLACK_S = 15.0  # a long poll's read timeout is its wait plus this (server, network and GC hiccups)
_RETRY_STATUS = frozenset({502, 503, 504})
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
_ERRORS: dict[str, type[Exception]] = {
    "NotFoundError": NotFoundError,
    "ConflictError": ConflictError,
    "StaleAttemptError": StaleAttemptError,
    "IllegalTransitionError": IllegalTransitionError,
    "ForbiddenError": ForbiddenError,
    "InvalidIdError": InvalidIdError,
}
_BY_STATUS: dict[int, type[StoreError]] = {403: ForbiddenError, 404: NotFoundError, 409: ConflictError}
_FIXED_PATHS = frozenset(r.path for r in ROUTES if "{" not in r.path)


class _Call(NamedTuple):
    """One HTTP request an operation needs and how to decode its 200 answer."""

    method: str
    path: str
    decoder: msgspec.json.Decoder
    body: bytes | None = None
    params: dict[str, str] | None = None
    timeout_s: float | None = None
    """Read timeout for long polls; None means the client's default."""


_Op = Generator[_Call, Any, T]

_dec_rollouts = msgspec.json.Decoder(RolloutsResponse)
_dec_wait = msgspec.json.Decoder(WaitResponse)
_dec_page = msgspec.json.Decoder(RolloutPage)
_dec_rollout = msgspec.json.Decoder(Rollout)
_dec_lease = msgspec.json.Decoder(LeaseResponse)
_dec_attempt = msgspec.json.Decoder(Attempt)
_dec_attempts = msgspec.json.Decoder(AttemptsResponse)
_dec_added = msgspec.json.Decoder(AddedResponse)
_dec_spans = msgspec.json.Decoder(SpansResponse)
_dec_lease_only = msgspec.json.Decoder(Lease)
_dec_deleted = msgspec.json.Decoder(DeletedResponse)
_dec_feedback = msgspec.json.Decoder(FeedbackResult)
_dec_resources = msgspec.json.Decoder(Resources)
_dec_resources_opt = msgspec.json.Decoder(ResourcesResponse)
_dec_counts = msgspec.json.Decoder(CountsResponse)
_dec_error = msgspec.json.Decoder(ErrorResponse)
_dec_token = msgspec.json.Decoder(TokenRecord)
_dec_token_opt = msgspec.json.Decoder(TokenResponse)
_dec_tokens = msgspec.json.Decoder(TokensResponse)
_dec_whoami = msgspec.json.Decoder(WhoamiResponse)


def _id(field: str, value: str) -> str:
    """An id for a URL path, checked first (`check_id`): an empty one would change the route, not reach the
    server's check."""
    return quote(check_id(field, value), safe="")


# -- operations (each written once; see the module docstring) ---------------------------------------------------


def _enqueue(specs: Sequence[RolloutSpec]) -> _Op[list[Rollout]]:
    answer = yield _Call("POST", "/v1/rollouts", _dec_rollouts, _encode(EnqueueRequest(specs=list(specs))))
    return answer.rollouts


def _lease(worker_id: str, wait_s: float, attempt_id: str | None) -> _Op[Lease | None]:
    # Chosen before the first try: a retry after a lost response gets the attempt the first try started.
    attempt_id = attempt_id if attempt_id is not None else new_id("at")  # an empty one goes to the server's check
    deadline = time.monotonic() + wait_s
    while True:
        chunk = min(max(deadline - time.monotonic(), 0.0), MAX_WAIT_S)
        body = _encode(LeaseRequest(worker_id=worker_id, wait_s=chunk, attempt_id=attempt_id))
        timeout = chunk + _LONG_POLL_SLACK_S if chunk > 0 else None
        answer = yield _Call("POST", "/v1/lease", _dec_lease, body, timeout_s=timeout)
        if answer.lease is not None or deadline - time.monotonic() <= 0:
            return answer.lease


def _heartbeat(attempt_id: str) -> _Op[Attempt]:
    return (yield _Call("POST", f"/v1/attempts/{_id('attempt_id', attempt_id)}/heartbeat", _dec_attempt))


def _finish(attempt_id: str, status: AttemptStatus, reward: float | None, error: ErrorInfo | None) -> _Op[Attempt]:
    body = _encode(FinishRequest(status=AttemptStatus(status), reward=reward, error=error))
    return (yield _Call("POST", f"/v1/attempts/{_id('attempt_id', attempt_id)}/finish", _dec_attempt, body))


def _cancel(rollout_ids: Iterable[str]) -> _Op[list[Rollout]]:
    body = _encode(RolloutIdsRequest(rollout_ids=list(rollout_ids)))
    return (yield _Call("POST", "/v1/rollouts/cancel", _dec_rollouts, body)).rollouts


def _add_spans(spans: Sequence[Span]) -> _Op[int]:
    if not spans:
        return 0
    answer = yield _Call("POST", "/v1/spans", _dec_added, _encode(AddSpansRequest(spans=list(spans))))
    return answer.added


def _open_session(spec: RolloutSpec, attempt_id: str, worker_id: str) -> _Op[Lease]:
    body = _encode(OpenSessionRequest(spec=spec, attempt_id=attempt_id, worker_id=worker_id))
    return (yield _Call("POST", "/v1/sessions", _dec_lease_only, body))


def _delete_sessions(created_before: float) -> _Op[int]:
    body = _encode(DeleteSessionsRequest(created_before=created_before))
    return (yield _Call("POST", "/v1/sessions/delete", _dec_deleted, body)).deleted


def _feedback(feedback: Feedback) -> _Op[FeedbackResult]:
    return (yield _Call("POST", "/v1/feedback", _dec_feedback, _encode(feedback)))


def _query_spans(rollout_id: str, attempt_id: str | None) -> _Op[list[Span]]:
    params = None if attempt_id is None else {"attempt_id": attempt_id}
    answer = yield _Call("GET", f"/v1/rollouts/{_id('rollout_id', rollout_id)}/spans", _dec_spans, params=params)
    return answer.spans


def _put_resources(resources: Resources) -> _Op[Resources]:
    return (yield _Call("POST", "/v1/resources", _dec_resources, _encode(resources)))


def _get_resources(version: int | None) -> _Op[Resources | None]:
    if version is None:
        return (yield _Call("GET", "/v1/resources/latest", _dec_resources_opt)).resources
    return (yield _Call("GET", f"/v1/resources/{int(version)}", _dec_resources))


def _get_rollout(rollout_id: str) -> _Op[Rollout]:
    return (yield _Call("GET", f"/v1/rollouts/{_id('rollout_id', rollout_id)}", _dec_rollout))


def _query_rollouts(status: Iterable[RolloutStatus] | None, rollout_ids: Iterable[str] | None) -> _Op[list[Rollout]]:
    request = QueryRolloutsRequest(
        status=None if status is None else [RolloutStatus(s) for s in status],
        rollout_ids=None if rollout_ids is None else list(rollout_ids),
    )
    return (yield _Call("POST", "/v1/rollouts/query", _dec_rollouts, _encode(request))).rollouts


def _page_rollouts(
    status: Iterable[RolloutStatus] | None,
    mode: str | None,
    metadata: Mapping[str, str] | None,
    limit: int,
    offset: int,
    before: int | None,
) -> _Op[RolloutPage]:
    check_page(limit, offset, before, metadata)
    request = PageRolloutsRequest(
        status=None if status is None else [RolloutStatus(s) for s in status],
        mode=mode,
        metadata=None if metadata is None else dict(metadata),
        limit=limit,
        offset=offset,
        before=before,
    )
    return (yield _Call("POST", "/v1/rollouts/page", _dec_page, _encode(request)))


def _query_attempts(rollout_id: str) -> _Op[list[Attempt]]:
    return (yield _Call("GET", f"/v1/rollouts/{_id('rollout_id', rollout_id)}/attempts", _dec_attempts)).attempts


def _wait(rollout_ids: Iterable[str], timeout_s: float | None) -> _Op[WaitResult]:
    ids = list(rollout_ids)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        remaining = MAX_WAIT_S if deadline is None else max(deadline - time.monotonic(), 0.0)
        chunk = min(remaining, MAX_WAIT_S)
        body = _encode(WaitRequest(rollout_ids=ids, timeout_s=chunk))
        answer = yield _Call("POST", "/v1/rollouts/wait", _dec_wait, body, timeout_s=chunk + _LONG_POLL_SLACK_S)
        done = answer.rollouts
        if len(done) == len(ids) or (deadline is not None and deadline - time.monotonic() <= 0):
            # in the order listed; a server from before `pending` sends only the terminal ones
            states = {r.rollout_id: r for r in (*answer.pending, *done)}
            return WaitResult((states[r] for r in ids if r in states), timed_out=len(done) < len(ids))


def _counts() -> _Op[dict[RolloutStatus, int]]:
    counts = (yield _Call("GET", "/v1/counts", _dec_counts)).counts
    return {status: counts.get(status, 0) for status in RolloutStatus}


def _put_token(record: TokenRecord) -> _Op[None]:
    yield _Call("POST", "/v1/tokens", _dec_token, _encode(record))


def _get_token(token_id: str) -> _Op[TokenRecord | None]:
    return (yield _Call("GET", f"/v1/tokens/{_id('token_id', token_id)}", _dec_token_opt)).token


def _list_tokens() -> _Op[list[TokenRecord]]:
    return (yield _Call("GET", "/v1/tokens", _dec_tokens)).tokens


def _whoami() -> _Op[WhoamiResponse]:
    return (yield _Call("GET", "/v1/whoami", _dec_whoami))


# -- a lean HTTP/1.1 transport for httpx --------------------------------------------------------------------------


class LeanHTTPTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport over lightrail's lean HTTP/1.1 client (`lightrail._http`), one keep-alive pool per
    origin.

    Why: httpx's default transport (httpcore + anyio) costs ~400 us of CPU per request on our 2-core machines,
    20x the socket work itself, and it was most of a runner's CPU in ``bench/store.py``. This one does only what
    a store client needs: ``Content-Length`` or chunked bodies, keep-alive, TLS for ``https``, httpx's timeouts
    (connect/read/pool) and exception types. No proxies, no HTTP/2, no ``HEAD``: pass httpx's own transport to
    `StoreClient` for those.

    Concurrency model: used from one event loop; at most ``max_connections`` requests in flight per origin,
    each on its own connection; idle connections are reused last-in first-out.
    """

    def __init__(self, *, max_connections: int = 100):
        self.max_connections = max_connections
        self._pools: dict[tuple[bytes, str, int | None], HTTPPool] = {}

    def _pool(self, url: httpx.URL) -> HTTPPool:
        key = (url.raw_scheme, url.host, url.port)
        pool = self._pools.get(key)
        if pool is None:
            origin = f"{url.scheme}://{url.netloc.decode('ascii')}"
            pool = self._pools[key] = HTTPPool(origin, max_connections=self.max_connections)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "HEAD":
            raise httpx.UnsupportedProtocol("LeanHTTPTransport does not send HEAD requests", request=request)
        timeouts = request.extensions.get("timeout", {})
        lines = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for key, value in request.headers.raw:
            lines += (key, b": ", value, b"\r\n")
        lines.append(b"\r\n")
        body = request.content if isinstance(request.stream, httpx.ByteStream) else await request.aread()
        if request.headers.get("transfer-encoding") == "chunked":
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        try:
            reply = await self._pool(request.url).exchange(
                b"".join(lines) + body,
                timeout_s=timeouts.get("read"),
                connect_timeout_s=timeouts.get("connect"),
                pool_timeout_s=timeouts.get("pool"),
                idempotent=True,  # every store write carries the ids that make a replay a no-op
            )
        except ConnectTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc), request=request) from exc
        except PoolTimeoutError as exc:
            raise httpx.PoolTimeout(str(exc), request=request) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout("waiting for the response timed out", request=request) from exc
        except ConnectFailedError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except StaleConnectionError as exc:
            raise httpx.RemoteProtocolError("server disconnected without a response", request=request) from exc
        except ConnectionError as exc:
            raise httpx.ReadError(f"connection lost while reading the response: {exc}", request=request) from exc
        return httpx.Response(
            reply.status,
            headers=reply.headers,
            content=reply.body,  # already read: the connection is back in the pool before the caller looks
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reply.reason},
        )

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            await pool.aclose()


# -- shared plumbing --------------------------------------------------------------------------------------------


class _Base:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 8,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        retry: Retry | None = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry = retry or Retry(tries=retries + 1, base_s=backoff_s, cap_s=max_backoff_s)
        """Each request's retries (`lightrail._retry`): transport errors and 502/503/504, resent as is."""
        self._headers = {"content-type": "application/json", "accept": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._header_obj = httpx.Headers(self._headers)
        self._urls: dict[str, httpx.URL] = {}  # parsed once: URL parsing is a visible share of a request's CPU
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 5.0))
        self._timeout_ext = self._timeout.as_dict()

    def _answer(self, call: _Call, response: httpx.Response) -> Any:
        """Decode a 200, or raise the lightrail exception the server's error body names."""
        if response.status_code == 200:
            return call.decoder.decode(response.content)
        try:
            detail = _dec_error.decode(response.content).error
            message, type_name = detail.message, detail.type
        except (msgspec.DecodeError, msgspec.ValidationError):
            message, type_name = response.text[:500] or response.reason_phrase, ""
        where = f"{call.method} {self.url}{call.path}"
        if response.status_code == 401:
            raise UnauthorizedError(f"the store server at {self.url} refused the token (HTTP 401: {message})")
        error_type = _ERRORS.get(type_name) or _BY_STATUS.get(response.status_code)
        if error_type is not None:
            raise error_type(message)
        error = StoreError(f"{where} -> HTTP {response.status_code}: {message}")
        error.http_status = response.status_code
        raise error

    def _unavailable(self, call: _Call, last: BaseException | str, tries: int) -> StoreUnavailableError:
        what = last if isinstance(last, str) else f"{type(last).__name__}: {last}"
        return StoreUnavailableError(
            f"store server at {self.url} unavailable ({call.method} {call.path}) after {tries} tries: {what}"
        )

    def _request(self, call: _Call) -> httpx.Request:
        """The httpx request for a call, built directly (half the CPU of ``client.build_request``, which merges
        client defaults we do not use); sent with ``client.send``. Reused as is by retries."""
        if call.timeout_s is None:
            timeout = self._timeout_ext
        else:
            read = max(call.timeout_s, self.timeout)
            timeout = httpx.Timeout(self.timeout, connect=self._timeout.connect, read=read).as_dict()
        url = self._urls.get(call.path)
        if url is None:
            url = httpx.URL(self.url + call.path)
            if call.path in _FIXED_PATHS:  # not paths with ids: the cache stays small
                self._urls[call.path] = url
        return httpx.Request(
            call.method,
            url,
            params=call.params,
            headers=self._header_obj,
            content=call.body,
            extensions={"timeout": timeout},
        )


class StoreClient(_Base):
    """A `Store` backed by a store server over HTTP (asyncio).

    ``url`` is the server's base URL (``http://127.0.0.1:4747``); ``token`` its bearer token. ``timeout`` bounds
    each ordinary request; long polls get their wait plus a margin. Up to ``retries`` transient failures are retried
    (full-jitter backoff from ``backoff_s`` doubling up to ``max_backoff_s``; or pass a `lightrail._retry.Retry`
    as ``retry``, e.g. with a time budget) before `StoreUnavailableError`.
    ``transport`` makes the httpx transport of each event loop's client (default: `LeanHTTPTransport`;
    ``httpx.AsyncHTTPTransport`` for proxies or HTTP/2).

        store = StoreClient("http://127.0.0.1:4747", token=os.environ["LIGHTRAIL_TOKEN"])
        lease = await store.lease("runner-1", wait_s=30)
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retries: int = 8,
        transport: Callable[[], httpx.AsyncBaseTransport] = LeanHTTPTransport,
        **kw: Any,
    ):
        super().__init__(url, token=token, timeout=timeout, retries=retries, **kw)
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # An httpx.AsyncClient is bound to the loop its connections were made in; a client used from a new
            # loop (a new asyncio.run) gets a fresh pool. The old one is garbage once its loop is gone.
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                timeout=self._timeout,
                transport=self._transport(),
            )
            self._loop = loop
        return self._client

    async def _send(self, call: _Call) -> Any:
        client = self._http()
        request = self._request(call)
        delays, tries = None, 0
        while True:  # retried per `self.retry`; the success path allocates nothing for it
            tries += 1
            failure: BaseException | str
            try:
                response = await client.send(request)
            except _TRANSIENT as exc:
                failure = exc
            else:
                if response.status_code not in _RETRY_STATUS:
                    return self._answer(call, response)
                failure = f"HTTP {response.status_code}"
            delays = delays or self.retry.delays()
            delay = next(delays, None)
            if delay is None:
                raise self._unavailable(call, failure, tries)
            await asyncio.sleep(delay)

    async def _run(self, op: _Op[T]) -> T:
        try:
            call = next(op)
            while True:
                call = op.send(await self._send(call))
        except StopIteration as done:
            return done.value

    async def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """Queue rollouts (idempotent by ``rollout_id``)."""
        return await self._run(_enqueue(specs))

    async def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        """Start an attempt on the oldest queued rollout, long-polling up to ``wait_s``."""
        return await self._run(_lease(worker_id, wait_s, attempt_id))

    async def heartbeat(self, attempt_id: str) -> Attempt:
        """Renew an attempt's lease; its returned status says whether to keep running."""
        return await self._run(_heartbeat(attempt_id))

    async def finish(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Attempt:
        """End a running attempt (repeating the same outcome is accepted)."""
        return await self._run(_finish(attempt_id, status, reward, error))

    async def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        """Cancel queued or running rollouts."""
        return await self._run(_cancel(rollout_ids))

    async def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        """Record a served session (idempotent by ``spec.rollout_id``)."""
        return await self._run(_open_session(spec, attempt_id, worker_id))

    async def delete_sessions(self, *, created_before: float) -> int:
        """Delete served sessions created before ``created_before``; returns how many."""
        return await self._run(_delete_sessions(created_before))

    async def feedback(self, feedback: Feedback) -> FeedbackResult:
        """Reward a served session (`lightrail.store.sessions.give_feedback` on the server)."""
        return await self._run(_feedback(feedback))

    async def add_spans(self, spans: Sequence[Span]) -> int:
        """Store a batch of spans in one request; returns how many were new."""
        return await self._run(_add_spans(spans))

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or of one attempt), ordered by attempt then ``seq``."""
        return await self._run(_query_spans(rollout_id, attempt_id))

    async def put_resources(self, resources: Resources) -> Resources:
        """Store a resources version (idempotent by ``resources_id``)."""
        return await self._run(_put_resources(resources))

    async def get_resources(self, version: int | None = None) -> Resources | None:
        """One resources version, or the latest (None when there is none yet)."""
        return await self._run(_get_resources(version))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout."""
        return await self._run(_get_rollout(rollout_id))

    async def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids."""
        return await self._run(_query_rollouts(status, rollout_ids))

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
        """A page of rollouts, newest first (see `Store.query_rollouts_page`)."""
        return await self._run(_page_rollouts(status, mode, metadata, limit, offset, before))

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""
        return await self._run(_query_attempts(rollout_id))

    async def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        """Block until every listed rollout is terminal or the timeout passes (re-polling past the server's
        `MAX_WAIT_S` cap); returns the terminal ones with the others' current states in ``.pending`` and
        ``.timed_out`` (`WaitResult`). Unknown ids raise `NotFoundError` naming them."""
        return await self._run(_wait(rollout_ids, timeout_s))

    async def counts(self) -> dict[RolloutStatus, int]:
        """How many rollouts are in each status."""
        return await self._run(_counts())

    async def put_token(self, record: TokenRecord) -> None:
        """Store a scoped token's record (admin; see `lightrail.store.tokens`)."""
        await self._run(_put_token(record))

    async def get_token(self, token_id: str) -> TokenRecord | None:
        """A scoped token's record, or None (admin)."""
        return await self._run(_get_token(token_id))

    async def list_tokens(self) -> list[TokenRecord]:
        """Every scoped token's record (admin)."""
        return await self._run(_list_tokens())

    async def whoami(self) -> WhoamiResponse:
        """The role (and scoped token id) this client's token acts as."""
        return await self._run(_whoami())

    async def close(self) -> None:
        """Close the connection pool (the server and its data are untouched)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                same_loop = self._loop is asyncio.get_running_loop()
            except RuntimeError:
                same_loop = False
            if same_loop:
                await client.aclose()
        self._loop = None

    async def __aenter__(self) -> StoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SyncStoreClient(_Base):
    """The `StoreClient` methods as plain blocking calls, for scripts and threads without an event loop.

    with SyncStoreClient("http://127.0.0.1:4747", token="s3cret") as store:
        print(store.counts())
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 30.0, retries: int = 8, **kw: Any):
        super().__init__(url, token=token, timeout=timeout, retries=retries, **kw)
        self._client = httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout)

    def _send(self, call: _Call) -> Any:
        request = self._request(call)
        delays, tries = None, 0
        while True:  # retried per `self.retry`; the success path allocates nothing for it
            tries += 1
            failure: BaseException | str
            try:
                response = self._client.send(request)
            except _TRANSIENT as exc:
                failure = exc
            else:
                if response.status_code not in _RETRY_STATUS:
                    return self._answer(call, response)
                failure = f"HTTP {response.status_code}"
            delays = delays or self.retry.delays()
            delay = next(delays, None)
            if delay is None:
                raise self._unavailable(call, failure, tries)
            time.sleep(delay)

    def _run(self, op: _Op[T]) -> T:
        try:
            call = next(op)
            while True:
                call = op.send(self._send(call))
        except StopIteration as done:
            return done.value

    def enqueue(self, specs: Sequence[RolloutSpec]) -> list[Rollout]:
        """See `StoreClient.enqueue`."""
        return self._run(_enqueue(specs))

    def lease(self, worker_id: str, *, wait_s: float = 0.0, attempt_id: str | None = None) -> Lease | None:
        """See `StoreClient.lease`."""
        return self._run(_lease(worker_id, wait_s, attempt_id))

    def heartbeat(self, attempt_id: str) -> Attempt:
        """See `StoreClient.heartbeat`."""
        return self._run(_heartbeat(attempt_id))

    def finish(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        reward: float | None = None,
        error: ErrorInfo | None = None,
    ) -> Attempt:
        """See `StoreClient.finish`."""
        return self._run(_finish(attempt_id, status, reward, error))

    def cancel(self, rollout_ids: Iterable[str]) -> list[Rollout]:
        """See `StoreClient.cancel`."""
        return self._run(_cancel(rollout_ids))

    def open_session(self, spec: RolloutSpec, *, attempt_id: str, worker_id: str = "gateway") -> Lease:
        """See `StoreClient.open_session`."""
        return self._run(_open_session(spec, attempt_id, worker_id))

    def delete_sessions(self, *, created_before: float) -> int:
        """See `StoreClient.delete_sessions`."""
        return self._run(_delete_sessions(created_before))

    def feedback(self, feedback: Feedback) -> FeedbackResult:
        """See `StoreClient.feedback`."""
        return self._run(_feedback(feedback))

    def add_spans(self, spans: Sequence[Span]) -> int:
        """See `StoreClient.add_spans`."""
        return self._run(_add_spans(spans))

    def query_rollouts_page(
        self,
        *,
        status: Iterable[RolloutStatus] | None = None,
        mode: str | None = None,
        metadata: Mapping[str, str] | None = None,
        limit: int = 50,
        offset: int = 0,
        before: int | None = None,
    ) -> RolloutPage:
        """See `StoreClient.query_rollouts_page`."""
        return self._run(_page_rollouts(status, mode, metadata, limit, offset, before))

    def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """See `StoreClient.query_spans`."""
        return self._run(_query_spans(rollout_id, attempt_id))

    def put_resources(self, resources: Resources) -> Resources:
        """See `StoreClient.put_resources`."""
        return self._run(_put_resources(resources))

    def get_resources(self, version: int | None = None) -> Resources | None:
        """See `StoreClient.get_resources`."""
        return self._run(_get_resources(version))

    def get_rollout(self, rollout_id: str) -> Rollout:
        """See `StoreClient.get_rollout`."""
        return self._run(_get_rollout(rollout_id))

    def query_rollouts(
        self, *, status: Iterable[RolloutStatus] | None = None, rollout_ids: Iterable[str] | None = None
    ) -> list[Rollout]:
        """See `StoreClient.query_rollouts`."""
        return self._run(_query_rollouts(status, rollout_ids))

    def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """See `StoreClient.query_attempts`."""
        return self._run(_query_attempts(rollout_id))

    def wait(self, rollout_ids: Iterable[str], *, timeout_s: float | None = None) -> WaitResult:
        """See `StoreClient.wait`."""
        return self._run(_wait(rollout_ids, timeout_s))

    def counts(self) -> dict[RolloutStatus, int]:
        """See `StoreClient.counts`."""
        return self._run(_counts())

    def put_token(self, record: TokenRecord) -> None:
        """See `StoreClient.put_token`."""
        self._run(_put_token(record))

    def get_token(self, token_id: str) -> TokenRecord | None:
        """See `StoreClient.get_token`."""
        return self._run(_get_token(token_id))

    def list_tokens(self) -> list[TokenRecord]:
        """See `StoreClient.list_tokens`."""
        return self._run(_list_tokens())

    def whoami(self) -> WhoamiResponse:
        """See `StoreClient.whoami`."""
        return self._run(_whoami())

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> SyncStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def feedback(
    store: str | Any,
    *,
    reward: float,
    session_id: str | None = None,
    response_id: str | None = None,
    feedback_id: str | None = None,
    intermediate: dict[str, float] | None = None,
    note: str | None = None,
    token: str | None = None,
) -> FeedbackResult:
    """Reward a served session from ordinary (synchronous) application code: ``store`` is a store server's URL
    (``lightrail store serve``; ``token`` its bearer token) or a `SyncStoreClient`. Retrying with the same
    ``feedback_id`` is safe; without one a fresh id is chosen, so pass yours when you may send twice."""
    body = Feedback(
        reward=reward,
        session_id=session_id,
        response_id=response_id,
        feedback_id=feedback_id or new_id("fb"),
        intermediate=dict(intermediate or {}),
        note=note,
    )
    if isinstance(store, str):
        client = SyncStoreClient(store, token=token)
        try:
            return client.feedback(body)
        finally:
            client.close()
    return store.feedback(body)
