"""The gateway's ASGI app: OpenAI-compatible routes in front of a `Backend`, one span per routed call.

Routes::

    POST /rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions   recorded
    POST /rollouts/{rollout_id}/attempts/{attempt_id}/v1/completions        recorded
    GET  /rollouts/{rollout_id}/attempts/{attempt_id}/v1/models
    POST /v1/chat/completions, /v1/completions; GET /v1/models               served (recorded under sessions
                                                                            with ``sessions=``, see recording.py)
    .../agents/{agent}/v1/...                                               any of the above, made by ``agent``
    GET  /health                                                            no auth

A routed call is attributed to its attempt by the path. The agent that makes a call is named by an
``/agents/{agent}`` segment before ``/v1`` (`lightrail.types.LLM.endpoint_for`), else by the `AGENT_HEADER`
(percent-encoded; `lightrail.as_agent` and a runner with OpenTelemetry on set it); an invalid name is a 400. The
name goes to the backend (`ChatRequest.agent`: a `PolicyRouter` picks the agent's policy by it) and onto the call's
span (`Attr.CALLER_AGENT`), where training reads it first. The attempt must exist (checked once with
`Store.query_attempts`, then cached; unknown ids get a 404 before the body is read). An attempt that has
already ended is still served and recorded: its spans are harmless (the trainer only reads finished
rollouts' spans, and late spans of a lost attempt are never trained on), while refusing would turn a
runner/heartbeat race into agent errors.

Every routed call that passed auth and the attempt check is recorded as one `Span` named
``Attr.SPAN_LLM_CALL`` -- failed calls too, with status ERROR and the error message. A valid W3C ``traceparent``
header makes the span a child of the caller's span (its trace id and parent id): with OpenTelemetry on in the
runner (`lightrail.tracing.otel`), the framework span that made the call, so the call is attributed to its agent. Spans go to a
`lightrail.tracing.SpanBatcher` (the runner's batcher) that writes them in batches; a routed call is answered once its
span is stored (concurrent calls share the write), so the runner's finish, which follows the agent's last answer,
always finds every call of the attempt in the store, and a gateway killed after answering has lost nothing it
acknowledged. Served (session) calls are recorded in the background: their answer does not wait for the store.

A call whose client disconnects before its answer is sent (a client timeout, a stream closed before its first
event: streams are replayed from complete generations, so nothing reaches the client before the generation ends)
is abandoned: the backend call is cancelled (the embedded engine drops the request's rows at its next step; an
upstream's HTTP request is closed, which vLLM and another lightrail gateway take as a cancellation), and the span
is recorded with status ERROR, no choices and ``Attr.ABANDONED`` true, which the adapters never train on. The
disconnect is seen by a task awaiting the ASGI ``receive`` once the body is read (the server answers it with
``http.disconnect`` when the connection closes). A client that leaves during the few milliseconds its answer's
span is being stored is recorded as answered: the span is written before the answer, by design (above).

Concurrency model: single event loop; the state shared between requests (attempt cache, seq counter) is
only touched between awaits; span seqs come from `lightrail.types.next_seq`, the counter the runner uses too. Nothing is logged per request at INFO.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lightrail.gateway.anthropic_api import MESSAGES, parse_count_tokens
from lightrail.gateway.backends import Backend, UpstreamError
from lightrail.gateway.dialect import Dialect, Exchange
from lightrail.gateway.openai_api import CHAT, COMPLETIONS, InvalidRequest, decode_json, new_response_id
from lightrail.gateway.openapi import openapi_document
from lightrail.gateway.recording import SESSION_HEADER, SessionRecorder, session_attributes
from lightrail.gateway.responses_api import RESPONSES
from lightrail.gateway.sse import CHUNK_CHARS
from lightrail.store.base import (
    ForbiddenError,
    InvalidIdError,
    NotFoundError,
    Store,
    UnauthorizedError,
    check_id,
)
from lightrail.store.tokens import Role, TokenVerifier, owns_attempt
from lightrail.tracing import SpanBatcher
from lightrail.types import (
    AGENT_HEADER,
    Attr,
    BackendError,
    ChatRequest,
    Span,
    SpanStatus,
    StatusCode,
    agent_from_header,
    check_agent_name,
    next_seq,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_gateway_app", "parse_traceparent"]

log = logging.getLogger(__name__)

DIALECTS: tuple[Dialect, ...] = (CHAT, COMPLETIONS, MESSAGES, RESPONSES)
"""The APIs served, each at ``/v1<path>`` and under the per-attempt prefix."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted (413 above): long agent transcripts fit, runaway clients do not."""

