"""The Anthropic Messages API on the gateway, driven by the real ``anthropic`` SDK (sync and async) against a real
server on 127.0.0.1: text, a tool loop, stop sequences, streaming, refusals, auth, recorded spans, and one call
into the embedded engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import anthropic
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lightrail.adapters import spans_to_messages
from lightrail.adapters.episode import build_episode
from lightrail.adapters.rewards import ToolRewardRule
from lightrail.gateway import OpenAIUpstream, ScriptedBackend
from lightrail.gateway.fake import ScriptedReply
from lightrail.types import Attr, ChatRequest

TOKEN = "secret-token"
MODEL = "scripted-fake"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def root_url(server, lease=None) -> str:
    """What an Anthropic agent is given: the (attempt) base URL without ``/v1``."""
    return server.base_url(lease)[: -len("/v1")] if lease is not None else server.url


def client_for(server, lease=None, key=TOKEN) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root_url(server, lease), api_key=key, max_retries=0)


def test_system_and_text(make_gateway):
    backend = ScriptedBackend(lambda request: "" if request.messages[-1]["content"] == "?" else "Hello there!")
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)  # unrouted /v1/messages: served, not recorded
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        system="You are terse.",
        messages=[{"role": "user", "content": "Hi"}],
        metadata={"user_id": "u-1"},
        service_tier="auto",
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello there!"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == len(b"Hello there!")
    request = backend.requests[-1]
    assert request.messages == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    assert request.sampling.max_tokens == 64 and request.sampling.n == 1

    # system as text blocks, user content as blocks, sampling through extra_body (this SDK has no kwargs for it)
    client.messages.create(
        model=MODEL,
        max_tokens=8,
        system=[{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two.", "cache_control": None}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        extra_body={"temperature": 0.5, "top_p": 0.9},
    )
    request = backend.requests[-1]
    assert request.messages == [
        {"role": "system", "content": "Rule one.\nRule two."},
        {"role": "user", "content": "ab"},
    ]
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.max_tokens) == (0.5, 0.9, 8)
    assert server.spans(server.lease()) == []

    # an empty answer is still one (empty) text block, as agents expect content[0]
    empty = client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "?"}])
    assert [(b.type, b.text) for b in empty.content] == [("text", "")]
    with client.messages.stream(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "?"}]) as stream:
        assert [(b.type, b.text) for b in stream.get_final_message().content] == [("text", "")]


def _weather_script(request):
    """Call the tool until a tool result is in the conversation, then answer from it."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return f"It is {json.loads(last['content'])['temp']}C."
    return ScriptedReply(text="Let me check.", tool_calls=[("get_weather", {"city": "Paris"})])


async def _agent(client: anthropic.AsyncAnthropic, question: str) -> tuple[anthropic.types.Message, list]:
    """A small tool-using agent written against the SDK only."""
    messages: list = [{"role": "user", "content": question}]
    for _ in range(4):
        message = await client.messages.create(
            model=MODEL,
            max_tokens=256,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            messages=messages,
        )
        if message.stop_reason != "tool_use":
            return message, messages
        messages.append({"role": "assistant", "content": message.content})
        results = []
        for block in message.content:
            if block.type == "tool_use":
                assert block.name == "get_weather"
                result = json.dumps({"city": block.input["city"], "temp": 21})
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": result})
        messages.append({"role": "user", "content": results})
    raise AssertionError("the agent never finished")


