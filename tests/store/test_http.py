"""HTTP-specific behaviour of the store server and client (the Store contract itself is in test_contract.py).

Every test runs a real server on 127.0.0.1 (its own thread and event loop, SQLite behind it) and talks to it
with raw httpx or the real clients.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import msgspec
import pytest

from lightrail.store import NotFoundError, StaleAttemptError, StoreClient, StoreUnavailableError, SyncStoreClient
from lightrail.store._wire import ROUTES, RolloutsResponse
from lightrail.store.server import serve_in_thread
from lightrail.types import (
    LLM,
    AttemptStatus,
    IllegalTransitionError,
    Resources,
    RolloutSpec,
    RolloutStatus,
    Span,
    Task,
    next_seq,
)

TOKEN = "test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def server(tmp_path):
    handle = serve_in_thread(tmp_path / "store.db", token=TOKEN, max_body_bytes=1 << 20)
    yield handle
    handle.stop()


@pytest.fixture
async def http(server):
    async with httpx.AsyncClient(base_url=server.url) as client:
        yield client


@pytest.fixture
async def store(server):
    client = StoreClient(server.url, token=TOKEN)
    yield client
    await client.close()


def specs(n: int) -> list[RolloutSpec]:
    return [RolloutSpec(task=Task(input={"q": i})) for i in range(n)]


def spans_for(lease, n: int) -> list[Span]:
    rid, aid = lease.rollout.rollout_id, lease.attempt.attempt_id
    return [Span(rollout_id=rid, attempt_id=aid, seq=next_seq(), name=f"s{i}") for i in range(n)]


async def test_token_required_except_for_health(http):
    assert (await http.get("/health")).status_code == 200
    missing = await http.get("/v1/counts")
    assert missing.status_code == 401
    assert missing.json()["error"]["message"] == "missing bearer token"
    wrong = await http.get("/v1/counts", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert (await http.get("/v1/counts", headers=AUTH)).status_code == 200


async def test_pages_given_as_ui_sign_in_their_own_way_with_the_servers_tokens(tmp_path):
    """`create_app`'s ``ui`` (how ``lightrail store serve`` mounts the dashboard): its routes are served under their
    own prefix without the API's bearer check, and get the server's check of a token (admin, then scoped) for it."""
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from lightrail.store import MemoryStore
    from lightrail.store.server import create_app
    from lightrail.store.tokens import mint

    def pages(get_store, verify):
        async def whoami(request: Request) -> PlainTextResponse:
            principal = await verify(request.query_params.get("token", ""))
            return PlainTextResponse(principal.role.value if principal else "nobody")

        return [Route("/pages", whoami), Route("/pages/who", whoami)]

    async def whoami_page(request: Request) -> PlainTextResponse:
        return PlainTextResponse("a page")

    handle = serve_in_thread(tmp_path / "store.db", token=TOKEN, ui=pages)
    try:
        with SyncStoreClient(handle.url, token=TOKEN) as admin:
            read_token, record = mint("read")
            admin.put_token(record)
        async with httpx.AsyncClient(base_url=handle.url) as http:
            assert (await http.get("/pages/who", params={"token": TOKEN})).text == "admin"
            assert (await http.get("/pages", params={"token": read_token})).text == "read"
            assert (await http.get("/pages/who", params={"token": "nope"})).text == "nobody"
            assert (await http.get("/pages/elsewhere")).status_code == 404  # under the prefix: the page's own 404
            assert (await http.get("/pagesx")).status_code == 401  # not under it: the API's bearer check
            assert (await http.get("/v1/counts")).status_code == 401
    finally:
        handle.stop()
    with pytest.raises(ValueError, match=r"may not share the API's paths: \['/v1'\]"):
        create_app(MemoryStore(), token=TOKEN, ui=lambda get_store, verify: [Route("/v1/page", whoami_page)])
    plain = serve_in_thread(tmp_path / "store.db", token=TOKEN)  # no pages: nothing skips the bearer check
    try:
        async with httpx.AsyncClient(base_url=plain.url) as http:
            assert (await http.get("/ui/")).status_code == 401
            assert (await http.get("/pages/who")).status_code == 401
    finally:
        plain.stop()


async def test_client_with_wrong_token_raises_instead_of_returning_nothing(server):
    client = StoreClient(server.url, token="wrong")
    try:
        with pytest.raises(Exception, match="401"):
            await client.lease("w")
    finally:
        await client.close()


async def test_bad_json_is_400(http):
    r = await http.post("/v1/rollouts", content=b"{not json", headers=AUTH)
    assert r.status_code == 400
    assert "malformed" in r.json()["error"]["message"].lower()


async def test_wrong_field_type_is_400_naming_the_field(http, store):
    (rollout,) = await store.enqueue(specs(1))
    lease = await store.lease("w")
    span = msgspec.to_builtins(spans_for(lease, 1)[0])
    span["seq"] = "not-a-number"
    r = await http.post("/v1/spans", json={"spans": [span]}, headers=AUTH)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["field"] == "$.spans[0].seq"
    assert "Expected `int`, got `str`" in error["message"]
    # a missing required field is named too
    r = await http.post("/v1/lease", json={"wait_s": 0}, headers=AUTH)
    assert r.status_code == 400 and "worker_id" in r.json()["error"]["message"]


async def test_a_page_request_out_of_bounds_is_400_naming_the_field(http):
    for body, field in (({"limit": 0}, "$.limit"), ({"limit": 5000}, "$.limit"), ({"before": 0}, "$.before"),
                        ({"metadata": {"run;drop": "x"}}, "$.metadata")):  # fmt: skip
        r = await http.post("/v1/rollouts/page", json=body, headers=AUTH)
        assert r.status_code == 400, body
        assert r.json()["error"]["field"] == field
    r = await http.post("/v1/rollouts/page", json={"limit": 3}, headers=AUTH)
    assert r.status_code == 200 and r.json() == {"rollouts": [], "total": 0, "next_before": None}


async def test_unknown_rollout_and_attempt_are_404(http, store):
    assert (await http.get("/v1/rollouts/ro-nope", headers=AUTH)).status_code == 404
    r = await http.post("/v1/attempts/at-nope/heartbeat", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    with pytest.raises(NotFoundError):
        await store.get_rollout("ro-nope")
    with pytest.raises(NotFoundError):
        await store.finish("at-nope", AttemptStatus.SUCCEEDED)


async def test_an_empty_id_is_refused_with_a_400_naming_the_field_on_every_route(http, store):
    """Found by the fuzzer: ``POST /v1/rollouts`` took ``rollout_id: ""``, and a wait on it long-polled to the cap."""
    rule = "must be a non-blank string of at most 256 printable characters (no control characters)"
    for spec, field in (({"task": {"input": 1}, "rollout_id": ""}, "specs[0].rollout_id"),
                        ({"task": {"input": 1, "task_id": ""}}, "specs[0].task.task_id")):  # fmt: skip
        r = await http.post("/v1/rollouts", json={"specs": [spec]}, headers=AUTH)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == {
            "message": f"{field}: {rule}, got ''",
            "type": "InvalidIdError",
            "field": f"$.{field}",
        }
    assert (await http.get("/v1/counts", headers=AUTH)).json()["counts"]["queued"] == 0
    (rollout,) = await store.enqueue(specs(1))
    lease = await store.lease("w")
    rid, aid = rollout.rollout_id, lease.attempt.attempt_id
    span = msgspec.to_builtins(spans_for(lease, 1)[0])
    cases = [
        ("POST", "/v1/lease", {"worker_id": ""}, "worker_id"),
        ("POST", "/v1/lease", {"worker_id": "w", "attempt_id": " "}, "attempt_id"),
        ("POST", "/v1/rollouts/wait", {"rollout_ids": [rid, ""], "timeout_s": 0}, "rollout_ids[1]"),
        ("POST", "/v1/rollouts/cancel", {"rollout_ids": [""]}, "rollout_ids[0]"),
        ("POST", "/v1/rollouts/query", {"rollout_ids": ["a\u0000b"]}, "rollout_ids[0]"),
        ("GET", "/v1/rollouts/%20", None, "rollout_id"),
        ("GET", "/v1/rollouts/%20/attempts", None, "rollout_id"),
        ("GET", f"/v1/rollouts/{rid}/spans?attempt_id=", None, "attempt_id"),
        ("POST", "/v1/attempts/%0A/heartbeat", None, "attempt_id"),
        ("POST", "/v1/attempts/%20/finish", {"status": "succeeded"}, "attempt_id"),
        ("POST", "/v1/spans", {"spans": [{**span, "span_id": ""}]}, "spans[0].span_id"),
        ("POST", "/v1/spans", {"spans": [{**span, "attempt_id": ""}]}, "spans[0].attempt_id"),
        ("POST", "/v1/resources", {"items": {}, "resources_id": ""}, "resources_id"),
        ("POST", "/v1/sessions", {"spec": {"task": {"input": 1}, "mode": "served"}, "attempt_id": ""}, "attempt_id"),
        ("POST", "/v1/sessions", {"spec": {"task": {"input": 1}, "mode": "served", "rollout_id": ""},
                                  "attempt_id": "a1"}, "spec.rollout_id"),
    ]  # fmt: skip
    for method, path, body, field in cases:
        r = await http.request(method, path, json=body, headers=AUTH)
        assert r.status_code == 400, (path, body, r.text)
        error = r.json()["error"]
        assert error["type"] == "InvalidIdError" and error["field"] == f"$.{field}", (path, error)
        assert error["message"].startswith(f"{field}: {rule}, got "), (path, error)
    assert (await store.heartbeat(aid)).status is AttemptStatus.RUNNING and await store.query_spans(rid) == []


async def test_a_wait_at_the_servers_cap_answers_the_states_and_says_it_timed_out(tmp_path, monkeypatch):
    """A wait without ``timeout_s`` runs to the server's cap (`MAX_WAIT_S`, made short here), then answers every
    listed rollout's state with ``timed_out``; a client that reads only ``rollouts`` (before ``pending``) reads the
    same terminal ones. `StoreClient.wait` re-polls past the cap and surfaces the same answer."""
    monkeypatch.setattr("lightrail.store.server.MAX_WAIT_S", 0.3)
    server = serve_in_thread(tmp_path / "store.db", token=TOKEN)
    try:
        async with httpx.AsyncClient(base_url=server.url) as http, StoreClient(server.url, token=TOKEN) as store:
            done, queued = await store.enqueue(specs(2))
            lease = await store.lease("w")
            await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
            started = time.monotonic()
            r = await http.post("/v1/rollouts/wait", json={"rollout_ids": [queued.rollout_id, done.rollout_id]},
                                headers=AUTH)  # fmt: skip
            assert r.status_code == 200 and 0.25 <= time.monotonic() - started < 10
            body = r.json()
            assert body["timed_out"] is True
            assert [(x["rollout_id"], x["status"]) for x in body["rollouts"]] == [(done.rollout_id, "succeeded")]
            assert [(x["rollout_id"], x["status"]) for x in body["pending"]] == [(queued.rollout_id, "queued")]
            old = msgspec.json.decode(r.content, type=RolloutsResponse)  # what a client from before pending reads
            assert [x.rollout_id for x in old.rollouts] == [done.rollout_id]
            r = await http.post("/v1/rollouts/wait", json={"rollout_ids": [done.rollout_id]}, headers=AUTH)
            assert r.json()["timed_out"] is False and r.json()["pending"] == []

            started = time.monotonic()
            waited = await store.wait([queued.rollout_id, done.rollout_id], timeout_s=0.8)  # three polls of <= 0.3 s
            assert 0.75 <= time.monotonic() - started < 10
            assert waited.timed_out and [r.rollout_id for r in waited] == [done.rollout_id]
            assert [(r.rollout_id, r.status) for r in waited.pending] == [(queued.rollout_id, RolloutStatus.QUEUED)]
            with pytest.raises(NotFoundError, match="'ro-unknown'"):
                await store.wait([done.rollout_id, "ro-unknown"], timeout_s=30)
            r = await http.post("/v1/rollouts/wait", json={"rollout_ids": ["ro-x", "ro-y"]}, headers=AUTH)
            assert r.status_code == 404 and r.json()["error"]["message"] == "unknown rollouts 'ro-x', 'ro-y'"
    finally:
        server.stop()


async def test_unknown_route_is_json_404(http):
    r = await http.get("/v1/nothing-here", headers=AUTH)
    assert r.status_code == 404 and "error" in r.json()


async def test_illegal_transition_and_stale_attempt_are_409(http, store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    aid = lease.attempt.attempt_id
    r = await http.post(f"/v1/attempts/{aid}/finish", json={"status": "running"}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["type"] == "IllegalTransitionError"
    with pytest.raises(IllegalTransitionError):
        await store.finish(aid, AttemptStatus.RUNNING)
    await store.finish(aid, AttemptStatus.SUCCEEDED, reward=1.0)
    r = await http.post(f"/v1/attempts/{aid}/finish", json={"status": "failed"}, headers=AUTH)
    assert r.status_code == 409 and r.json()["error"]["type"] == "StaleAttemptError"
    with pytest.raises(StaleAttemptError):
        await store.finish(aid, AttemptStatus.FAILED)


async def test_oversized_body_is_413_with_or_without_content_length(http, store):
    big = b'{"specs": [' + b" " * (2 << 20) + b"]}"
    r = await http.post("/v1/rollouts", content=big, headers=AUTH)
    assert r.status_code == 413

    async def chunks():  # no Content-Length: the server must count streamed bytes
        for _ in range(40):
            yield b" " * 65536

    r = await http.post("/v1/rollouts", content=chunks(), headers=AUTH)
    assert r.status_code == 413
    assert await store.counts() == dict.fromkeys(RolloutStatus, 0)


async def test_openapi_lists_every_route_with_real_schemas(http):
    r = await http.get("/openapi.json", headers=AUTH)
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    for route in ROUTES:
        assert route.method.lower() in doc["paths"][route.path], route.path
    schemas = doc["components"]["schemas"]
    assert {"Span", "RolloutSpec", "AddSpansRequest", "ErrorResponse"} <= schemas.keys()
    assert schemas["Span"]["properties"]["seq"]["type"] == "integer"
    add_spans = doc["paths"]["/v1/spans"]["post"]
    assert add_spans["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AddSpansRequest"
    }
    refs = [m for m in r.text.split('"$ref":"#/components/schemas/')[1:]]
    assert all(ref.split('"')[0] in schemas for ref in refs)


async def test_client_retries_across_a_server_restart_without_duplicates(tmp_path):
    db = tmp_path / "store.db"
    first = serve_in_thread(db, token=TOKEN)
    client = StoreClient(first.url, token=TOKEN, retries=20, backoff_s=0.02, max_backoff_s=0.1)
    try:
        batch = specs(3)
        await client.enqueue(batch)
        lease = await client.lease("w")
        spans = spans_for(lease, 5)
        first.stop()  # the store goes away between two calls of a runner

        restarted: list = []

        def restart_later():
            time.sleep(0.3)
            restarted.append(serve_in_thread(db, token=TOKEN, port=first.port))

        threading.Thread(target=restart_later).start()
        t0 = time.perf_counter()
        assert await client.add_spans(spans) == 5  # retried until the new server answers
        assert time.perf_counter() - t0 >= 0.25
        # the caller retries whole calls too: same ids, nothing new
        assert await client.add_spans(spans) == 0
        await client.enqueue(batch)
        await client.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        await client.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        counts = await client.counts()
        assert counts[RolloutStatus.SUCCEEDED] == 1 and counts[RolloutStatus.QUEUED] == 2
        assert sum(counts.values()) == 3
        assert [s.span_id for s in await client.query_spans(lease.rollout.rollout_id)] == [s.span_id for s in spans]
    finally:
        await client.close()
        for handle in restarted:
            handle.stop()


async def test_unreachable_server_raises_store_unavailable_naming_the_url(tmp_path):
    handle = serve_in_thread(tmp_path / "store.db")
    url = handle.url
    handle.stop()
    client = StoreClient(url, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(StoreUnavailableError, match=url):
            await client.counts()
    finally:
        await client.close()


async def test_abandoned_long_poll_does_not_take_a_rollout(store, server):
    other = StoreClient(server.url, token=TOKEN)
    try:
        waiter = asyncio.create_task(other.lease("gone", wait_s=30))
        await asyncio.sleep(0.2)
        waiter.cancel()  # the runner stops waiting; its connection closes
        await asyncio.sleep(0.2)
        (rollout,) = await store.enqueue(specs(1))
        lease = await store.lease("w", wait_s=2)
        assert lease is not None and lease.rollout.rollout_id == rollout.rollout_id
        assert lease.attempt.worker_id == "w"
    finally:
        await other.close()


async def test_long_poll_lease_over_http_wakes_on_enqueue(store, server):
    trainer = StoreClient(server.url, token=TOKEN)
    try:
        waiter = asyncio.create_task(store.lease("w", wait_s=59))  # one long poll (the server caps them at 60 s)
        await asyncio.sleep(0.1)
        (rollout,) = await trainer.enqueue(specs(1))
        lease = await asyncio.wait_for(waiter, 30)  # woken by the enqueue through the other client, not timed out
        assert lease.rollout.rollout_id == rollout.rollout_id
    finally:
        await trainer.close()


def test_sync_client(server):
    with SyncStoreClient(server.url, token=TOKEN) as store:
        (rollout,) = store.enqueue(specs(1))
        lease = store.lease("sync-runner")
        assert lease.rollout.rollout_id == rollout.rollout_id
        assert store.heartbeat(lease.attempt.attempt_id).status is AttemptStatus.RUNNING
        assert store.add_spans(spans_for(lease, 3)) == 3
        store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=0.5)
        assert store.get_rollout(rollout.rollout_id).reward == 0.5
        assert len(store.query_spans(rollout.rollout_id)) == 3
        assert [r.rollout_id for r in store.wait([rollout.rollout_id], timeout_s=1)] == [rollout.rollout_id]
        assert store.get_resources() is None
        v1 = store.put_resources(Resources(items={"llm": LLM(endpoint="http://127.0.0.1:9/v1", model="m")}))
        assert store.get_resources().version == v1.version == 1
        assert store.counts()[RolloutStatus.SUCCEEDED] == 1
        with pytest.raises(NotFoundError):
            store.query_attempts("ro-nope")


async def test_connection_closed_by_a_restart_is_replaced_without_a_retry(tmp_path):
    db = tmp_path / "store.db"
    first = serve_in_thread(db, token=TOKEN)
    client = StoreClient(first.url, token=TOKEN, retries=0)  # any failure would surface
    second = None
    try:
        await client.enqueue(specs(1))  # leaves a keep-alive connection in the pool
        first.stop()
        second = serve_in_thread(db, token=TOKEN, port=first.port)
        assert (await client.counts())[RolloutStatus.QUEUED] == 1  # the dead pooled connection was not used
    finally:
        await client.close()
        if second is not None:
            second.stop()


async def test_lean_transport_reads_chunked_responses_and_headers():
    """A real socket server answering with chunked encoding (an extension, a trailer) and then closing."""
    from lightrail.store.client import LeanHTTPTransport

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Run: 7\r\nConnection: close\r\n\r\n"
            b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(transport=LeanHTTPTransport()) as http:
            for _ in range(2):  # the closed connection is not reused for the second request
                response = await http.get(f"http://127.0.0.1:{port}/x")
                assert (response.status_code, response.text, response.headers["x-run"]) == (200, "hello, world", "7")
                assert response.reason_phrase == "OK"
    finally:
        server.close()
        await server.wait_closed()


async def test_unexpected_error_is_500_with_the_traceback_only_in_the_log(caplog):
    from lightrail.store import MemoryStore

    class BrokenStore(MemoryStore):
        async def counts(self):
            raise RuntimeError("secret internal detail")

    handle = serve_in_thread(BrokenStore(), token=TOKEN)
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            r = await http.get("/v1/counts", headers=AUTH)
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "internal error: RuntimeError"
        assert "secret" not in r.text
        assert "secret internal detail" in caplog.text and "Traceback" in caplog.text
    finally:
        handle.stop()
