"""Recording served traffic (``gateway serve --record``): sessions, token ids, redaction, feedback over HTTP.

A real gateway (uvicorn on 127.0.0.1) over a SQLite store, the real ``openai`` client with no per-attempt route,
and the store server's ``POST /v1/feedback`` through `lightrail.feedback`.
"""

from __future__ import annotations

import asyncio
import glob

import httpx
import msgspec
import pytest
from openai import OpenAI

import lightrail
from lightrail.adapters import build_episode
from lightrail.gateway import ScriptedBackend
from lightrail.gateway.recording import SESSION_HEADER, SessionRecorder
from lightrail.store import SQLiteStore
from lightrail.store.server import serve_in_thread
from lightrail.types import AGENT_HEADER, LLM, Attr, RolloutStatus, Span

SECRET = "4111-1111-1111-1111"


def _recording(make_gateway, tmp_path, **recorder_kw):
    store = SQLiteStore(tmp_path / "served.db")
    sessions = SessionRecorder(store, **recorder_kw)
    server = make_gateway(ScriptedBackend(["Sure.", "Done."] * 20, policy_version=3), store=store, sessions=sessions)
    return server, store, OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _stored(server, store):
    """Every served rollout and its spans, after the gateway handed all spans to the store."""

    async def go():
        await asyncio.sleep(0.05)  # sessions opened in the background, then their spans queued
        await server.app.state.recorder.flush()
        rollouts = [r for r in await store.query_rollouts() if r.mode == "served"]
        return {r.rollout_id: (r, await store.query_spans(r.rollout_id)) for r in rollouts}

    return server.call(go())


def test_served_calls_are_recorded_under_their_sessions_with_token_ids(make_gateway, tmp_path):
    server, store, client = _recording(make_gateway, tmp_path)
    messages = [{"role": "user", "content": "Book a table"}]
    first = client.chat.completions.with_raw_response.create(
        model="scripted", messages=messages, extra_headers={SESSION_HEADER: "conv-1"}
    )
    client.chat.completions.create(model="scripted", messages=messages, extra_headers={SESSION_HEADER: "conv-1"})
    by_user = client.chat.completions.with_raw_response.create(model="scripted", messages=messages, user="alice")
    odd_user = client.chat.completions.with_raw_response.create(model="scripted", messages=messages, user="a b/c")
    alone = client.chat.completions.with_raw_response.create(model="scripted", messages=messages)

    assert first.headers[SESSION_HEADER] == "conv-1" and by_user.headers[SESSION_HEADER] == "alice"
    hashed = odd_user.headers[SESSION_HEADER]
    assert hashed.startswith("h-") and "a b" not in hashed
    own = alone.headers[SESSION_HEADER]
    assert own == alone.parse().id  # a call without a session is a session of its own, named by its response id

    stored = _stored(server, store)
    assert sorted(stored) == sorted(f"session-{s}" for s in ("conv-1", "alice", hashed, own))
    rollout, spans = stored["session-conv-1"]
    assert rollout.status is RolloutStatus.RUNNING and rollout.metadata["session_source"] == "header"
    calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
    assert len(calls) == 2
    for call in calls:
        assert call.attributes[Attr.TOKEN_IDS_AVAILABLE] is True and call.attributes[Attr.PROMPT_IDS]
        assert call.attributes[Attr.POLICY_VERSION] == 3
        assert call.attributes[Attr.SESSION_ID] == "conv-1" and call.attributes[Attr.SESSION_SOURCE] == "header"
    episode = build_episode(spans)  # credit assignment reads a session like any rollout
    assert [c.response_id for c in episode.calls] == [first.parse().id, calls[1].attributes[Attr.RESPONSE_ID]]
    assert stored["session-alice"][0].metadata["session_source"] == "user"


def test_session_from_metadata_and_from_anthropic_user_id(make_gateway, tmp_path):
    server, store, _ = _recording(make_gateway, tmp_path)
    chat = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "metadata": {"session_id": "m-9"}}
    answer = httpx.post(server.url + "/v1/chat/completions", json=chat)
    assert answer.status_code == 200 and answer.headers[SESSION_HEADER] == "m-9"
    messages = {
        "model": "scripted",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "bob"},
    }
    answer = httpx.post(server.url + "/v1/messages", json=messages)
    assert answer.status_code == 200 and answer.headers[SESSION_HEADER] == "bob"
    stored = _stored(server, store)
    assert {"session-m-9", "session-bob"} <= set(stored)
    assert stored["session-bob"][1][0].attributes[Attr.ENDPOINT] == "messages"


