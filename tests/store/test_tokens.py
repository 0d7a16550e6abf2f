"""Scoped tokens on a real store server (SQLite behind it, 127.0.0.1): the role matrix over every route, attempt
ownership, expiry and revocation, the schema migration, the ``lightrail token`` command, and the gateway's
per-attempt routes with runner tokens."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import httpx
import msgspec
import pytest

from lightrail.store import ForbiddenError, InvalidIdError, SyncStoreClient
from lightrail.store._wire import ROUTES
from lightrail.store.server import serve_in_thread
from lightrail.store.tokens import ROUTE_ROLES, Role, TokenRecord, mint, parse_duration
from lightrail.types import LLM, Resources, RolloutSpec, Span, Task
from tests._role_matrix import role_matrix

ADMIN = "admin-secret"
_enc = msgspec.json.encode


@pytest.fixture
def server(tmp_path):
    handle = serve_in_thread(tmp_path / "store.db", token=ADMIN)
    yield handle
    handle.stop()


@pytest.fixture
def admin(server):
    with SyncStoreClient(server.url, token=ADMIN) as client:
        yield client


def _minted(admin: SyncStoreClient, role: str, **kw) -> str:
    bearer, record = mint(role, **kw)
    admin.put_token(record)
    return bearer


def test_every_route_is_in_the_role_table():
    """A route added without deciding who may call it would be open to every role: the table covers them all."""
    assert {r.name for r in ROUTES} - {"health"} | {"otlp_traces"} == set(ROUTE_ROLES)


def test_role_matrix_every_route_every_role(server):
    """Each role calls every route with a well-formed request on data it would own: the roles of `ROUTE_ROLES`
    get through (2xx or a 4xx about the data, never 401/403), every other role gets a 403 naming the role needed
    and changes nothing. ``unauthorized_accepted`` (beyond-role requests that succeeded) is 0."""
    result = role_matrix(server.url, ADMIN)
    assert result.problems == []
    assert result.checked == 4 * len(ROUTE_ROLES) and result.unauthorized_accepted == 0
    assert result.cancel_applied_by == ["admin"]  # only the admin's cancel went through


def test_a_runner_token_works_only_on_the_attempts_it_leased(server, admin):
    """Two runner tokens: each leases with its own prefix (a retried lease gets the same attempt), and neither can
    heartbeat, finish or add spans to the other's attempt; the admin can. Scoped tokens do not see gateway keys."""
    admin.enqueue([RolloutSpec(rollout_id=f"r{i}", task=Task(input={})) for i in range(3)])
    admin.put_resources(
        Resources(
            items={
                "policy": LLM(endpoint="http://gw:1/v1", model="m", api_key="gateway-key"),
                "judge": LLM(endpoint="https://judge/v1", model="j", api_key="judge-key", routed=False),
            }
        )
    )
    with (
        SyncStoreClient(server.url, token=_minted(admin, "runner")) as one,
        SyncStoreClient(server.url, token=_minted(admin, "runner")) as two,
    ):
        with pytest.raises(InvalidIdError, match="^attempt_id: must be"):  # not the bare prefix "<token id>."
            one.lease("w1", attempt_id="")
        first = one.lease("w1", attempt_id="at-fixed")
        again = one.lease("w1", attempt_id="at-fixed")
        assert first.attempt.attempt_id == again.attempt.attempt_id == f"{one.whoami().token_id}.at-fixed"
        theirs = first.attempt.attempt_id
        for trespass in (
            lambda: two.heartbeat(theirs),
            lambda: two.finish(theirs, "succeeded", reward=1.0),
            lambda: two.add_spans([Span(rollout_id=first.rollout.rollout_id, attempt_id=theirs, seq=1, name="x")]),
        ):
            with pytest.raises(ForbiddenError, match="not this runner token's"):
                trespass()
        assert admin.query_spans(first.rollout.rollout_id) == []
        one.add_spans([Span(rollout_id=first.rollout.rollout_id, attempt_id=theirs, seq=1, name="mine")])
        assert one.finish(theirs, "succeeded", reward=1.0).reward == 1.0
        items = one.get_resources().items
        assert items["policy"].api_key is None and items["judge"].api_key == "judge-key"
    assert admin.get_resources().items["policy"].api_key == "gateway-key"


