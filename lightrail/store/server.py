"""The store over HTTP: a Starlette app that exposes any `Store` to runners and trainers on other processes/hosts.

Data flow: a `StoreClient` (``lightrail/store/client.py``) encodes a request struct of ``_wire.py`` with
msgspec, this app decodes it with a typed `msgspec.json.Decoder` (a bad field is named in the 400),
calls the wrapped store, and answers with a small msgspec-encoded struct (counts and ids for writes; spans are
never echoed back).

Concurrency model: one event loop (uvicorn's), no locks. The store is created inside that loop at startup and
closed at shutdown (lifespan), so a `SQLiteStore` lives entirely on the server's loop. Long polls (`lease`,
`wait`) await the store directly and are abandoned when the client disconnects.

Speed matters here (the reference spends 2 ms of server CPU per request): plain Starlette routes, one pure ASGI
middleware for auth and the body limit (never ``BaseHTTPMiddleware``), pre-built decoders/encoders, httptools
and uvloop when installed.

    from lightrail.store.server import serve
    serve("runs/store.db", port=4747, token="s3cret")   # blocks; prints the URL
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from lightrail._serving import bind as _bind
from lightrail._serving import serve_app, tls_options
from lightrail._serving import url_of as _url
from lightrail._serving import uvicorn_config as _uvicorn_config
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
    ErrorDetail,
    ErrorResponse,
    FinishRequest,
    HealthResponse,
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
    ID_RULE,
    MAX_ID_CHARS,
    ForbiddenError,
    InvalidIdError,
    Store,
    StoreError,
    check_id,
    check_token_ids,
)
from lightrail.store.sessions import give_feedback
from lightrail.store.tokens import (
    ADMIN,
    ROUTE_ROLES,
    Principal,
    Role,
    TokenRecord,
    TokenVerifier,
    Verify,
    owns_attempt,
    parse_token,
    runner_attempt_id,
    token_verifier,
)
from lightrail.types import LLM, IllegalTransitionError, Resources

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_WAIT_S",
    "OTLP_TRACES_PATH",
    "ServerHandle",
    "UiRoutes",
    "create_app",
    "open_server_store",
    "serve",
    "serve_app",
    "serve_in_thread",
    "store_lifespan",
    "tls_options",
]

log = logging.getLogger("lightrail.store.server")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
OTLP_TRACES_PATH = "/v1/traces"
"""OTLP/HTTP's default traces path: point an exporter's endpoint at ``<store url>/v1/traces``."""

UiRoutes = Callable[[Callable[[], Store], Verify | None], list[Route]]
"""Web pages an app serves next to the store's API, built from the app's store and who a bearer token is (None: a
server without a token, everyone is admin). ``lightrail store serve`` passes the dashboard's
(`lightrail.dashboard.app.dashboard_routes`); the store itself knows no pages. They sign in their own way (a page
answers with a sign-in form, not a 401), so the API's bearer check leaves their paths alone: every path under the
first segment of one of their routes (``/ui`` for the dashboard)."""


# ---------------------------------------------------------------------------------------------------------------
# Responses and errors
# ---------------------------------------------------------------------------------------------------------------

_encode = msgspec.json.Encoder().encode
_FIELD_RE = re.compile(r" - at `(\$[^`]*)`$")


class _JSON(Response):
    media_type = "application/json"


def _ok(body: msgspec.Struct) -> Response:
    return _JSON(_encode(body))


def _error(status: int, message: str, type_: str, field: str | None = None) -> Response:
    return _JSON(_encode(ErrorResponse(error=ErrorDetail(message=message, type=type_, field=field))), status)


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    """The client disconnected during a long poll; whatever we answer is dropped."""


def _error_response(exc: BaseException) -> Response:
    """Map an exception raised by a handler to its HTTP answer (the one place that does)."""
    if isinstance(exc, InvalidIdError):  # raised by the store, which names the field as its argument's path
        return _error(400, str(exc), "InvalidIdError", None if exc.field is None else f"$.{exc.field}")
    if isinstance(exc, StoreError):
        return _error(exc.http_status, str(exc), type(exc).__name__)
    if isinstance(exc, IllegalTransitionError):
        return _error(409, str(exc), "IllegalTransitionError")
    if isinstance(exc, msgspec.ValidationError):
        message = str(exc)
        m = _FIELD_RE.search(message)
        return _error(400, message, "ValidationError", m.group(1) if m else None)
    if isinstance(exc, msgspec.DecodeError):
        return _error(400, str(exc), "DecodeError")
    if isinstance(exc, OverflowError):  # a number no database column holds, in a field not declared Int64
        return _error(400, f"a number in the request is out of range: {exc}", "ValidationError")
    if isinstance(exc, _BodyTooLarge):
        return _error(413, str(exc), "PayloadTooLarge")
    if isinstance(exc, _ClientGone):
        return Response(status_code=499)
    if isinstance(exc, HTTPException):
        return _error(exc.status_code, str(exc.detail), "HTTPError")
    # The traceback goes to the server log only: clients get a short message.
    log.error("unexpected error in store request", exc_info=exc)
    return _error(500, f"internal error: {type(exc).__name__}", "InternalError")


def _param(request: Request, name: str) -> str:
    return request.path_params[name]


async def _until_disconnect(request: Request) -> None:
    """Return when the client goes away (the body has been read already, so only a disconnect can arrive)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """Run a long-poll coroutine, cancelling it if the client disconnects first (an abandoned `lease` must not
    start an attempt nobody will run; the client retries with the same ``attempt_id`` if it still wants one)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # server shutdown
        task.cancel()
        watcher.cancel()
        raise
    watcher.cancel()
    if task in done:  # finished, even if the client just left: a retry with the same attempt_id gets it
        return task.result()
    task.cancel()
    await asyncio.wait((task,))  # let the store unwind before answering (asyncio.wait never raises its error)
    raise _ClientGone


def _wait_cap(value: float | None) -> float:
    if value is None:
        return MAX_WAIT_S
    return min(max(value, 0.0), MAX_WAIT_S)


_PRINCIPAL = "lightrail.principal"
"""Scope key where the auth middleware leaves who the request acts as (a `Principal`)."""


def _principal(request: Request) -> Principal:
    return request.scope.get(_PRINCIPAL, ADMIN)


def _check_attempts(request: Request, attempt_ids: Any) -> None:
    """Refuse writes into attempts the request's token may not write into (runner: its own; ingest: named)."""
    principal = _principal(request)
    if principal.role is Role.ADMIN:
        return
    for attempt_id in attempt_ids:
        if not owns_attempt(principal, attempt_id):
            whose = "attempts it leased" if principal.role is Role.RUNNER else "the attempts named when it was minted"
            raise ForbiddenError(
                f"attempt {attempt_id!r} is not this {principal.role.value} token's (it writes only into {whose}); "
                "an admin token writes anywhere"
            )