def test_tool_use_round_trip_async_agent_and_adapters(make_gateway):
    backend = ScriptedBackend(_weather_script)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()

    async def run():
        async with anthropic.AsyncAnthropic(base_url=root_url(server, lease), api_key=TOKEN, max_retries=0) as c:
            return await _agent(c, "Weather in Paris?")

    final, history = asyncio.run(run())
    assert final.content[0].text == "It is 21C." and final.stop_reason == "end_turn"

    tool_use = history[1]["content"][1]
    assert tool_use.type == "tool_use" and tool_use.id.startswith("toolu_")
    assert tool_use.input == {"city": "Paris"}
    # the second backend request carries the call and its result, linked by the toolu_ id
    second = backend.requests[1]
    assert second.messages[1] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": tool_use.id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert second.messages[2] == {
        "role": "tool",
        "tool_call_id": tool_use.id,
        "content": '{"city": "Paris", "temp": 21}',
    }
    assert second.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": WEATHER_TOOL["input_schema"],
            },
        }
    ]
    assert second.tool_choice == "auto" and second.parallel_tool_calls is False

    # the spans read like chat calls: the chat view's tool call ids are the toolu_ ids the agent saw
    first_span, second_span = server.spans(lease)
    recorded_call = first_span.attributes[Attr.RESPONSE]["choices"][0]["message"]["tool_calls"][0]
    assert recorded_call["id"] == tool_use.id
    samples = spans_to_messages([first_span, second_span])
    assert [s.turn for s in samples] == [0, 1]
    assert samples[1].messages[-1] == {"role": "assistant", "content": "It is 21C."}
    assert samples[1].messages[:-1] == second.messages
    assert samples[1].response_id == final.id
    episode = build_episode([second_span, first_span], tool_rewards_rule=ToolRewardRule(success=0.5, error=-1.0))
    [reward] = episode.intermediate
    assert (reward.value, reward.response_id, reward.source) == (0.5, first_span.attributes[Attr.RESPONSE_ID], "tool")


def test_tool_result_error_order_and_tool_choice(make_gateway):
    backend = ScriptedBackend([ScriptedReply(tool_calls=[("get_weather", {"city": "Oslo"}), ("get_weather", {})])])
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)
    message = client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Oslo?"}],
    )
    assert [b.type for b in message.content] == ["tool_use", "tool_use"]  # no text block when there is no text
    assert message.stop_reason == "tool_use"
    assert backend.requests[-1].tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    a, b = message.content
    client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any"},
        messages=[
            {"role": "user", "content": "Oslo?"},
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": b.id,
                        "content": [{"type": "text", "text": "no city"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "between"},
                    {"type": "tool_result", "tool_use_id": a.id, "content": "3C"},
                    {"type": "text", "text": "Go on."},
                ],
            },
        ],
    )
    request = backend.requests[-1]
    assert request.tool_choice == "required" and request.parallel_tool_calls is None
    assert request.messages[2:] == [
        {"role": "tool", "tool_call_id": b.id, "content": "Error: no city"},
        {"role": "user", "content": "between"},
        {"role": "tool", "tool_call_id": a.id, "content": "3C"},
        {"role": "user", "content": "Go on."},
    ]


def test_stop_sequences(make_gateway):
    backend = ScriptedBackend(["The answer is 42. STOP and more END"])
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)
    params = {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "?"}]}
    message = client.messages.create(**params, stop_sequences=["END", "STOP"])
    assert message.content[0].text == "The answer is 42. "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "STOP")
    assert backend.requests[-1].sampling.stop == ["END", "STOP"]

    message = client.messages.create(**params, stop_sequences=["nowhere"])
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)

    message = client.messages.create(**{**params, "max_tokens": 5}, stop_sequences=["STOP"])
    assert (message.content[0].text, message.stop_reason, message.stop_sequence) == ("The a", "max_tokens", None)


def _normalized(message: anthropic.types.Message) -> dict:
    """A message with its per-call ids replaced by their position (two calls never share ids)."""
    data = message.model_dump()
    data["id"] = "msg"
    for k, block in enumerate(data["content"]):
        if block["type"] == "tool_use":
            block["id"] = f"toolu-{k}"
    return data