def test_expired_revoked_and_forged_tokens_are_refused(server, admin):
    """401 for a token past its expiry, one revoked (through the CLI's path: a record replaced), a wrong secret, or
    an id the store never saw; the admin token keeps working as admin."""
    expired_bearer, expired = mint("read", expires_s=60, now=time.time() - 120)
    admin.put_token(expired)
    live = _minted(admin, "read")
    token_id = live.split("_")[1]
    forged = live[:-4] + ("AAAA" if not live.endswith("AAAA") else "BBBB")
    with httpx.Client(base_url=server.url) as http:

        def status(bearer: str) -> int:
            return http.get("/v1/counts", headers={"authorization": f"Bearer {bearer}"}).status_code

        assert status(live) == 200 and status(ADMIN) == 200
        assert status(expired_bearer) == 401 and status(forged) == 401
        assert status("lrt_0123456789ab_" + "x" * 32) == 401
        record = admin.get_token(token_id)
        admin.put_token(msgspec.structs.replace(record, revoked_at=time.time()))
        assert status(live) == 401  # at once on the server that stored the revocation
        assert http.get("/v1/whoami", headers={"authorization": f"Bearer {ADMIN}"}).json() == {
            "role": "admin",
            "token_id": None,
        }
    assert [r.token_id for r in admin.list_tokens()] == [expired.token_id, token_id]
    assert all(isinstance(r, TokenRecord) and len(r.secret_sha256) == 64 for r in admin.list_tokens())


def test_a_version_1_store_file_gains_the_tokens_table(tmp_path):
    """A store created before scoped tokens (schema 1) opens, migrates to 2 and keeps its data."""
    path = tmp_path / "old.db"
    handle = serve_in_thread(path, token=ADMIN)
    with SyncStoreClient(handle.url, token=ADMIN) as client:
        client.enqueue([RolloutSpec(rollout_id="kept", task=Task(input={}))])
    handle.stop()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE tokens")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    handle = serve_in_thread(path, token=ADMIN)
    with SyncStoreClient(handle.url, token=ADMIN) as client:
        assert client.get_rollout("kept").rollout_id == "kept"
        bearer = _minted(client, "read")
    with SyncStoreClient(handle.url, token=bearer) as reader:
        assert reader.whoami().role is Role.READ
    handle.stop()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (2,)


def test_token_command_creates_lists_and_revokes_through_the_server(server):
    """``lightrail token create`` prints the token once (stdout, nothing else there), ``list`` shows it without the
    secret, ``revoke`` ends it; bad input is exit 2 with a reason."""
    base = [sys.executable, "-m", "lightrail", "token"]
    where = ["--store", server.url, "--store-token", ADMIN]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)

    made = run("create", *where, "--role", "runner", "--expires", "7d", "--note", "box 1")
    assert made.returncode == 0, made.stderr
    bearer = made.stdout.strip()
    token_id = bearer.split("_")[1]
    with SyncStoreClient(server.url, token=bearer) as runner:
        assert runner.whoami().role is Role.RUNNER
    listed = run("list", *where)
    assert token_id in listed.stdout and "runner" in listed.stdout and "box 1" in listed.stdout
    assert bearer.split("_", 2)[2] not in listed.stdout
    assert run("revoke", *where, token_id).returncode == 0
    assert "revoked" in run("list", *where).stdout
    with SyncStoreClient(server.url, token=bearer, retries=0) as runner, pytest.raises(Exception, match="401"):
        runner.whoami()
    bad = run("create", *where, "--role", "runner", "--expires", "soon")
    assert bad.returncode == 2 and "duration" in bad.stderr
    assert run("revoke", *where, "000000000000").returncode == 1


def test_durations():
    assert parse_duration("7d") == 7 * 86400 and parse_duration("90m") == 5400 and parse_duration("30") == 30
    with pytest.raises(ValueError):
        parse_duration("-1h")


def test_an_ingest_token_writes_otlp_spans_only_into_its_named_attempts(server, admin):
    """An OpenTelemetry exporter holding an ingest token: its attempt's spans are stored, another attempt's
    request is a 403 and stores nothing."""
    admin.enqueue([RolloutSpec(rollout_id=f"r{i}", task=Task(input={})) for i in range(2)])
    named, other = (admin.lease("w") for _ in range(2))
    bearer = _minted(admin, "ingest", attempts=[named.attempt.attempt_id])
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "tool",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}  # fmt: skip
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {bearer}"}) as http:
        for lease, expected in ((other, 403), (named, 200)):
            ids = {
                "x-lightrail-rollout-id": lease.rollout.rollout_id,
                "x-lightrail-attempt-id": lease.attempt.attempt_id,
            }
            assert http.post("/v1/traces", json=body, headers=ids).status_code == expected
    assert [s.name for s in admin.query_spans(named.rollout.rollout_id)] == ["tool"]
    assert admin.query_spans(other.rollout.rollout_id) == []