def _visible(request: Request, resources: Resources) -> Resources:
    """Resources as the request's token may see them: a scoped token does not see the keys of gateway (routed)
    endpoints, which would open every attempt's route; its runner calls them with its own token instead."""
    if _principal(request).role is Role.ADMIN or not any(
        isinstance(item, LLM) and item.routed and item.api_key for item in resources.items.values()
    ):
        return resources
    items = {
        name: msgspec.structs.replace(item, api_key=None) if isinstance(item, LLM) and item.routed else item
        for name, item in resources.items.items()
    }
    return msgspec.structs.replace(resources, items=items)


def _authorized(name: str, endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """Let through only the roles `ROUTE_ROLES` allows for route ``name`` (403 naming them otherwise)."""
    allowed = ROUTE_ROLES[name]
    needed = " or ".join(role.value for role in Role if role in allowed)

    async def authorized(request: Request) -> Response:
        role = _principal(request).role
        if role not in allowed:
            raise ForbiddenError(f"{name} needs a token with role {needed}; this token's role is {role.value}")
        return await endpoint(request)

    authorized.__name__ = authorized.__qualname__ = name
    return authorized


# ---------------------------------------------------------------------------------------------------------------
# Routes (the table itself is `_wire.ROUTES`)
# ---------------------------------------------------------------------------------------------------------------


def _handlers(get_store: Callable[[], Store], tokens: TokenVerifier) -> dict[str, Callable[[Request], Any]]:
    """The endpoint of each route name. ``get_store`` returns the store created at startup."""
    decoders: dict[str, msgspec.json.Decoder[Any]] = {
        r.name: msgspec.json.Decoder(r.request) for r in ROUTES if r.request is not None
    }

    async def body(request: Request, name: str) -> Any:
        return decoders[name].decode(await request.body())

    async def enqueue(request: Request) -> Response:
        req: EnqueueRequest = await body(request, "enqueue")
        return _ok(RolloutsResponse(rollouts=await get_store().enqueue(req.specs)))

    async def query_rollouts(request: Request) -> Response:
        req: QueryRolloutsRequest = await body(request, "query_rollouts")
        rollouts = await get_store().query_rollouts(status=req.status, rollout_ids=req.rollout_ids)
        return _ok(RolloutsResponse(rollouts=rollouts))

    async def page_rollouts(request: Request) -> Response:
        req: PageRolloutsRequest = await body(request, "page_rollouts")
        try:
            page = await get_store().query_rollouts_page(
                status=req.status, mode=req.mode, metadata=req.metadata, limit=req.limit, offset=req.offset,
                before=req.before,
            )  # fmt: skip
        except ValueError as exc:  # a metadata key that is not a plain name
            return _error(400, str(exc), "ValidationError", "$.metadata")
        return _ok(page)

    async def cancel(request: Request) -> Response:
        req: RolloutIdsRequest = await body(request, "cancel")
        return _ok(RolloutsResponse(rollouts=await get_store().cancel(req.rollout_ids)))

    async def wait(request: Request) -> Response:
        req: WaitRequest = await body(request, "wait")
        work = get_store().wait(req.rollout_ids, timeout_s=_wait_cap(req.timeout_s))
        waited = await _unless_disconnected(request, work)
        return _ok(WaitResponse(rollouts=list(waited), pending=waited.pending, timed_out=waited.timed_out))

    async def get_rollout(request: Request) -> Response:
        return _ok(await get_store().get_rollout(_param(request, "rollout_id")))

    async def query_attempts(request: Request) -> Response:
        return _ok(AttemptsResponse(attempts=await get_store().query_attempts(_param(request, "rollout_id"))))

    async def query_spans(request: Request) -> Response:
        attempt_id = request.query_params.get("attempt_id")
        spans = await get_store().query_spans(_param(request, "rollout_id"), attempt_id)
        return _ok(SpansResponse(spans=spans))

    async def lease(request: Request) -> Response:
        req: LeaseRequest = await body(request, "lease")
        wait_s = _wait_cap(req.wait_s)
        attempt_id, principal = req.attempt_id, _principal(request)
        if principal.role is Role.RUNNER:  # the attempt carries its runner token's id: see lightrail.store.tokens
            if attempt_id is not None:  # as asked for: with the prefix, an empty one would pass the store's check
                check_id("attempt_id", attempt_id)
            attempt_id = runner_attempt_id(principal.token_id or "", attempt_id)
        work = get_store().lease(req.worker_id, wait_s=wait_s, attempt_id=attempt_id)
        got = await (_unless_disconnected(request, work) if wait_s > 0 else work)
        return _ok(LeaseResponse(lease=got))

    async def heartbeat(request: Request) -> Response:
        _check_attempts(request, [_param(request, "attempt_id")])
        return _ok(await get_store().heartbeat(_param(request, "attempt_id")))

    async def finish(request: Request) -> Response:
        req: FinishRequest = await body(request, "finish")
        _check_attempts(request, [_param(request, "attempt_id")])
        attempt = await get_store().finish(
            _param(request, "attempt_id"), req.status, reward=req.reward, error=req.error
        )
        return _ok(attempt)

    async def open_session(request: Request) -> Response:
        req: OpenSessionRequest = await body(request, "open_session")
        if req.spec.mode != "served":
            return _error(400, f"spec.mode must be 'served', got {req.spec.mode!r}", "ValidationError", "$.spec.mode")
        return _ok(await get_store().open_session(req.spec, attempt_id=req.attempt_id, worker_id=req.worker_id))

    async def delete_sessions(request: Request) -> Response:
        req: DeleteSessionsRequest = await body(request, "delete_sessions")
        return _ok(DeletedResponse(deleted=await get_store().delete_sessions(created_before=req.created_before)))

    async def feedback(request: Request) -> Response:
        return _ok(await give_feedback(get_store(), await body(request, "feedback")))

    async def add_spans(request: Request) -> Response:
        req: AddSpansRequest = await body(request, "add_spans")
        if _principal(request).role is not Role.ADMIN:
            _check_attempts(request, {span.attempt_id for span in req.spans})
        return _ok(AddedResponse(added=await get_store().add_spans(req.spans)))

    async def put_resources(request: Request) -> Response:
        req: Resources = await body(request, "put_resources")
        return _ok(await get_store().put_resources(req))

    async def get_latest_resources(request: Request) -> Response:
        resources = await get_store().get_resources(None)
        return _ok(ResourcesResponse(resources=None if resources is None else _visible(request, resources)))

    async def get_resources(request: Request) -> Response:
        raw = _param(request, "version")
        try:
            version = int(raw)
        except ValueError:
            return _error(400, f"resources version must be an integer, got {raw!r}", "ValidationError", "version")
        if not 1 <= version < 2**63:  # versions count from 1; beyond 64 bits no database could hold one
            return _error(404, f"unknown resources version {version}", "NotFoundError")
        got = await get_store().get_resources(version)
        if got is None:  # pragma: no cover - stores raise NotFoundError for a missing version
            return _error(404, f"unknown resources version {version}", "NotFoundError")
        return _ok(_visible(request, got))

    async def counts(request: Request) -> Response:
        return _ok(CountsResponse(counts=await get_store().counts()))

    async def put_token(request: Request) -> Response:
        record: TokenRecord = await body(request, "put_token")
        check_token_ids(record)  # the rule every store keeps, first; a server's tokens are stricter still
        if parse_token(f"lrt_{record.token_id}_{'x' * 20}") is None or not re.fullmatch(
            r"[0-9a-f]{64}", record.secret_sha256
        ):
            return _error(400, "token_id must be 12 hex digits and secret_sha256 64", "ValidationError", "$.token_id")
        await get_store().put_token(record)
        tokens.forget(record.token_id)
        return _ok(record)

    async def list_tokens(request: Request) -> Response:
        return _ok(TokensResponse(tokens=await get_store().list_tokens()))

    async def get_token(request: Request) -> Response:
        return _ok(TokenResponse(token=await get_store().get_token(_param(request, "token_id"))))

    async def whoami(request: Request) -> Response:
        principal = _principal(request)
        return _ok(WhoamiResponse(role=principal.role, token_id=principal.token_id))

    health_body = _encode(HealthResponse())

    async def health(request: Request) -> Response:
        return _JSON(health_body)

    openapi_body = _encode(openapi_document())

    async def openapi(request: Request) -> Response:
        return _JSON(openapi_body)

    defined = locals()
    return {r.name: defined[r.name] for r in ROUTES}


def _otlp_traces(get_store: Callable[[], Store], max_body_bytes: int) -> Callable[[Request], Any]:
    """``POST /v1/traces``: OTLP/HTTP trace ingest for any OpenTelemetry exporter or collector. The body becomes
    lightrail spans in `lightrail.tracing.otlp` (imported on the first request: it loads opentelemetry-proto),
    stored in one ``add_spans`` call, so a request is stored whole or not at all. The conversion runs on the
    server's loop like every store call (~10 us a span: a 512-span batch holds the loop for ~5 ms)."""

    async def otlp_traces(request: Request) -> Response:
        from lightrail.tracing import otlp

        headers = request.headers
        try:
            spans, media = otlp.spans_from_body(
                await request.body(),
                headers.get("content-type"),
                headers.get("content-encoding"),
                headers=headers,
                max_bytes=max_body_bytes,
            )
        except otlp.OTLPError as exc:
            # OTLP exporters log only the status line, so the reason is logged here too.
            log.warning("OTLP traces request refused (%s): %s", exc.http_status, exc)
            return _error(exc.http_status, str(exc), type(exc).__name__)
        _check_attempts(request, {span.attempt_id for span in spans})
        await get_store().add_spans(spans)
        return Response(otlp.response_body(media), media_type=media)

    return otlp_traces


def _guarded(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """Turn every exception of an endpoint into its JSON error answer (see `_error_response`)."""

    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:  # not CancelledError (a BaseException): shutdown must still cancel handlers
            return _error_response(exc)

    guarded.__name__ = guarded.__qualname__ = endpoint.__name__
    return guarded


# ---------------------------------------------------------------------------------------------------------------
# Auth and body limit: one pure ASGI middleware
# ---------------------------------------------------------------------------------------------------------------


class _Guard:
    """Who a request acts as, and the request-body limit, without wrapping the response path.

    The admin token (``--token``) is compared in constant time; any other bearer is looked up as a scoped token
    (`TokenVerifier`); the `Principal` goes into the scope for the routes' role checks. ``/health`` stays open, pages
    (`UiRoutes`, under ``ui_prefixes``) check the same tokens themselves (the dashboard also reads them from its
    cookie and answers a page), and a server without a token serves everyone as admin (loopback only: the serve
    command refuses otherwise)."""

    def __init__(
        self, app: Any, *, token: str | None, max_body_bytes: int, tokens: TokenVerifier, ui_prefixes: tuple[str, ...]
    ):
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.tokens = tokens
        self.ui = frozenset(ui_prefixes)
        self.ui_pages = tuple(f"{prefix}/" for prefix in ui_prefixes)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = b""
        length = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
            elif key == b"content-length":
                length = value
        expected = self.expected
        # The route path without the mount prefix, so /health stays open when this app is mounted elsewhere.
        path = scope["path"][len(scope.get("root_path", "")) :] if scope.get("root_path") else scope["path"]
        public = path == "/health" or path in self.ui or path.startswith(self.ui_pages)  # pages sign in their own way
        if expected is not None and not public and not hmac.compare_digest(authorization, expected):
            principal = None
            if authorization.startswith(b"Bearer "):
                principal = await self.tokens.principal(authorization[7:].decode("latin-1"))
            if principal is None:
                message = "missing bearer token" if not authorization else "invalid, expired or revoked bearer token"
                await _error(401, message, "Unauthorized")(scope, receive, send)
                return
            scope[_PRINCIPAL] = principal
        limit = self.max_body_bytes
        if length is not None:
            try:
                too_big = int(length) > limit
            except ValueError:
                too_big = False
            if too_big:
                await _error(413, f"request body over {limit} bytes", "PayloadTooLarge")(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No Content-Length (chunked upload): count the bytes as they stream in.
        seen = 0

        async def counting_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge(f"request body over {limit} bytes")
            return message

        await self.app(scope, counting_receive, send)


# ---------------------------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------------------------


def open_server_store(url: str | os.PathLike[str]) -> Store:
    """The store a server serves: a database `open_store` accepts (``memory:``, ``postgresql://...``,
    ``sqlite:///PATH`` or a SQLite file path). An ``http(s)://`` URL is refused: a server serves a database, not
    another server."""
    from lightrail.store import open_store, sqlite_path, store_kind

    if isinstance(url, os.PathLike):
        from lightrail.store.sqlite import SQLiteStore

        return SQLiteStore(sqlite_path(os.fspath(url)))
    if store_kind(url) == "http":
        raise ValueError(f"a store server serves a database, not another store server: {url!r}")
    return open_store(url)


def store_lifespan(store: Store | Callable[[], Store]) -> tuple[Callable[[], Store], Callable[[Any], Any]]:
    """``(get_store, lifespan)`` for an app serving ``store``: a `Store` is served as is and left open for its owner;
    a zero-argument factory is called at startup inside the server's event loop, connected at once (a bad database
    fails startup, not a request) and closed at shutdown."""
    state: dict[str, Store] = {}
    factory = None if isinstance(store, Store) else store
    if isinstance(store, Store):
        state["store"] = store

    def get_store() -> Store:
        return state["store"]

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        if factory is not None:
            state["store"] = factory()
            opening = getattr(state["store"], "open", None)
            if opening is not None:  # PostgresStore connects explicitly
                await opening()
        try:
            yield
        finally:
            if factory is not None:
                await state.pop("store").close()

    return get_store, lifespan


def create_app(
    store: Store | Callable[[], Store],
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ui: UiRoutes | None = None,
) -> Any:
    """The store's ASGI app: its API, and the pages ``ui`` builds next to it (`UiRoutes`; ``lightrail store serve``
    mounts the dashboard under ``/ui`` this way).

    ``store`` is a `Store`, or a zero-argument factory called at startup inside the server's event loop (the
    app then owns the store and closes it at shutdown; a passed-in store is left open for its owner).
    With a ``token``, every route except ``GET /health`` needs ``Authorization: Bearer <token>`` (the admin role)
    or a scoped token the store holds, within its role (`lightrail.store.tokens`); ``ui`` is given the same check
    (the admin token, then the scoped tokens) for its own sign-in.
    """
    get_store, lifespan = store_lifespan(store)
    tokens = TokenVerifier(get_store)
    handlers = _handlers(get_store, tokens)
    routes = [
        Route(r.path, _guarded(_authorized(r.name, handlers[r.name]) if r.name != "health" else handlers[r.name]),
              methods=[r.method], name=r.name)
        for r in ROUTES
    ]  # fmt: skip
    traces = _guarded(_authorized("otlp_traces", _otlp_traces(get_store, max_body_bytes)))
    routes.append(Route(OTLP_TRACES_PATH, traces, methods=["POST"], name="otlp_traces"))
    pages = ui(get_store, token_verifier(token, tokens.principal)) if ui is not None else []
    ui_prefixes = tuple(sorted({"/" + page.path.split("/")[1] for page in pages}))
    clash = set(ui_prefixes) & {"/" + route.path.split("/")[1] for route in routes}
    if clash:  # the bearer check skips pages' paths: a page under /v1 would open the API
        raise ValueError(f"ui pages may not share the API's paths: {sorted(clash)}")
    routes += pages

    async def http_error(request: Request, exc: Exception) -> Response:
        return _error_response(exc)  # unknown route (404) or method (405) as JSON, like every other error

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes, tokens=tokens, ui_prefixes=ui_prefixes)
    return app


# ---------------------------------------------------------------------------------------------------------------
# OpenAPI
# ---------------------------------------------------------------------------------------------------------------


_ID_CONSTRAINTS = {"minLength": 1, "maxLength": MAX_ID_CHARS, "description": f"An id: {ID_RULE}."}


def _constrain_ids(schema: dict[str, Any]) -> None:
    """State `check_id`'s rule on every id of a component schema (``*_id`` strings, ``rollout_ids`` items), so the
    document says what the stores refuse (the stores stay the authority: control characters are not expressed)."""
    for name, prop in schema.get("properties", {}).items():
        for option in prop.get("anyOf", [prop]):
            if name.endswith("_id") and option.get("type") == "string":
                option.update({k: v for k, v in _ID_CONSTRAINTS.items() if k not in option})
            elif name == "rollout_ids" and option.get("type") == "array" and option["items"].get("type") == "string":
                option["items"].update(_ID_CONSTRAINTS)


def openapi_document() -> dict[str, Any]:
    """An OpenAPI 3.1 document built from `ROUTES` and the msgspec schemas of the request/response structs."""
    wire_types = {t for r in ROUTES for t in (r.request, r.response) if isinstance(t, type) and t is not dict}
    wire_types.add(ErrorResponse)
    ordered = sorted(wire_types, key=lambda t: t.__name__)
    schemas, components = msgspec.json.schema_components(ordered, ref_template="#/components/schemas/{name}")
    ref = dict(zip(ordered, schemas, strict=True))
    for component in components.values():
        _constrain_ids(component)
    error = {"description": "Error", "content": {"application/json": {"schema": ref[ErrorResponse]}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {"operationId": r.name, "summary": r.summary}
        params = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "integer" if p == "version" else "string"}}
            for p in re.findall(r"{(\w+)}", r.path)
        ]
        params += [
            {"name": q, "in": "query", "required": False, "description": d, "schema": {"type": "string"}}
            for q, d in r.query
        ]
        for param in params:
            if param["name"].endswith("_id"):
                param["schema"].update(_ID_CONSTRAINTS)
        if params:
            op["parameters"] = params
        if r.request is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref[r.request]}}}
        schema = ref.get(r.response, {"type": "object"})
        op["responses"] = {
            "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
            "default": error,
        }
        if r.path == "/health":
            op["security"] = []
        paths.setdefault(r.path, {})[r.method.lower()] = op
    otlp_body = {"schema": {"type": "string", "format": "binary"}}
    paths[OTLP_TRACES_PATH] = {
        "post": {
            "operationId": "otlp_traces",
            "summary": "OTLP/HTTP trace ingest (ExportTraceServiceRequest, protobuf or OTLP/JSON, gzip allowed); "
            "every span needs lightrail.rollout_id and lightrail.attempt_id (span or resource attributes) or the "
            "x-lightrail-rollout-id / x-lightrail-attempt-id headers. Stored all or nothing.",
            "requestBody": {
                "required": True,
                "content": {"application/x-protobuf": otlp_body, "application/json": {"schema": {"type": "object"}}},
            },
            "responses": {
                "200": {"description": "ExportTraceServiceResponse, in the request's encoding"},
                "default": error,
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "lightrail store", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


# ---------------------------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------------------------


def _store_factory(store_path_or_store: Any) -> Callable[[], Store]:
    """A factory, so the app owns (and at shutdown closes) the store either way."""
    if isinstance(store_path_or_store, (str, os.PathLike)):
        return lambda: open_server_store(store_path_or_store)
    return lambda: store_path_or_store


def serve(
    store_path_or_store: str | os.PathLike[str] | Store,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    log_level: str = "warning",
    ui: UiRoutes | None = None,
    then: str = "",
) -> None:
    """Serve a store until interrupted (blocking), with the pages of ``ui`` next to its API (`create_app`).

    A URL or path (anything `open_server_store` takes) opens its store inside the server's loop; a `Store` object
    is served as is. Either way the store is closed when the server stops. The bound URL is printed to stdout
    (port 0 picks a free port) once the store is open and the server accepts connections, so a parent process can
    read it and connect at once, then the line ``then`` (``{url}`` filled in) if given; a store that cannot be
    opened raises here, before anything is printed. ``tls_cert`` and ``tls_key`` (PEM files) serve HTTPS.
    """
    tls = tls_options(tls_cert, tls_key)
    app = create_app(_store_factory(store_path_or_store), token=token, max_body_bytes=max_body_bytes, ui=ui)
    serve_app(app, "lightrail store", host=host, port=port, tls=tls, then=then, log_level=log_level)


class ServerHandle:
    """A store server running in a background thread (tests, notebooks). ``url`` is where it listens."""

    def __init__(self, url: str, server: Any, thread: threading.Thread):
        self.url = url
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests end (long polls are cut after 1 s), close the store."""
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():  # pragma: no cover - only on a wedged handler
            self._server.force_exit = True
            self._thread.join(timeout_s)


def serve_in_thread(
    path: str | os.PathLike[str] | Store,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    ui: UiRoutes | None = None,
) -> ServerHandle:
    """Start a store server on its own thread and event loop and return once it answers, with the pages of ``ui``
    next to its API (`create_app`).

    The store at ``path`` (anything `open_server_store` takes) is created inside the server's loop; a `Store` object is
    served as is (and closed at stop). ``port`` 0 picks a free one; passing a previous server's port restarts
    "the same server" (SO_REUSEADDR). ``tls_cert`` and ``tls_key`` (PEM files) serve HTTPS.
    """
    import uvicorn

    tls = tls_options(tls_cert, tls_key)
    app = create_app(_store_factory(path), token=token, max_body_bytes=max_body_bytes, ui=ui)
    sock = _bind(host, port)
    url = _url(host, sock, bool(tls))
    config = _uvicorn_config(app, host, sock.getsockname()[1], timeout_graceful_shutdown=1, **tls)
    server = uvicorn.Server(config)  # on a thread that is not the main one, uvicorn leaves signals alone
    failure: list[BaseException] = []

    def run() -> None:
        try:
            if config.loop == "uvloop":
                import uvloop

                runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            else:
                runner = asyncio.Runner()
            with runner:
                runner.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # pragma: no cover - reported to the starting thread
            failure.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"lightrail-store-{url}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if failure or not thread.is_alive():
            raise RuntimeError(f"store server at {url} failed to start") from (failure[0] if failure else None)
        if time.monotonic() > deadline:  # pragma: no cover
            server.should_exit = True
            raise RuntimeError(f"store server at {url} did not start within 30 s")
        time.sleep(0.002)
    return ServerHandle(url, server, thread)


if __name__ == "__main__":  # pragma: no cover - `python -m lightrail.store.server [PATH]`
    serve(sys.argv[1] if len(sys.argv) > 1 else "lightrail.db")