@pytest.mark.parametrize(
    "reply",
    [
        "A fairly long answer, long enough to be split into several text deltas: ünïcödé too.",
        ScriptedReply(
            text="Checking both.",
            tool_calls=[("get_weather", {"city": 'Sa"o Pa\\ulo ✓', "n": [1, 2.5, None]}), ("get_weather", {})],
        ),
    ],
    ids=["text", "tools"],
)
def test_streaming_assembles_the_non_streamed_message(make_gateway, reply):
    backend = ScriptedBackend([reply])
    server = make_gateway(backend, token=TOKEN, stream_chunk_chars=5)
    lease = server.lease()
    client = client_for(server, lease)
    params = {
        "model": MODEL,
        "max_tokens": 512,
        "tools": [WEATHER_TOOL],
        "messages": [{"role": "user", "content": "Go."}],
    }
    plain = client.messages.create(**params)
    with client.messages.stream(**params) as stream:
        streamed = stream.get_final_message()
    assert _normalized(streamed) == _normalized(plain)

    # the raw event sequence, as Anthropic sends it
    events = list(client.messages.create(**params, stream=True))
    kinds = [e.type for e in events]
    n_blocks = len(plain.content)
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == n_blocks
    assert kinds.count("content_block_delta") > n_blocks  # really incremental at 5 characters a delta
    assert events[-2].delta.stop_reason == plain.stop_reason
    assert events[-2].usage.output_tokens == plain.usage.output_tokens

    # a streamed call records the same ids as the plain one
    s_plain, s_stream, s_raw = server.spans(lease)
    assert s_stream.attributes[Attr.STREAM] is True
    assert s_stream.attributes[Attr.CHOICES] == s_plain.attributes[Attr.CHOICES] == s_raw.attributes[Attr.CHOICES]
    assert s_stream.attributes[Attr.RESPONSE_ID] == streamed.id
    assert s_stream.attributes[Attr.REQUEST]["stream"] is True


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"extra_body": {"top_k": 40}}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"extra_body": {"temperature": 1.5}}, "temperature"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"metadata": {"user_id": "u", "tier": "gold"}}, "metadata.tier"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}},
                        ],
                    }
                ]
            },
            "image",
        ),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Well,"}]}, "prefill"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}
                ]
            },
            "toolu_x",
        ),
    ],
)
def test_refusals_name_the_field(make_gateway, extra, named):
    backend = ScriptedBackend(["never"])
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)
    params = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}], **extra}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**params)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error"  # Anthropic's envelope
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert named in info.value.body["error"]["message"]
    assert backend.requests == []
    [span] = server.spans(lease)  # refused calls are recorded too, with the body as sent
    assert span.status.code == "error" and named in span.status.message


def test_error_envelope_and_missing_max_tokens(make_gateway):
    server = make_gateway(ScriptedBackend(), token=TOKEN)
    response = httpx.post(
        f"{server.url}/v1/messages",
        headers={"x-api-key": TOKEN, "anthropic-version": "2023-06-01"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
    }


def test_wrong_key_is_401(make_gateway):
    server = make_gateway(ScriptedBackend(["ok"]), token=TOKEN)
    params = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    with pytest.raises(anthropic.AuthenticationError) as info:
        client_for(server, key="wrong-token").messages.create(**params)
    assert info.value.status_code == 401
    with pytest.raises(anthropic.AuthenticationError):
        client_for(server, key=TOKEN + "x").messages.create(**params)
    assert client_for(server).messages.create(**params).content[0].text == "ok"
    # a bearer token is accepted on this route too, and a right x-api-key does not rescue a wrong bearer's absence
    ok = httpx.post(f"{server.url}/v1/messages", headers={"authorization": f"Bearer {TOKEN}"}, json=params)
    assert ok.status_code == 200
    bad = httpx.post(f"{server.url}/v1/messages", headers={"x-api-key": ""}, json=params)
    assert bad.status_code == 401


def test_routed_span_records_ids_and_the_chat_view(make_gateway):
    backend = ScriptedBackend(["Paris."], policy_version=7)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)
    sent_messages = [{"role": "user", "content": "Capital of France?"}]
    message = client.messages.create(
        model=MODEL,
        max_tokens=32,
        system="Answer in one word.",
        messages=sent_messages,
        stop_sequences=["\n"],
        extra_body={"temperature": 0.7},
    )
    [span] = server.spans(lease)
    a = span.attributes
    assert span.name == Attr.SPAN_LLM_CALL and span.status.code == "ok"
    assert a[Attr.ENDPOINT] == "messages" and a[Attr.STREAM] is False and a[Attr.MODEL] == MODEL
    assert a[Attr.RESPONSE_ID] == message.id and message.id.startswith("msg_")
    assert a[Attr.POLICY_VERSION] == 7 and a[Attr.TOKEN_IDS_AVAILABLE] is True
    [choice] = a[Attr.CHOICES]
    assert ScriptedBackend.decode(choice["token_ids"]) == "Paris."
    assert len(choice["logprobs"]) == len(choice["token_ids"]) == message.usage.output_tokens
    assert len(a[Attr.PROMPT_IDS]) == message.usage.input_tokens
    assert ScriptedBackend.decode(a[Attr.PROMPT_IDS]).startswith("<|system|>Answer in one word.")
    # the chat view (what adapters read) and the Messages bodies as sent and received
    assert a[Attr.REQUEST] == {
        "model": MODEL,
        "messages": [{"role": "system", "content": "Answer in one word."}, *sent_messages],
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 1.0,
        "stop": ["\n"],
    }
    chat = a[Attr.RESPONSE]
    assert chat["object"] == "chat.completion" and chat["id"] == message.id
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert a[Attr.DIALECT_REQUEST]["system"] == "Answer in one word."
    assert a[Attr.DIALECT_REQUEST]["temperature"] == 0.7
    assert a[Attr.DIALECT_RESPONSE] == {
        "id": message.id,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "Paris."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": message.usage.input_tokens, "output_tokens": message.usage.output_tokens},
    }


