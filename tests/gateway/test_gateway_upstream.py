"""`OpenAIUpstream` over real HTTP: an agent calls gateway A, whose backend forwards to gateway B (unrouted,
serving the `ScriptedBackend` fake) as it would forward to vLLM. B answers vLLM's ``return_token_ids``
extension, so the ids recorded by A are B's."""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest

from lightrail.gateway import OpenAIUpstream, ScriptedBackend, ScriptedReply
from lightrail.types import Attr, BackendError, StatusCode

MESSAGES = [{"role": "user", "content": "What's the weather in Lima?"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def two_hops(make_gateway, script, **upstream_kwargs):
    upstream_server = make_gateway(ScriptedBackend(script), token="upstream-secret")
    backend = OpenAIUpstream(upstream_server.url, api_key="upstream-secret", **upstream_kwargs)
    gateway = make_gateway(backend)
    return gateway, gateway.lease(), backend


def test_ids_and_logprobs_come_from_the_upstream(make_gateway):
    gateway, lease, _ = two_hops(make_gateway, ["Sunny, 24 degrees."], policy_version=7)
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    completion = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True, seed=1)
    assert completion.choices[0].message.content == "Sunny, 24 degrees."
    [span] = gateway.spans(lease)
    attrs = span.attributes
    assert attrs[Attr.TOKEN_IDS_AVAILABLE] is True
    assert attrs[Attr.POLICY_VERSION] == 7
    [choice] = attrs[Attr.CHOICES]
    assert ScriptedBackend.decode(choice["token_ids"]) == "Sunny, 24 degrees."
    assert ScriptedBackend.decode(attrs[Attr.PROMPT_IDS]).endswith("<|assistant|>")
    assert [e.logprob for e in completion.choices[0].logprobs.content] == choice["logprobs"]


def test_tool_calls_and_streaming_through_two_hops(make_gateway):
    reply = ScriptedReply(tool_calls=[("get_weather", {"city": "Lima"})])
    gateway, lease, _ = two_hops(make_gateway, [reply])
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, tools=[TOOL], stream=True))
    arguments = "".join(
        call.function.arguments or "" for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()
    )
    assert json.loads(arguments) == {"city": "Lima"}
    [span] = gateway.spans(lease)
    assert span.attributes[Attr.CHOICES][0]["finish_reason"] == "tool_calls"
    assert ScriptedBackend.decode(span.attributes[Attr.CHOICES][0]["token_ids"]).startswith("<tool_call>")


def test_completions_through_two_hops(make_gateway):
    gateway, lease, _ = two_hops(make_gateway, [" forty-two"])
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    completion = client.completions.create(model="m", prompt="The answer is", max_tokens=20)
    assert completion.choices[0].text == " forty-two"
    [span] = gateway.spans(lease)
    assert ScriptedBackend.decode(span.attributes[Attr.PROMPT_IDS]) == "The answer is"
    assert ScriptedBackend.decode(span.attributes[Attr.CHOICES][0]["token_ids"]) == " forty-two"


def test_upstream_without_ids_is_recorded_as_unavailable(make_gateway):
    gateway, lease, _ = two_hops(make_gateway, ["no ids here"], request_token_ids=False)
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "no ids here"
    [span] = gateway.spans(lease)
    assert span.attributes[Attr.TOKEN_IDS_AVAILABLE] is False
    assert span.attributes[Attr.PROMPT_IDS] is None
    assert span.attributes[Attr.CHOICES][0]["token_ids"] is None


def test_upstream_4xx_is_a_bad_request_for_the_agent(make_gateway):
    refusal = BackendError("context length exceeded", status=400, param="messages", code="context_length")
    gateway, lease, _ = two_hops(make_gateway, [refusal])
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert exc.value.body["message"] == "context length exceeded"
    assert exc.value.body["param"] == "messages"
    [span] = gateway.spans(lease)
    assert span.status.code is StatusCode.ERROR


def test_upstream_auth_failure_is_passed_on(make_gateway):
    upstream_server = make_gateway(ScriptedBackend(), token="upstream-secret")
    gateway = make_gateway(OpenAIUpstream(upstream_server.url, api_key="wrong"))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=MESSAGES)


def test_unreachable_upstream_is_502(make_gateway):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gateway = make_gateway(OpenAIUpstream(f"http://127.0.0.1:{port}/v1"))
    lease = gateway.lease()
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert exc.value.status_code == 502
    [span] = gateway.spans(lease)
    assert span.status.code is StatusCode.ERROR and "unreachable" in span.status.message


def test_model_override_and_listing(make_gateway):
    upstream_server = make_gateway(ScriptedBackend(model="served-name"))
    backend = OpenAIUpstream(upstream_server.url)
    gateway = make_gateway(backend)
    assert gateway.call(backend.refresh_models()) == ["served-name"]
    overriding = OpenAIUpstream(upstream_server.url, model="forced")
    gateway2 = make_gateway(overriding)
    client = openai.OpenAI(base_url=gateway2.url + "/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model="agent-name", messages=MESSAGES).model == "forced"
    assert [m.id for m in client.models.list()] == ["forced"]


def test_idle_connections_closed_by_the_upstream_are_replaced(make_gateway):
    # uvicorn (and so vLLM) closes idle keep-alive connections after a few seconds; here after 0.1 s
    upstream_server = make_gateway(ScriptedBackend(), uvicorn_config={"timeout_keep_alive": 0.1})
    gateway = make_gateway(OpenAIUpstream(upstream_server.url))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
    for i in range(3):
        assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{i}"}])
        time.sleep(0.3)  # the gateway's pooled connection is closed by the upstream meanwhile


def test_chunked_upstream_answers_are_read(serve_asgi):
    from lightrail._http import HTTPPool

    async def chunked_app(scope, receive, send):  # a minimal ASGI server answering with chunked encoding
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"hello ", b"chunked ", b"world"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    server = serve_asgi(chunked_app)
    pool = HTTPPool(server.url)
    for _ in range(2):  # the second request reuses the kept-alive connection
        assert server.call(pool.request("GET", "/")) == (200, b"hello chunked world")
    assert len(pool._idle) == 1
    server.call(pool.aclose())
