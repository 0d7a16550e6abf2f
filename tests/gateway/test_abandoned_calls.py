"""A call whose client gives up is cancelled, not finished: the engine stops generating for it, an upstream sees
its request closed, and the call's span is marked abandoned, so the agent's retry is the one call that trains.

Real uvicorn gateways on 127.0.0.1, the embedded engine with the tiny model, the real ``openai`` client with a
short timeout. The engine's end-of-sequence token is banned (``logit_bias``) so that a full answer would take
``MAX_TOKENS`` decode steps, several times the client's patience.
"""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from lightrail.adapters import build_episode, spans_to_transitions
from lightrail.gateway import OpenAIUpstream
from lightrail.types import Attr, StatusCode

pytest.importorskip("torch")
from lightrail.engine import Engine, prepare_model  # noqa: E402  (after the torch check)

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
MAX_TOKENS = 480  # the tiny model's context is 512 positions
PATIENCE_S = 0.5  # the client's timeout: ~100-250 decode steps of the tiny model on a CPU, by its speed
CANCEL_TOKENS = MAX_TOKENS // 4  # tokens the engine may still generate once the client left (the cancellation's lag)


@pytest.fixture
def engine():
    engine = Engine.from_pretrained(prepare_model("tiny"))
    yield engine
    asyncio.run(engine.close())  # forwarded to the gateway's loop while it runs


def _long_answer(engine: Engine) -> dict:
    [eos] = sorted(engine._eos_ids)[:1]
    return {"model": "tiny", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "logit_bias": {str(eos): -100}}


def _wait_for_spans(server, lease, count: int, timeout_s: float = 30.0) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = server.spans(lease)
        if len(spans) >= count or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def _assert_engine_stopped(server, engine: Engine, at_leave: int) -> int:
    """The engine's token count stops growing (its batch emptied) soon after the client left (``at_leave``: the
    count then), and short of a full answer. Measured from the client's leaving, not as a share of the answer: how far
    the engine got in the client's patience depends on the machine's speed (a fast quiet CPU decodes ~500 tokens a
    second of the tiny model), the cancellation's delay does not."""
    settle = time.monotonic() + 10.0
    before = server.call(_generated(engine))
    while True:
        time.sleep(0.3)
        after = server.call(_generated(engine))
        if after == before or time.monotonic() > settle:
            break
        before = after
    assert after == before, "the engine kept generating for a client that left"
    assert after - at_leave < CANCEL_TOKENS, f"{after - at_leave} tokens generated after the client left"
    assert after < MAX_TOKENS, f"the abandoned call was generated in full ({after} tokens)"
    return after


async def _generated(engine: Engine) -> int:
    return engine.stats["generated_tokens"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_times_out_leaves_an_abandoned_span_and_its_retry_trains(make_gateway, engine, stream):
    server = make_gateway(engine, token="t")
    lease = server.lease()
    client = openai.OpenAI(base_url=server.base_url(lease), api_key="t", max_retries=0)

    with pytest.raises(openai.APITimeoutError):
        answer = client.chat.completions.create(**_long_answer(engine), stream=stream, timeout=PATIENCE_S)
        list(answer)  # a stream's events (none arrive before the generation ends)
    at_leave = server.call(_generated(engine))
    [abandoned] = _wait_for_spans(server, lease, 1)
    generated = _assert_engine_stopped(server, engine, at_leave)

    assert abandoned.attributes[Attr.ABANDONED] is True
    assert abandoned.status.code is StatusCode.ERROR
    assert "disconnected" in abandoned.status.message
    assert Attr.CHOICES not in abandoned.attributes
    assert abandoned.attributes[Attr.TOKEN_IDS_AVAILABLE] is False
    assert abandoned.attributes[Attr.STREAM] is stream

    # the agent retries, with the patience the answer needs
    retry = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, timeout=60)
    spans = _wait_for_spans(server, lease, 2)
    assert engine.stats["generated_tokens"] <= generated + 8

    episode = build_episode(spans)
    assert [call.response_id for call in episode.calls] == [retry.id]
    assert episode.calls[0].turn == 0
    assert episode.report.abandoned == 1
    transitions, report = spans_to_transitions(spans, final_reward=1.0)
    assert [t.metadata["response_id"] for t in transitions] == [retry.id]
    assert report.abandoned == 1


def test_an_abandoned_call_is_closed_upstream_too(make_gateway, engine):
    """Gateway A forwards to gateway B (the engine) as it forwards to vLLM: when A's client leaves, A closes its
    request to B, B sees its client leave, and B's engine stops."""
    upstream = make_gateway(engine, token="upstream-secret")
    gateway = make_gateway(OpenAIUpstream(upstream.url, api_key="upstream-secret"))
    lease = gateway.lease()
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)

    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(**_long_answer(engine), timeout=PATIENCE_S)
    at_leave = upstream.call(_generated(engine))
    [span] = _wait_for_spans(gateway, lease, 1)
    _assert_engine_stopped(upstream, engine, at_leave)
    assert span.attributes[Attr.ABANDONED] is True
    assert span.status.code is StatusCode.ERROR


def test_answered_calls_are_not_marked(make_gateway, engine):
    server = make_gateway(engine, token="t")
    lease = server.lease()
    client = openai.OpenAI(base_url=server.base_url(lease), api_key="t", max_retries=0)
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, stream=True))
    spans = server.spans(lease)
    assert [Attr.ABANDONED in s.attributes for s in spans] == [False, False]
    assert [s.status.code for s in spans] == [StatusCode.OK, StatusCode.OK]


def test_a_served_call_is_cancelled_too(make_gateway, engine):
    """An unrouted call (served traffic, recorded only under sessions) frees the engine the same way."""
    server = make_gateway(engine, token="t")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="t", max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(**_long_answer(engine), timeout=PATIENCE_S)
    _assert_engine_stopped(server, engine, server.call(_generated(engine)))