def test_unknown_attempt_is_404_in_anthropic_format(make_gateway):
    server = make_gateway(ScriptedBackend(), token=TOKEN)
    lease = server.lease()
    client = anthropic.Anthropic(
        base_url=f"{server.url}/rollouts/{lease.rollout.rollout_id}/attempts/nope", api_key=TOKEN, max_retries=0
    )
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 404
    error = info.value.body["error"]
    assert error["type"] == "not_found_error" and "nope" in error["message"]
    raw = httpx.post(
        f"{server.url}/rollouts/nope/attempts/nope/v1/messages", headers={"x-api-key": TOKEN}, json={"model": MODEL}
    )
    assert raw.status_code == 404
    assert raw.json()["type"] == "error" and raw.json()["error"]["type"] == "not_found_error"


def test_embedded_engine_ids_stream_and_stop_sequence(make_gateway):
    pytest.importorskip("torch")
    from lightrail.engine import Engine, prepare_model

    engine = Engine.from_pretrained(prepare_model("tiny"))
    server = make_gateway(engine, token=TOKEN)
    try:
        lease = server.lease()
        client = client_for(server, lease)
        params = {
            "model": "tiny",
            "max_tokens": 24,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": "Count to five."}],
            "extra_body": {"temperature": 0.0},
        }
        plain = client.messages.create(**params)
        with client.messages.stream(**params) as stream:
            streamed = stream.get_final_message()
        text = "".join(b.text for b in plain.content if b.type == "text")
        assert _normalized(streamed) == _normalized(plain)
        s_plain, s_stream = server.spans(lease)[:2]
        for span in (s_plain, s_stream):
            [choice] = span.attributes[Attr.CHOICES]
            assert engine.decode(choice["token_ids"]) == text
            assert len(choice["logprobs"]) == len(choice["token_ids"]) == plain.usage.output_tokens
            assert span.attributes[Attr.POLICY_VERSION] == engine.policy_version
            assert len(span.attributes[Attr.PROMPT_IDS]) == plain.usage.input_tokens
        assert s_stream.attributes[Attr.CHOICES] == s_plain.attributes[Attr.CHOICES]

        # count_tokens: the tokens of the prompt the engine renders (chat template, system prompt), as a call sees
        counted = client.messages.count_tokens(model="tiny", system=params["system"], messages=params["messages"])
        assert counted.input_tokens == plain.usage.input_tokens
        # a model name the engine does not serve is answered by the model being trained; the span keeps both names
        other = client.messages.create(**{**params, "model": "another-model"})
        assert other.model == engine.name != "another-model"
        asked = server.spans(lease)[-1].attributes
        assert (asked[Attr.MODEL], asked[Attr.RESPONSE_MODEL]) == ("another-model", engine.name)

        # greedy again, now stopping on a piece of that text: the engine says which stop sequence ended it
        assert len(text) > 6, text
        stop = text[3:6]
        stopped = client.messages.create(**params, stop_sequences=["\x00never", stop])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
        cut = "".join(b.text for b in stopped.content if b.type == "text")
        assert text.startswith(cut) and len(cut) <= text.find(stop)
    finally:
        server.call(engine.close())


