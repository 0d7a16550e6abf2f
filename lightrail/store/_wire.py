"""The store's HTTP wire format, shared by `server.py` and `client.py` so both sides agree by construction.

Request bodies are decoded with typed msgspec decoders (a bad field is named in the 400); responses are small
structs (counts and ids for writes: spans are never echoed back). `ROUTES` is the route table both the server's
router and its OpenAPI document are built from. This module imports neither Starlette nor httpx, so a runner
that only needs the client never loads the server stack and vice versa.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from lightrail.store.base import MAX_PAGE
from lightrail.store.sessions import Feedback, FeedbackResult
from lightrail.store.tokens import Role, TokenRecord
from lightrail.types import (
    Attempt,
    AttemptStatus,
    ErrorInfo,
    Lease,
    Resources,
    Rollout,
    RolloutPage,
    RolloutSpec,
    RolloutStatus,
    Span,
)

MAX_WAIT_S = 60.0
"""Server-side cap of one long poll (`lease` ``wait_s``, `wait` ``timeout_s``); clients re-poll for longer waits,
so no request outlives proxies' idle timeouts. A client's read timeout must exceed it (the store clients wait
the poll's length plus a margin)."""


class EnqueueRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/rollouts``."""

    specs: list[RolloutSpec]


class LeaseRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/lease``. ``attempt_id`` makes a retried lease return the same attempt."""

    worker_id: str
    wait_s: float = 0.0
    attempt_id: str | None = None


class FinishRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/attempts/{attempt_id}/finish``."""

    status: AttemptStatus
    reward: float | None = None
    error: ErrorInfo | None = None


class RolloutIdsRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/rollouts/cancel``."""

    rollout_ids: list[str]


class WaitRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/rollouts/wait``; ``timeout_s`` (seconds; none means the cap) is capped at `MAX_WAIT_S`
    by the server. Every id must be stored: unknown ones are a 404 naming them, before any waiting."""

    rollout_ids: list[str]
    timeout_s: float | None = None


class QueryRolloutsRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/rollouts/query``; a None filter matches everything."""

    status: list[RolloutStatus] | None = None
    rollout_ids: list[str] | None = None


class PageRolloutsRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/rollouts/page`` (`Store.query_rollouts_page`); a None filter matches everything."""

    status: list[RolloutStatus] | None = None
    mode: str | None = None
    metadata: dict[str, str] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE)] = 50
    offset: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0
    before: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] | None = None


class AddSpansRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/spans``: a batch of spans, stored all or nothing."""

    spans: list[Span]


class OpenSessionRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/sessions``: a served session (``spec.mode`` must be ``served``)."""

    spec: RolloutSpec
    attempt_id: str
    worker_id: str = "gateway"


class DeleteSessionsRequest(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/sessions/delete``: retention."""

    created_before: float


class DeletedResponse(msgspec.Struct, kw_only=True):
    deleted: int


class RolloutsResponse(msgspec.Struct, kw_only=True):
    rollouts: list[Rollout]


class WaitResponse(msgspec.Struct, kw_only=True):
    """Answer of ``POST /v1/rollouts/wait``: the state of every listed rollout (`lightrail.store.base.WaitResult`).

    ``rollouts`` holds the terminal ones in the order listed (all that clients before ``pending`` read);
    ``pending`` the current state of the others (``queued``/``running``); ``timed_out`` is true when the wait
    ended at its ``timeout_s`` (or the `MAX_WAIT_S` cap) with rollouts still pending."""

    rollouts: list[Rollout]
    pending: list[Rollout] = []
    timed_out: bool = False


class LeaseResponse(msgspec.Struct, kw_only=True):
    lease: Lease | None


class AddedResponse(msgspec.Struct, kw_only=True):
    added: int


class SpansResponse(msgspec.Struct, kw_only=True):
    spans: list[Span]


class AttemptsResponse(msgspec.Struct, kw_only=True):
    attempts: list[Attempt]


class ResourcesResponse(msgspec.Struct, kw_only=True):
    resources: Resources | None


class CountsResponse(msgspec.Struct, kw_only=True):
    counts: dict[RolloutStatus, int]


class HealthResponse(msgspec.Struct, kw_only=True):
    status: str = "ok"


class ErrorDetail(msgspec.Struct, kw_only=True, omit_defaults=True):
    message: str
    type: str = "StoreError"
    """The lightrail exception class (``NotFoundError``, ``StaleAttemptError``, ...); clients re-raise it."""
    field: str | None = None
    """JSON path of the offending field of the request body (``$.spans[0].seq``) for validation errors; for an id
    refused in the path or query, ``$.`` and the parameter's name (``$.attempt_id``)."""


class ErrorResponse(msgspec.Struct, kw_only=True):
    """Every non-2xx answer: ``{"error": {"message": ..., "type": ..., "field": ...}}``."""

    error: ErrorDetail


class TokensResponse(msgspec.Struct, kw_only=True):
    """Answer of ``GET /v1/tokens``: every scoped token's record (hashes, never secrets)."""

    tokens: list[TokenRecord]


class TokenResponse(msgspec.Struct, kw_only=True):
    """Answer of ``GET /v1/tokens/{token_id}``; null when there is no such token."""

    token: TokenRecord | None


class WhoamiResponse(msgspec.Struct, kw_only=True):
    """Answer of ``GET /v1/whoami``: the role of the request's token (``token_id`` null for the admin token)."""

    role: Role
    token_id: str | None = None


class RouteSpec(msgspec.Struct, frozen=True):
    """One row of the route table: what the server routes and what the OpenAPI document describes."""

    method: str
    path: str
    name: str
    summary: str
    request: type | None
    response: type
    query: tuple[tuple[str, str], ...] = ()  # (name, description)


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec(
        "POST",
        "/v1/rollouts",
        "enqueue",
        "Queue rollouts (idempotent by rollout_id).",
        EnqueueRequest,
        RolloutsResponse,
    ),
    RouteSpec(
        "POST",
        "/v1/rollouts/query",
        "query_rollouts",
        "Rollouts filtered by status and/or ids.",
        QueryRolloutsRequest,
        RolloutsResponse,
    ),
    RouteSpec(
        "POST",
        "/v1/rollouts/page",
        "page_rollouts",
        "A page of rollouts, newest first, filtered by status, mode and metadata, with the total that match.",
        PageRolloutsRequest,
        RolloutPage,
    ),
    RouteSpec(
        "POST",
        "/v1/rollouts/cancel",
        "cancel",
        "Cancel queued or running rollouts.",
        RolloutIdsRequest,
        RolloutsResponse,
    ),
    RouteSpec(
        "POST",
        "/v1/rollouts/wait",
        "wait",
        "Long-poll until the rollouts are terminal (capped at 60 s); answers every listed rollout's state "
        "(terminal ones in rollouts, the others in pending) and timed_out; unknown ids are a 404 naming them.",
        WaitRequest,
        WaitResponse,
    ),
    RouteSpec("GET", "/v1/rollouts/{rollout_id}", "get_rollout", "One rollout.", None, Rollout),
    RouteSpec(
        "GET",
        "/v1/rollouts/{rollout_id}/attempts",
        "query_attempts",
        "Attempts of a rollout, in order.",
        None,
        AttemptsResponse,
    ),
    RouteSpec(
        "GET",
        "/v1/rollouts/{rollout_id}/spans",
        "query_spans",
        "Spans of a rollout ordered by attempt then seq.",
        None,
        SpansResponse,
        (("attempt_id", "Only the spans of this attempt."),),
    ),
    RouteSpec(
        "POST",
        "/v1/lease",
        "lease",
        "Start an attempt on the oldest queued rollout; long-polls up to wait_s (capped at 60 s).",
        LeaseRequest,
        LeaseResponse,
    ),
    RouteSpec("POST", "/v1/attempts/{attempt_id}/heartbeat", "heartbeat", "Renew an attempt's lease.", None, Attempt),
    RouteSpec(
        "POST",
        "/v1/attempts/{attempt_id}/finish",
        "finish",
        "End an attempt (idempotent for the same outcome).",
        FinishRequest,
        Attempt,
    ),
    RouteSpec(
        "POST",
        "/v1/sessions",
        "open_session",
        "Record a served session: a running rollout and its attempt, never leased (idempotent by rollout_id).",
        OpenSessionRequest,
        Lease,
    ),
    RouteSpec(
        "POST",
        "/v1/sessions/delete",
        "delete_sessions",
        "Delete served sessions created before a time, with their attempts and spans (retention).",
        DeleteSessionsRequest,
        DeletedResponse,
    ),
    RouteSpec(
        "POST",
        "/v1/feedback",
        "feedback",
        "Reward a served session after the fact (idempotent by feedback_id; 404 for an unknown session).",
        Feedback,
        FeedbackResult,
    ),
    RouteSpec(
        "POST",
        "/v1/spans",
        "add_spans",
        "Store a batch of spans (idempotent by attempt and span id).",
        AddSpansRequest,
        AddedResponse,
    ),
    RouteSpec(
        "POST",
        "/v1/resources",
        "put_resources",
        "Store a resources version (idempotent by resources_id).",
        Resources,
        Resources,
    ),
    RouteSpec(
        "GET", "/v1/resources/latest", "get_latest_resources", "The newest resources, or null.", None, ResourcesResponse
    ),
    RouteSpec("GET", "/v1/resources/{version}", "get_resources", "One resources version.", None, Resources),
    RouteSpec("GET", "/v1/counts", "counts", "Rollouts per status.", None, CountsResponse),
    RouteSpec(
        "POST",
        "/v1/tokens",
        "put_token",
        "Store a scoped token's record (minted by the client: only the secret's hash is sent); replaces one with "
        "its token_id (revocation).",
        TokenRecord,
        TokenRecord,
    ),
    RouteSpec("GET", "/v1/tokens", "list_tokens", "Every scoped token's record.", None, TokensResponse),
    RouteSpec("GET", "/v1/tokens/{token_id}", "get_token", "One scoped token's record, or null.", None, TokenResponse),
    RouteSpec("GET", "/v1/whoami", "whoami", "The role of the request's token.", None, WhoamiResponse),
    RouteSpec("GET", "/health", "health", "Liveness; needs no token.", None, HealthResponse),
    RouteSpec("GET", "/openapi.json", "openapi", "This document.", None, dict),
)