def test_a_malformed_session_header_is_a_400_and_nothing_is_stored(make_gateway, tmp_path):
    server, store, _ = _recording(make_gateway, tmp_path)
    body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(server.url + "/v1/chat/completions", json=body, headers={SESSION_HEADER: "../etc"})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == SESSION_HEADER
    assert _stored(server, store) == {}


def scrub(span: Span) -> Span:
    """A redactor: the card number out of the request, the token ids (which encode it) dropped."""
    text = msgspec.json.encode(span.attributes[Attr.REQUEST]).decode().replace(SECRET, "[card]")
    span.attributes[Attr.REQUEST] = msgspec.json.decode(text)
    span.attributes[Attr.PROMPT_IDS] = None
    span.attributes[Attr.TOKEN_IDS_AVAILABLE] = False
    return span


def test_redaction_runs_before_anything_is_stored(make_gateway, tmp_path):
    server, store, client = _recording(make_gateway, tmp_path, redact=scrub)
    message = f"my card is {SECRET}, book it"
    client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": message}], extra_headers={SESSION_HEADER: "pay-1"}
    )
    ((_, spans),) = _stored(server, store).values()
    assert "[card]" in msgspec.json.encode(spans[0].attributes[Attr.REQUEST]).decode()
    server.stop()  # closes the store: the WAL is checkpointed into the file
    for path in glob.glob(str(tmp_path / "served.db*")):
        with open(path, "rb") as f:
            assert SECRET.encode() not in f.read(), path


def test_feedback_over_http_rewards_the_session_once(make_gateway, tmp_path):
    """The application posts feedback to the store server that the gateway records into."""
    store_server = serve_in_thread(tmp_path / "shared.db", token="store-token")
    try:
        from lightrail.store import StoreClient

        store = StoreClient(store_server.url, token="store-token")
        sessions = SessionRecorder(store)
        server = make_gateway(ScriptedBackend(["A.", "B."]), store=store, sessions=sessions)
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.with_raw_response.create(
            model="scripted", messages=[{"role": "user", "content": "q"}], extra_headers={SESSION_HEADER: "t-1"}
        )
        call_id = reply.parse().id
        _stored(server, store)

        with pytest.raises(Exception, match="no served session") as unknown:
            lightrail.feedback(store_server.url, session_id="t-404", reward=1.0, token="store-token")
        assert type(unknown.value).__name__ == "NotFoundError"
        result = lightrail.feedback(
            store_server.url,
            session_id="t-1",
            reward=1.0,
            feedback_id="fb-t1",
            intermediate={call_id: 0.5},
            token="store-token",
        )
        again = lightrail.feedback(
            store_server.url, session_id="t-1", reward=1.0, feedback_id="fb-t1", token="store-token"
        )
        assert (result.duplicate, again.duplicate) == (False, True)
        unauthorized = httpx.post(store_server.url + "/v1/feedback", json={"session_id": "t-1", "reward": 0.0})
        assert unauthorized.status_code == 401

        async def read():
            return await store.get_rollout("session-t-1"), build_episode(await store.query_spans("session-t-1"))

        rollout, episode = server.call(read())
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 1.0
        assert episode.final_reward == 1.0 and [(r.response_id, r.value) for r in episode.intermediate] == [
            (call_id, 0.5)
        ]
    finally:
        store_server.stop()


def test_served_calls_name_their_agent_by_route_or_header(make_gateway, tmp_path):
    """A deployed agent names who makes each call the way runners do: the session's calls carry their agents."""
    server, store, client = _recording(make_gateway, tmp_path)
    writer = OpenAI(base_url=LLM(endpoint=server.url, model="m").endpoint_for("writer"), api_key="x", max_retries=0)
    session = {SESSION_HEADER: "conv-9"}
    messages = [{"role": "user", "content": "Draft it"}]
    writer.chat.completions.create(model="scripted", messages=messages, extra_headers=session)
    client.chat.completions.create(
        model="scripted", messages=messages, extra_headers={**session, AGENT_HEADER: "critic"}
    )
    client.chat.completions.create(model="scripted", messages=messages, extra_headers=session)
    _, spans = _stored(server, store)["session-conv-9"]
    assert [c.agent_name for c in build_episode(spans).calls] == ["writer", "critic", None]