def test_through_an_openai_upstream(make_gateway):
    """Messages → gateway A (`OpenAIUpstream`) → gateway B (chat, vLLM's id extension): ids recorded by A are B's,
    and the stop string B reports (vLLM's ``stop_reason``) becomes ``stop_sequence``."""
    upstream = make_gateway(
        ScriptedBackend(["one two three", ScriptedReply(tool_calls=[("get_weather", {"city": "Rome"})])])
    )
    gateway = make_gateway(OpenAIUpstream(upstream.url, policy_version=3), token=TOKEN)
    lease = gateway.lease()
    client = client_for(gateway, lease)
    message = client.messages.create(
        model=MODEL, max_tokens=64, stop_sequences=["three"], messages=[{"role": "user", "content": "Count."}]
    )
    assert (message.content[0].text, message.stop_reason, message.stop_sequence) == (
        "one two ",
        "stop_sequence",
        "three",
    )
    call = client.messages.create(
        model=MODEL, max_tokens=256, tools=[WEATHER_TOOL], messages=[{"role": "user", "content": "Rome?"}]
    )
    [tool_use] = call.content
    assert (tool_use.type, tool_use.input, call.stop_reason) == ("tool_use", {"city": "Rome"}, "tool_use")
    first, second = gateway.spans(lease)
    assert ScriptedBackend.decode(first.attributes[Attr.CHOICES][0]["token_ids"]) == "one two "
    assert first.attributes[Attr.POLICY_VERSION] == 3 and first.attributes[Attr.TOKEN_IDS_AVAILABLE] is True
    assert second.attributes[Attr.RESPONSE]["choices"][0]["message"]["tool_calls"][0]["id"] == tool_use.id


def test_count_tokens_is_the_rendered_prompt_of_the_call(make_gateway):
    """``messages.count_tokens`` (the real SDK) answers what the same call's ``usage.input_tokens`` says, tools and
    system prompt included, routed or not; nothing is generated or recorded."""
    backend = ScriptedBackend(["ok"] * 4)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    params = {
        "model": MODEL,
        "system": "Use the tool.",
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": [WEATHER_TOOL],
    }
    for client in (client_for(server), client_for(server, lease)):
        counted = client.messages.count_tokens(**params)
        called = client.messages.create(**params, max_tokens=8)
        assert counted.input_tokens == called.usage.input_tokens > len("Weather in Rome?")
    assert len(backend.requests) == 2  # the two calls; counting generated nothing
    assert len(server.spans(lease)) == 1  # the routed call, not its count


def test_count_tokens_refusals(make_gateway):
    server = make_gateway(ScriptedBackend(), token=TOKEN)
    client = client_for(server)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Extra inputs are not permitted"):
        client.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], extra_body={"max_tokens": 3}
        )
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        client.messages.count_tokens(model=MODEL, messages=[])


def vllm_tokenizer(count: Callable[[dict], Awaitable[Response]]) -> Starlette:
    """An upstream with vLLM's ``POST /tokenize`` (at the server's root, next to ``/v1``), answered by ``count``.
    vLLM does not run on this machine; its request and answer shapes are vLLM's ``TokenizeChatRequest`` and
    ``TokenizeResponse``."""

    async def tokenize(request: Request) -> Response:
        return await count(json.loads(await request.body()))

    return Starlette(routes=[Route("/tokenize", tokenize, methods=["POST"])])


