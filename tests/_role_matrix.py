"""The role matrix of a store server: every route called by every role with a well-formed request on data that role
would own. The roles of `ROUTE_ROLES` must get through (2xx, or a 4xx about the data, never 401/403); every other
role must get a 403 naming the role needed and change nothing. Used by ``tests/store/test_tokens.py`` and
``bench/soak.py`` (on the soaked server). It writes a few rollouts (``matrix-*``), tokens and resources into the
store, and leaves one rollout cancelled and one running."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import msgspec

from lightrail.store import SyncStoreClient
from lightrail.store.sessions import Feedback
from lightrail.store.tokens import ROUTE_ROLES, Role, mint
from lightrail.types import LLM, Resources, RolloutSpec, Span, Task

__all__ = ["MatrixResult", "role_matrix"]

_enc = msgspec.json.encode


@dataclass
class MatrixResult:
    checked: int = 0
    """Requests sent: every route × every role."""
    unauthorized_accepted: int = 0
    """Requests beyond their token's role that succeeded (target 0)."""
    problems: list[str] = field(default_factory=list)
    """One line per wrong answer: a role refused a route it may call, or a refusal that is not a 403 naming the role."""
    cancel_applied_by: list[str] = field(default_factory=list)
    """The roles whose cancel of the victim rollout took effect (only ``admin`` may cancel)."""


def role_matrix(url: str, admin_token: str) -> MatrixResult:
    result = MatrixResult()
    with SyncStoreClient(url, token=admin_token) as admin:
        ids = [f"matrix-r{i}" for i in range(4 + len(Role))]  # 2 leased here, 2 by the lease route, 1 per cancel
        admin.enqueue([RolloutSpec(rollout_id=rid, task=Task(input={"i": i})) for i, rid in enumerate(ids)])
        admin.put_resources(Resources(items={"llm": LLM(endpoint="http://gw:1/v1", model="m", api_key="gw-key")}))

        def minted(role: str, attempts: tuple[str, ...] = ()) -> str:
            bearer, record = mint(role, attempts=attempts)
            admin.put_token(record)
            return bearer

        # an attempt the admin, read and ingest tokens act on (the ingest token is named for it)
        shared = admin.lease("matrix-admin-worker").attempt.attempt_id
        bearers = {
            Role.ADMIN: admin_token,
            Role.RUNNER: minted("runner"),
            Role.INGEST: minted("ingest", attempts=(shared,)),
            Role.READ: minted("read"),
        }
    own_attempt = {Role.ADMIN: shared, Role.INGEST: shared, Role.READ: shared}
    with SyncStoreClient(url, token=bearers[Role.RUNNER]) as runner:
        leased = runner.lease("matrix-runner-worker")
        own_attempt[Role.RUNNER] = leased.attempt.attempt_id
        rollout_of = {Role.RUNNER: leased.rollout.rollout_id}
    first = ids[0]
    session = RolloutSpec(rollout_id="matrix-session", task=Task(input={}), mode="served")
    victims = iter(ids[4:])  # a queued rollout per role's cancel

    def request(name: str, role: Role, n: int) -> tuple[str, str, bytes | None, str | None]:
        attempt = own_attempt[role]
        span = Span(rollout_id=rollout_of.get(role, first), attempt_id=attempt, seq=n, name="x")
        victim = next(victims) if name == "cancel" else None
        bodies = {
            "enqueue": (
                "POST",
                "/v1/rollouts",
                {"specs": [RolloutSpec(rollout_id=f"matrix-m{n}", task=Task(input={}))]},
            ),
            "query_rollouts": ("POST", "/v1/rollouts/query", {"rollout_ids": [first]}),
            "page_rollouts": ("POST", "/v1/rollouts/page", {"limit": 5}),
            "cancel": ("POST", "/v1/rollouts/cancel", {"rollout_ids": [victim]}),
            "wait": ("POST", "/v1/rollouts/wait", {"rollout_ids": [], "timeout_s": 0}),
            "get_rollout": ("GET", f"/v1/rollouts/{first}", None),
            "query_attempts": ("GET", f"/v1/rollouts/{first}/attempts", None),
            "query_spans": ("GET", f"/v1/rollouts/{first}/spans", None),
            "lease": ("POST", "/v1/lease", {"worker_id": f"matrix-w{n}", "wait_s": 0}),
            "heartbeat": ("POST", f"/v1/attempts/{attempt}/heartbeat", None),
            "finish": ("POST", f"/v1/attempts/{attempt}/finish", {"status": "succeeded", "reward": 1.0}),
            "open_session": ("POST", "/v1/sessions", {"spec": session, "attempt_id": f"matrix-sa{n}"}),
            "delete_sessions": ("POST", "/v1/sessions/delete", {"created_before": 0}),
            "feedback": ("POST", "/v1/feedback", Feedback(reward=1.0, session_id="no-such-session")),
            "add_spans": ("POST", "/v1/spans", {"spans": [span]}),
            "otlp_traces": ("POST", "/v1/traces", {"resourceSpans": []}),
            "put_resources": ("POST", "/v1/resources", Resources(items={}, resources_id=f"matrix-res{n}")),
            "get_latest_resources": ("GET", "/v1/resources/latest", None),
            "get_resources": ("GET", "/v1/resources/1", None),
            "counts": ("GET", "/v1/counts", None),
            "openapi": ("GET", "/openapi.json", None),
            "whoami": ("GET", "/v1/whoami", None),
            "put_token": ("POST", "/v1/tokens", mint("read")[1]),
            "list_tokens": ("GET", "/v1/tokens", None),
            "get_token": ("GET", "/v1/tokens/000000000000", None),
        }
        method, path, body = bodies[name]
        return method, path, None if body is None else _enc(body), victim

    victims_by_role: dict[str, str] = {}
    with httpx.Client(base_url=url, timeout=30) as http:
        n = 0
        for name in sorted(ROUTE_ROLES):
            for role, bearer in bearers.items():
                n += 1
                method, path, body, victim = request(name, role, n)
                if victim is not None:
                    victims_by_role[role.value] = victim
                headers = {"authorization": f"Bearer {bearer}", "content-type": "application/json"}
                reply = http.request(method, path, content=body, headers=headers)
                result.checked += 1
                if role in ROUTE_ROLES[name]:
                    if reply.status_code in (401, 403):
                        result.problems.append(f"{name} as {role.value}: refused ({reply.status_code} {reply.text})")
                    continue
                result.unauthorized_accepted += reply.is_success
                message = reply.json().get("error", {}).get("message", "") if reply.status_code == 403 else ""
                if not (f"{name} needs a token with role" in message and "admin" in message):
                    result.problems.append(f"{name} as {role.value}: {reply.status_code} {reply.text[:200]}")
    with SyncStoreClient(url, token=admin_token) as admin:
        for role, victim in victims_by_role.items():
            if admin.get_rollout(victim).status == "cancelled":
                result.cancel_applied_by.append(role)
    return result