_encode = msgspec.json.encode
_JSON = "application/json"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

CLIENT_CLOSED_STATUS = 499
"""The status of an abandoned call's answer (nginx's "client closed request"); nobody receives it, the span and the
access log show it."""


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_encode(obj), status_code=status, media_type=_JSON)


def _error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param=None,
    code=None,
    dialect: Dialect = CHAT,
) -> Response:
    return _json(dialect.error_body(message, type=type, param=param, code=code, status=status), status)


def _refusal(exc: InvalidRequest, dialect: Dialect = CHAT) -> Response:
    return _error(exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code, dialect=dialect)


class _Gateway:
    """State and handlers behind `create_gateway_app` (one instance per app)."""

    def __init__(
        self,
        backend: Backend,
        store: Store,
        recorder: SpanBatcher,
        *,
        max_body_bytes: int,
        stream_chunk_chars: int,
        max_cached_attempts: int = 100_000,
        sessions: SessionRecorder | None = None,
    ) -> None:
        self.backend = backend
        self.sessions = sessions
        self._openapi = json.dumps(openapi_document()).encode()
        self.store = store
        self.recorder = recorder
        self.max_body_bytes = max_body_bytes
        self.stream_chunk_chars = stream_chunk_chars
        self.max_cached_attempts = max_cached_attempts
        self._known_attempts: set[tuple[str, str]] = set()
        self._refused: set[tuple[str, str]] = set()
        """Attempts already marked as having had a call refused for its key (`key_refused`)."""
        self._background: set[asyncio.Task[None]] = set()

    # -- refusals --------------------------------------------------------------------------------------------

    def key_refused(self, path: str, status: int, message: str) -> None:
        """`BearerAuth` refused a call for its key: on an attempt's route, mark the attempt once
        (`Attr.SPAN_KEY_REFUSED`), so ``lightrail dev`` and the run's digest say the key was refused instead of
        "the agent made no call". The mark is written only for an attempt that exists (ids are unguessable), at most
        once per attempt, and carries no part of the key."""
        parts = path.split("/")  # "", "rollouts", rid, "attempts", aid, ...
        if not (len(parts) > 5 and parts[1] == "rollouts" and parts[3] == "attempts"):
            return
        key = (parts[2], parts[4])
        if key in self._refused:
            return
        if len(self._refused) >= self.max_cached_attempts:
            self._refused.clear()
        self._refused.add(key)
        task = asyncio.get_running_loop().create_task(self._mark_refused(key, status, message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _mark_refused(self, attempt: tuple[str, str], status: int, message: str) -> None:
        if await self.attempt_error(*attempt) is not None:
            return
        now = time.time()
        self.recorder.submit(
            Span(
                rollout_id=attempt[0],
                attempt_id=attempt[1],
                seq=next_seq(),
                name=Attr.SPAN_KEY_REFUSED,
                start_time=now,
                end_time=now,
                attributes={Attr.REFUSED_STATUS: status},
                status=SpanStatus(code=StatusCode.ERROR, message=message),
            )  # fmt: skip
        )

    # -- attribution ----------------------------------------------------------------------------------------

    async def attempt_error(self, rollout_id: str, attempt_id: str) -> InvalidRequest | None:
        """None if the attempt exists (cached after the first positive answer), else the error to answer."""
        key = (rollout_id, attempt_id)
        if key in self._known_attempts:
            return None
        try:
            check_id("attempt_id", attempt_id)
            attempts = await self.store.query_attempts(rollout_id)
        except InvalidIdError as exc:  # the store's id rule: the route names no attempt that could exist
            return InvalidRequest(str(exc), status=400, param=exc.field, code="invalid_id")
        except NotFoundError:
            return InvalidRequest(
                f"Unknown rollout {rollout_id!r}.", status=404, param="rollout_id", code="rollout_not_found"
            )
        except (UnauthorizedError, ForbiddenError) as exc:  # the gateway's own store token: not the caller's fault
            log.error("the store refused the gateway's token while checking attempt %s: %s", attempt_id, exc)
            return InvalidRequest(
                "The store refused the gateway's store token; fix the gateway's --store-token.",
                status=500,
                type="server_error",
                code="store_token_refused",
            )
        except Exception as exc:
            log.warning("store unavailable while checking attempt %s: %r", attempt_id, exc)
            return InvalidRequest(
                "The store is unavailable; try again.", status=503, type="server_error", code="store_unavailable"
            )
        if not any(a.attempt_id == attempt_id for a in attempts):
            return InvalidRequest(
                f"Rollout {rollout_id!r} has no attempt {attempt_id!r}.",
                status=404,
                param="attempt_id",
                code="attempt_not_found",
            )
        if len(self._known_attempts) >= self.max_cached_attempts:
            self._known_attempts.clear()  # crude bound; a miss costs one store query
        self._known_attempts.add(key)
        return None

    # -- handlers -------------------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok", "models": self.backend.model_names(), "pending_spans": self.recorder.pending})

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    async def models(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "lightrail"} for m in self.backend.model_names()]
        return _json({"object": "list", "data": data})

    async def routed_models(self, request: Request) -> Response:
        params = request.path_params
        error = await self.attempt_error(params["rollout_id"], params["attempt_id"])
        return _refusal(error) if error else await self.models(request)

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the tokens of the prompt the backend would render for a Messages
        request (its chat template, tools and system prompt included), without generating or recording. The
        embedded engine counts itself; an upstream is asked (`OpenAIUpstream.count_tokens`: vLLM's ``/tokenize``);
        a backend that cannot count answers a 404 that says so, never an estimate."""
        try:
            chat = parse_count_tokens(decode_json(await self.read_body(request)))
            counter = getattr(self.backend, "count_tokens", None)
            if counter is None:
                raise InvalidRequest(
                    f"This gateway's backend ({type(self.backend).__name__}) cannot count tokens; the embedded engine "
                    "and a vLLM upstream can.",
                    status=404,
                    type="not_found_error",
                )
            return _json({"input_tokens": await counter(chat)})
        except InvalidRequest as exc:
            return _refusal(exc, MESSAGES)
        except BackendError as exc:
            return _error(exc.status, exc.message, param=exc.param, code=exc.code, dialect=MESSAGES)
        except UpstreamError as exc:
            log.warning("upstream failed to count tokens: %s", exc)
            return _error(UpstreamError.status, str(exc), type="server_error", code="upstream_error", dialect=MESSAGES)

    async def routed_count_tokens(self, request: Request) -> Response:
        params = request.path_params
        error = await self.attempt_error(params["rollout_id"], params["attempt_id"])
        return _refusal(error, MESSAGES) if error else await self.count_tokens(request)

    def handlers(self, dialect: Dialect) -> tuple[Any, Any]:
        """The unrouted (served, not recorded) and routed (recorded) handlers of one dialect."""

        async def served(request: Request) -> Response:
            return await self.serve(request, dialect, None)

        async def routed(request: Request) -> Response:
            params = request.path_params
            rollout_id, attempt_id = params["rollout_id"], params["attempt_id"]
            error = await self.attempt_error(rollout_id, attempt_id)
            if error is not None:
                return _refusal(error, dialect)
            return await self.serve(request, dialect, (rollout_id, attempt_id))

        return served, routed

    async def read_body(self, request: Request) -> bytes:
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit():
            if int(length) > limit:
                raise _too_large(limit)
            return await request.body()  # the server reads exactly content-length bytes
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def serve(self, request: Request, dialect: Dialect, attempt: tuple[str, str] | None) -> Response:
        """Validate, call the backend, answer; record a span when ``attempt`` is given, or under its session when
        served traffic is recorded."""
        start = time.time()
        recording = attempt is not None or self.sessions is not None
        seq = next_seq() if recording else 0
        data: dict[str, Any] | None = None
        exchange: Exchange | None = None
        generation = None
        response: dict[str, Any] | None = None
        failure: str | None = None
        session: tuple[str | None, str] | None = None
        client_gone: asyncio.Task[None] | None = None
        try:
            data = decode_json(await self.read_body(request))
            client_gone = asyncio.ensure_future(_client_gone(request.receive))
            if attempt is None and self.sessions is not None:
                session = self.sessions.session_of(request.headers, data)
            exchange = dialect.exchange(data)
            backend_request = exchange.request
            backend_request.agent = _caller_agent(request)
            if isinstance(backend_request, ChatRequest):
                generation = await _unless_gone(self.backend.chat(backend_request), client_gone)
            else:
                generation = await _unless_gone(self.backend.complete(backend_request), client_gone)
            response = exchange.respond(generation, new_response_id(exchange.id_prefix))
            exchange.answered(response)
            if exchange.stream:
                payload = exchange.events(response, generation, self.stream_chunk_chars)
                http = Response(payload, media_type="text/event-stream", headers=_SSE_HEADERS)
            else:
                http = Response(_encode(response), media_type=_JSON)
        except InvalidRequest as exc:
            failure = exc.message
            http = _refusal(exc, dialect)
        except _ClientGone:
            failure, http = _ABANDONED, _client_closed(dialect)
        except BackendError as exc:
            failure = exc.message
            http = _error(exc.status, exc.message, param=exc.param, code=exc.code, dialect=dialect)
        except UpstreamError as exc:
            failure = str(exc)
            log.warning("upstream failed: %s", exc)
            http = _error(UpstreamError.status, str(exc), type="server_error", code="upstream_error", dialect=dialect)
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
            log.exception("backend failed on %s", dialect.path)
            http = _error(500, "The model backend failed; see the gateway's log.", type="server_error", dialect=dialect)
        abandoned = False
        if client_gone is not None:
            # gone before its span is written (during the backend call, or between its end and now): abandoned
            abandoned = client_gone.done() and not client_gone.cancelled()
            client_gone.cancel()
            if abandoned and failure is None:
                failure, http = _ABANDONED, _client_closed(dialect)
        if attempt is not None:
            await self.recorder.wait_capacity()  # backpressure: agents slow down to the store's pace
            span = _call_span(attempt, seq, dialect, start, data, exchange, generation, response, failure, abandoned)
            _link_to_caller(span, request)
            self.recorder.submit(span)
            # Answer only once the span is stored: a call the agent saw is in the store before the agent can
            # act on it, so the runner's finish (after the agent returns) comes after every call of its attempt,
            # and a gateway killed after answering has lost nothing acknowledged. Concurrent calls share the write.
            if not await self.recorder.flush():  # given up: the gateway is being stopped with its run
                http = _error(503, _UNSTORED, type="server_error", code="gateway_stopping", dialect=dialect)
        elif session is not None and self.sessions is not None:
            session_id, source = session
            if session_id is None and response is not None:
                session_id = response["id"]  # a session of its own, named by its response id
            if session_id is not None:
                await self.recorder.wait_capacity()
                span = _call_span(
                    self.sessions.attempt_of(session_id),
                    seq,
                    dialect,
                    start,
                    data,
                    exchange,
                    generation,
                    response,
                    failure,
                    abandoned,
                )
                span.attributes.update(session_attributes(session_id, source))
                _link_to_caller(span, request)
                redact = self.sessions.redact
                redacted = span if redact is None else redact(span)
                if redacted is not None:
                    self.sessions.record(redacted, session_id, source, self.recorder)
                http.headers[SESSION_HEADER] = session_id
        return http


_UNSTORED = "The gateway is stopping with its run: this call was not stored and is never trained on."
_ABANDONED = "The client disconnected before its answer was sent; the call was cancelled and is never trained on."


def _client_closed(dialect: Dialect) -> Response:
    return _error(CLIENT_CLOSED_STATUS, _ABANDONED, code="client_closed_request", dialect=dialect)


class _ClientGone(Exception):
    """The client disconnected while its call was being answered."""


async def _client_gone(receive: Receive) -> None:
    """Return when the client disconnects. Called once the request body has been read: the server then answers
    ``receive`` only with ``http.disconnect`` (uvicorn, Starlette's and httpx's test transports wait for it)."""
    while True:
        try:
            message = await receive()
        except Exception:  # the connection broke under the server: as gone as a disconnect
            return
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # a server that answers with empty body messages must not spin this loop


async def _unless_gone(call: Awaitable[Any], client_gone: asyncio.Task[None]) -> Any:
    """The result of the backend ``call``, or `_ClientGone` once the client has disconnected, the call then
    cancelled (and awaited, so the backend has let go of it). Cancelling the caller cancels the call too."""
    work = asyncio.ensure_future(call)
    try:
        await asyncio.wait((work, client_gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
    if client_gone.done() and (work.cancelled() or not work.done()):
        raise _ClientGone
    return work.result()  # a call its backend cancelled re-raises CancelledError, as an awaited call would


def _caller_agent(request: Request) -> str | None:
    """The agent that makes the call: the route's ``/agents/{agent}`` segment, else the `AGENT_HEADER`; None when
    neither names one. A name `check_agent_name` refuses is a 400 that says why."""
    agent = request.path_params.get("agent")
    if agent is not None:
        try:
            return check_agent_name(agent)
        except ValueError as exc:
            raise InvalidRequest(
                f"The /agents/ segment of the URL: {exc}.", param="agent", code="invalid_agent"
            ) from None
    value = request.headers.get(AGENT_HEADER)
    if not value:
        return None
    try:
        return agent_from_header(value)
    except ValueError as exc:
        raise InvalidRequest(f"The {AGENT_HEADER} header: {exc}.", param="agent", code="invalid_agent") from None


def _link_to_caller(span: Span, request: Request) -> None:
    """Make ``span`` a child of the caller's span (a framework's LLM span, the runner's rollout span) when the
    request carries a valid ``traceparent``."""
    parent = parse_traceparent(request.headers.get("traceparent"))
    if parent is not None:
        span.trace_id, span.parent_id = parent


_HEX = frozenset("0123456789abcdef")


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """``(trace_id, parent_span_id)`` in lowercase hex from a W3C ``traceparent`` header, or None when it is missing
    or malformed (W3C: a receiver ignores a header it cannot parse; the call is recorded without a parent).

    Version 00 is exactly ``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``; later versions may append
    fields after a dash. Version ``ff`` and all-zero ids are invalid.

    Example::

        parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        # ('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7')
    """
    if not value:
        return None
    value = value.strip().lower()
    if len(value) < 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    version, trace_id, span_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if version == "ff" or (version == "00" and len(value) != 55) or (len(value) > 55 and value[55] != "-"):
        return None
    if not _HEX.issuperset(version + trace_id + span_id + flags):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def _too_large(limit: int) -> InvalidRequest:
    return InvalidRequest(
        f"The request body is larger than this gateway's limit of {limit} bytes.", status=413, code="request_too_large"
    )


def _call_span(
    attempt: tuple[str, str],
    seq: int,
    dialect: Dialect,
    start: float,
    data: dict[str, Any] | None,
    exchange: Exchange | None,
    generation: Any,
    response: dict[str, Any] | None,
    failure: str | None,
    abandoned: bool = False,
) -> Span:
    end = time.time()
    attributes: dict[str, Any] = {
        Attr.ENDPOINT: dialect.endpoint,
        Attr.LATENCY_MS: (end - start) * 1000.0,
        Attr.STREAM: bool(exchange is not None and exchange.stream),
        Attr.MODEL: data.get("model") if isinstance(data, dict) else None,
    }
    if exchange is not None and data is not None:
        attributes.update(exchange.recorded(data, response))
    else:  # refused before it was understood: the body as sent
        attributes[Attr.REQUEST] = data
    if generation is not None:
        choices = generation.choices
        attributes[Attr.PROMPT_IDS] = generation.prompt_ids
        attributes[Attr.CHOICES] = [
            {"token_ids": c.token_ids, "logprobs": c.logprobs, "finish_reason": c.finish_reason} for c in choices
        ]
        attributes[Attr.TOKEN_IDS_AVAILABLE] = generation.prompt_ids is not None and all(
            c.token_ids is not None for c in choices
        )
        attributes[Attr.POLICY_VERSION] = generation.policy_version
        attributes[Attr.RESPONSE_MODEL] = generation.model
        if generation.logprobs_processed:
            attributes[Attr.LOGPROBS_PROCESSED] = list(generation.logprobs_processed)
    else:
        attributes[Attr.TOKEN_IDS_AVAILABLE] = False
    if response is not None:
        attributes[Attr.RESPONSE_ID] = response["id"]
    if exchange is not None and exchange.request.agent is not None:
        attributes[Attr.CALLER_AGENT] = exchange.request.agent
    if abandoned:
        attributes[Attr.ABANDONED] = True
    status = SpanStatus(code=StatusCode.OK) if failure is None else SpanStatus(code=StatusCode.ERROR, message=failure)
    return Span(
        rollout_id=attempt[0],
        attempt_id=attempt[1],
        seq=seq,
        name=Attr.SPAN_LLM_CALL,
        start_time=start,
        end_time=end,
        attributes=attributes,
        status=status,
    )


class _AgentConvertor(Convertor[str]):
    """The ``{agent}`` of a route: any characters, slashes and line breaks included (the path is percent-decoded
    before routing, so ``a%2Fb`` arrives as ``a/b``), so that every name reaches `check_agent_name` and a bad one
    gets a 400 that says why rather than a 404."""

    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("lightrail_agent", _AgentConvertor())


class BearerAuth:
    """Pure ASGI middleware: require ``Authorization: Bearer <token>`` (or ``x-api-key: <token>``, how Anthropic's
    clients send their key) on every HTTP path but ``open_paths``.

    The gateway's own token opens every route. With ``verifier`` (the store's scoped tokens,
    `lightrail.store.tokens`), a scoped token opens what it may write into: an attempt's routes
    (``/rollouts/{rid}/attempts/{aid}/...``) for the runner token that leased it, an ingest token that names it, or
    an admin token; the unrouted routes for admin tokens only. A missing or wrong token gets a 401, a scoped token
    beyond its rights a 403 naming what is needed, in OpenAI's error format. The comparisons are constant-time.
    """

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        open_paths: frozenset[str] = frozenset({"/health"}),
        verifier: TokenVerifier | None = None,
        on_refused: Callable[[str, int, str], None] | None = None,
    ) -> None:
        self.app = app
        self.expected = b"Bearer " + token.encode()
        self.expected_key = token.encode()
        self.open_paths = open_paths
        self.verifier = verifier
        self.on_refused = on_refused
        """Told ``(path, status, message)`` of every 401/403 (the gateway marks the attempt: `Attr.SPAN_KEY_REFUSED`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = key = b""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    given = value
                elif name == b"x-api-key":
                    key = value
            # both compared, always: the time taken does not tell which header was right
            bearer_ok = hmac.compare_digest(given, self.expected)
            key_ok = hmac.compare_digest(key, self.expected_key)
            if not (bearer_ok or key_ok):
                refusal = await self._scoped_refusal(scope["path"], given.removeprefix(b"Bearer ") or key)
                if refusal is not None:
                    if self.on_refused is not None and refusal.status_code in (401, 403):
                        message = json.loads(bytes(refusal.body)).get("error", {}).get("message", "")
                        self.on_refused(scope["path"], refusal.status_code, message)
                    await refusal(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _scoped_refusal(self, path: str, bearer: bytes) -> Response | None:
        """None if ``bearer`` is a scoped token that may use ``path``; else the 401 or 403 to answer."""
        principal = None
        if self.verifier is not None and bearer:
            try:
                principal = await self.verifier.principal(bearer.decode("latin-1"))
            except Exception as exc:  # the store cannot tell now: refuse, the client retries
                log.warning("cannot check a scoped token against the store: %r", exc)
                return _error(503, "Cannot check the token now; retry.", code="service_unavailable")
        if principal is None:
            return _error(
                401, "Missing bearer token." if not bearer else "Invalid bearer token.", code="invalid_api_key"
            )
        parts = path.split("/")  # "", "rollouts", rid, "attempts", aid, ...
        if len(parts) > 5 and parts[1] == "rollouts" and parts[3] == "attempts":
            if owns_attempt(principal, parts[4]):
                return None
            return _error(
                403,
                f"This route records into attempt {parts[4]!r}; a {principal.role.value} token may not: it needs the "
                "gateway's token, an admin token, or the runner token that leased the attempt.",
                code="permission_denied",
            )
        if principal.role is Role.ADMIN:
            return None
        return _error(
            403,
            f"Unrouted calls need the gateway's token or an admin token, not a {principal.role.value} token.",
            code="permission_denied",
        )


def create_gateway_app(
    backend: Backend,
    store: Store,
    *,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    recorder: SpanBatcher | None = None,
    stream_chunk_chars: int = CHUNK_CHARS,
    sessions: SessionRecorder | None = None,
) -> Starlette:
    """Build the gateway ASGI app: OpenAI-compatible routes over ``backend``, spans into ``store``.

    ``token``: require ``Authorization: Bearer <token>`` (the agent's ``api_key``) on every route but
    ``/health``. ``recorder``: a `lightrail.tracing.SpanBatcher` to share or tune (default: one over ``store``); the app flushes
    it at shutdown and closes it if it created it. The backend and the store belong to the caller. ``sessions``: record
    served (unrouted) calls too, under sessions (`lightrail.gateway.recording`).

    Streams are replayed from complete generations (see `lightrail.gateway.sse`), so a streamed call records
    exactly the ids the same call would record without streaming.

    Example::

        app = create_gateway_app(ScriptedBackend(), MemoryStore(), token="secret")
        uvicorn.run(app, host="127.0.0.1", port=8900)
        # agent: OpenAI(base_url=LLM(endpoint=...).base_url(rollout_id, attempt_id), api_key="secret")
    """
    own_recorder = recorder is None
    recorder = recorder or SpanBatcher(store, linger_s=0.002, max_pending=20_000)
    gateway = _Gateway(
        backend,
        store,
        recorder,
        max_body_bytes=max_body_bytes,
        stream_chunk_chars=stream_chunk_chars,
        sessions=sessions,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        recorder.start()
        if sessions is not None:
            sessions.start()
        try:
            yield
        finally:
            if sessions is not None:
                await sessions.close()  # sessions being opened hand their spans to the recorder first
            if own_recorder:
                await recorder.close()
            else:
                await recorder.flush()

    prefix = "/rollouts/{rollout_id}/attempts/{attempt_id}"
    agent = "/agents/{agent:lightrail_agent}"
    routes = [
        Route("/health", gateway.health, methods=["GET"]),
        Route("/openapi.json", gateway.openapi, methods=["GET"]),
        Route("/v1/messages/count_tokens", gateway.count_tokens, methods=["POST"]),
        Route(prefix + "/v1/messages/count_tokens", gateway.routed_count_tokens, methods=["POST"]),
    ]
    for named in ("", agent):
        routes.append(Route(named + "/v1/models", gateway.models, methods=["GET"]))
        routes.append(Route(prefix + named + "/v1/models", gateway.routed_models, methods=["GET"]))
        for dialect in DIALECTS:
            served, routed = gateway.handlers(dialect)
            routes.append(Route(named + "/v1" + dialect.path, served, methods=["POST"]))
            routes.append(Route(prefix + named + "/v1" + dialect.path, routed, methods=["POST"]))
    verifier = TokenVerifier(lambda: store) if hasattr(store, "get_token") else None
    middleware = (
        [Middleware(BearerAuth, token=token, verifier=verifier, on_refused=gateway.key_refused)] if token else []
    )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception},
    )
    app.state.gateway = gateway
    app.state.recorder = recorder
    return app


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Routing errors (unknown path, wrong method) in OpenAI's error format."""
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", code="not_found")