def test_count_tokens_through_an_upstream_is_the_upstreams_own_count(make_gateway, serve_asgi):
    """With an upstream (``gateway serve --upstream``), ``count_tokens`` is what the upstream's tokenizer counts for
    the chat it would render: the Messages request converted as for a call (system first, tools as functions), the
    served model name, the assistant turn opened. Here the upstream counts with the scripted backend's tokenizer, so
    the answer must equal a gateway counting with that backend itself."""
    seen: list[dict] = []
    counter = ScriptedBackend()

    async def count(body: dict) -> Response:
        seen.append(body)
        chat = ChatRequest(model=body["model"], messages=body["messages"], tools=body.get("tools"))
        n = await counter.count_tokens(chat)
        return JSONResponse({"count": n, "max_model_len": 4096, "tokens": list(range(n)), "token_strs": None})

    upstream = serve_asgi(vllm_tokenizer(count))
    gateway = make_gateway(OpenAIUpstream(f"{upstream.url}/v1", model="served-model"), token=TOKEN)
    direct = make_gateway(ScriptedBackend(), token=TOKEN)
    lease = gateway.lease()
    params = {
        "model": MODEL,
        "system": "Use the tool.",
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": [WEATHER_TOOL],
    }
    expected = client_for(direct).messages.count_tokens(**params).input_tokens
    assert expected > len("Weather in Rome?")
    for client in (client_for(gateway), client_for(gateway, lease)):
        assert client.messages.count_tokens(**params).input_tokens == expected
    body = seen[-1]
    assert body["model"] == "served-model" and body["add_generation_prompt"] is True
    assert body["messages"] == [{"role": "system", "content": "Use the tool."},
                                {"role": "user", "content": "Weather in Rome?"}]  # fmt: skip
    assert body["tools"][0]["function"]["name"] == "get_weather"
    hi = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert client_for(gateway).messages.count_tokens(**hi).input_tokens == (
        client_for(direct).messages.count_tokens(**hi).input_tokens
    )
    assert "tools" not in seen[-1]
    assert gateway.spans(lease) == []  # counting is not a call


def test_count_tokens_through_a_policy_adapter_asks_for_the_adapter_vllm_serves(make_gateway, serve_asgi):
    """A policy's backend on a shared vLLM server answers to ``<served>-<policy>``, a name the server does not know:
    `count_tokens` asks the tokenizer for the adapter the policy's calls are currently sent to."""
    from lightrail.gateway.backends import VersionedUpstream

    seen: list[str] = []

    async def count(body: dict) -> Response:
        seen.append(body["model"])
        return JSONResponse({"count": 7, "max_model_len": 4096, "tokens": list(range(7)), "token_strs": None})

    upstream = serve_asgi(vllm_tokenizer(count))
    backend = VersionedUpstream(f"{upstream.url}/v1", served_name="policy-write")
    backend.route("policy-write-v3", 3)
    gateway = make_gateway(backend, token=TOKEN)
    params = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert client_for(gateway).messages.count_tokens(**params).input_tokens == 7
    assert seen == ["policy-write-v3"]


def test_count_tokens_through_an_upstream_that_cannot_count_says_so(make_gateway, serve_asgi):
    """Never a guessed count: an upstream without a tokenizer endpoint (here another lightrail gateway) is a 404
    naming it; one answering without a count (llama.cpp's ``/tokenize`` reads ``content`` and answers
    ``{"tokens": []}`` for a chat) is a 502; the upstream's own 4xx reaches the caller."""
    hi = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    no_tokenizer = make_gateway(ScriptedBackend())
    gateway = make_gateway(OpenAIUpstream(no_tokenizer.url), token=TOKEN)
    with pytest.raises(anthropic.NotFoundError, match=r"cannot count tokens: POST /tokenize answered 404") as caught:
        client_for(gateway).messages.count_tokens(**hi)
    assert no_tokenizer.url in str(caught.value) and "does not estimate" in str(caught.value)

    async def llama_cpp(body: dict) -> Response:
        return JSONResponse({"tokens": []})

    gateway = make_gateway(OpenAIUpstream(serve_asgi(vllm_tokenizer(llama_cpp)).url), token=TOKEN)
    with pytest.raises(anthropic.InternalServerError, match="/tokenize sent an unreadable answer") as failed:
        client_for(gateway).messages.count_tokens(**hi)
    assert failed.value.status_code == 502

    async def refuses(body: dict) -> Response:
        return JSONResponse({"error": {"message": "This model's maximum context length is 8 tokens"}}, 400)

    gateway = make_gateway(OpenAIUpstream(serve_asgi(vllm_tokenizer(refuses)).url), token=TOKEN)
    with pytest.raises(anthropic.BadRequestError, match="maximum context length is 8 tokens"):
        client_for(gateway).messages.count_tokens(**hi)


def test_count_tokens_with_a_backend_that_cannot_count_is_a_404_naming_it(make_gateway):
    class Generates(ScriptedBackend):
        count_tokens = None  # a `Backend` need not count

    with pytest.raises(anthropic.NotFoundError, match=r"backend \(Generates\) cannot count tokens"):
        client_for(make_gateway(Generates(), token=TOKEN)).messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}]
        )
