"""The gateway served by uvicorn on loopback, driven by the real `openai` client and LangChain's ChatOpenAI,
in front of the shipped `ScriptedBackend` fake."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from lightrail.gateway import ScriptedBackend, ScriptedReply
from lightrail.types import Attr, BackendError, StatusCode

TOKEN = "test-token"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def client_for(server, lease, api_key=TOKEN, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(lease), api_key=api_key, max_retries=0, **kwargs)


def test_chat_records_one_span_with_ids_matching_the_text(make_gateway):
    server = make_gateway(ScriptedBackend(["Hello there, friend!"]), token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)

    completion = client.chat.completions.create(model="policy", messages=MESSAGES, logprobs=True, seed=3)

    text = completion.choices[0].message.content
    assert text == "Hello there, friend!"
    assert completion.id.startswith("chatcmpl-")
    [span] = server.spans(lease)
    attrs = span.attributes
    assert span.name == Attr.SPAN_LLM_CALL
    assert (span.rollout_id, span.attempt_id) == (lease.rollout.rollout_id, lease.attempt.attempt_id)
    assert span.status.code is StatusCode.OK
    assert attrs[Attr.ENDPOINT] == "chat.completions"
    assert attrs[Attr.REQUEST]["messages"] == MESSAGES
    assert attrs[Attr.RESPONSE_ID] == completion.id
    assert attrs[Attr.RESPONSE]["choices"][0]["message"]["content"] == text
    assert attrs[Attr.TOKEN_IDS_AVAILABLE] is True
    assert attrs[Attr.POLICY_VERSION] == 0
    assert attrs[Attr.MODEL] == "policy"
    assert attrs[Attr.RESPONSE_MODEL] == completion.model
    assert attrs[Attr.STREAM] is False
    assert attrs[Attr.LATENCY_MS] > 0
    [choice] = attrs[Attr.CHOICES]
    assert ScriptedBackend.decode(choice["token_ids"]) == text
    assert choice["finish_reason"] == "stop"
    # the logprobs the agent saw are the ones recorded, one per token id
    assert [e.logprob for e in completion.choices[0].logprobs.content] == choice["logprobs"]
    assert len(choice["logprobs"]) == len(choice["token_ids"])
    assert ScriptedBackend.decode(attrs[Attr.PROMPT_IDS]).startswith("<|system|>Be brief.")
    assert completion.usage.prompt_tokens == len(attrs[Attr.PROMPT_IDS])
    assert completion.usage.completion_tokens == len(choice["token_ids"])


def test_seq_increases_within_an_attempt(make_gateway):
    server = make_gateway()
    lease = server.lease()
    client = client_for(server, lease)
    for i in range(5):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"turn {i}"}])
    spans = server.spans(lease)
    assert [s.attributes[Attr.REQUEST]["messages"][0]["content"] for s in spans] == [f"turn {i}" for i in range(5)]
    seqs = [s.seq for s in spans]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5


def test_tool_calls_round_trip(make_gateway):
    reply = ScriptedReply(tool_calls=[("get_weather", {"city": "Paris"})])
    server = make_gateway(ScriptedBackend([reply, "It is sunny in Paris."]))
    lease = server.lease()
    client = client_for(server, lease)

    first = client.chat.completions.create(model="m", messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    history = [*MESSAGES, choice.message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
    second = client.chat.completions.create(model="m", messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is sunny in Paris."

    spans = server.spans(lease)
    assert len(spans) == 2
    raw = ScriptedBackend.decode(spans[0].attributes[Attr.CHOICES][0]["token_ids"])
    assert raw.startswith("<tool_call>") and "get_weather" in raw  # the ids hold the call markup
    assert spans[1].attributes[Attr.REQUEST]["messages"][-1]["tool_call_id"] == call.id


def test_streaming_matches_non_streaming(make_gateway):
    text = "Streaming is replayed from the complete generation, " * 3
    server = make_gateway(ScriptedBackend([text]))
    lease = server.lease()
    client = client_for(server, lease)

    plain = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=MESSAGES, logprobs=True, stream=True, stream_options={"include_usage": True}
        )
    )

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert sum(1 for d in deltas if d.content) > 1  # really chunked
    assert "".join(d.content or "" for d in deltas) == plain.choices[0].message.content == text
    streamed_lps = [
        e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert streamed_lps == [e.logprob for e in plain.choices[0].logprobs.content]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])

    s_plain, s_stream = server.spans(lease)
    assert s_stream.attributes[Attr.STREAM] is True
    assert s_stream.attributes[Attr.RESPONSE_ID] == chunks[0].id
    assert s_stream.attributes[Attr.CHOICES] == s_plain.attributes[Attr.CHOICES]
    assert s_stream.attributes[Attr.PROMPT_IDS] == s_plain.attributes[Attr.PROMPT_IDS]
    assert s_stream.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"] == text


def test_streamed_tool_calls_assemble(make_gateway):
    reply = ScriptedReply(tool_calls=[("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})])
    server = make_gateway(ScriptedBackend([reply]))
    lease = server.lease()
    chunks = list(
        client_for(server, lease).chat.completions.create(
            model="m", messages=MESSAGES, tools=[WEATHER_TOOL], stream=True
        )
    )
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta_call in chunk.choices[0].delta.tool_calls or ():
            call = calls.setdefault(delta_call.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or delta_call.id
            call["name"] += delta_call.function.name or ""
            call["arguments"] += delta_call.function.arguments or ""
    assert [json.loads(c["arguments"])["city"] for c in calls.values()] == ["Oslo", "Rome"]
    assert all(c["id"] and c["name"] == "get_weather" for c in calls.values())
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    [span] = server.spans(lease)
    recorded = span.attributes[Attr.RESPONSE]["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in recorded] == [c["id"] for c in calls.values()]


def test_async_client_concurrent_calls_each_recorded(make_gateway):
    server = make_gateway(ScriptedBackend(delay_s=0.01))
    leases = [server.lease() for _ in range(3)]

    async def run() -> None:
        clients = [openai.AsyncOpenAI(base_url=server.base_url(lease), api_key="x", max_retries=0) for lease in leases]
        calls = [
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{i}-{j}"}])
            for i, c in enumerate(clients)
            for j in range(10)
        ]
        results = await asyncio.gather(*calls)
        assert [r.choices[0].message.content for r in results] == [f"{i}-{j}" for i in range(3) for j in range(10)]
        for c in clients:
            await c.close()

    asyncio.run(run())
    for i, lease in enumerate(leases):
        spans = server.spans(lease)
        assert sorted(s.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"] for s in spans) == sorted(
            f"{i}-{j}" for j in range(10)
        )


def test_n_stop_max_tokens_and_seed_reach_the_backend(make_gateway):
    backend = ScriptedBackend(["one. two. three", "abcdefghijklmnopqrstuvwxyz"])
    server = make_gateway(backend)
    lease = server.lease()
    client = client_for(server, lease)

    completion = client.chat.completions.create(
        model="m", messages=MESSAGES, n=2, stop=". t", temperature=0.7, top_p=0.9, seed=11, max_tokens=10
    )
    assert [c.message.content for c in completion.choices] == ["one", "abcdefghij"]
    assert [c.finish_reason for c in completion.choices] == ["stop", "length"]
    sampling = backend.requests[-1].sampling
    assert (sampling.n, sampling.temperature, sampling.top_p, sampling.seed) == (2, 0.7, 0.9, 11)
    assert sampling.stop == [". t"] and sampling.max_tokens == 10

    client.chat.completions.create(model="m", messages=MESSAGES, max_completion_tokens=5, stop=["x", "y"])
    assert backend.requests[-1].sampling.max_tokens == 5
    assert backend.requests[-1].sampling.stop == ["x", "y"]
    assert len(server.spans(lease)) == 2


def test_completions_endpoint(make_gateway):
    server = make_gateway(ScriptedBackend(["The capital is Paris."]))
    lease = server.lease()
    client = client_for(server, lease)
    completion = client.completions.create(model="m", prompt="Q: capital of France?\nA:", logprobs=0, max_tokens=64)
    assert completion.choices[0].text == "The capital is Paris."
    assert len(completion.choices[0].logprobs.token_logprobs) == completion.usage.completion_tokens
    streamed = list(
        client.completions.create(model="m", prompt="Q: capital of France?\nA:", stream=True, max_tokens=64)
    )
    assert "".join(c.choices[0].text for c in streamed) == completion.choices[0].text
    plain, stream = server.spans(lease)
    assert plain.attributes[Attr.ENDPOINT] == "completions"
    assert ScriptedBackend.decode(plain.attributes[Attr.PROMPT_IDS]) == "Q: capital of France?\nA:"
    assert ScriptedBackend.decode(plain.attributes[Attr.CHOICES][0]["token_ids"]) == "The capital is Paris."
    assert stream.attributes[Attr.CHOICES] == plain.attributes[Attr.CHOICES]


def test_langchain_chat_openai(make_gateway):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    server = make_gateway(ScriptedBackend(["LangChain works."]), token=TOKEN)
    lease = server.lease()
    llm = ChatOpenAI(model="policy", base_url=server.base_url(lease), api_key=TOKEN, max_retries=0)
    assert llm.invoke([HumanMessage("hello")]).content == "LangChain works."
    assert "".join(chunk.content for chunk in llm.stream([HumanMessage("hello")])) == "LangChain works."
    spans = server.spans(lease)
    assert [s.attributes[Attr.STREAM] for s in spans] == [False, True]


def test_unrouted_calls_are_served_not_recorded(make_gateway):
    server = make_gateway(ScriptedBackend(["unrecorded"]))
    lease = server.lease()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "unrecorded"
    assert [m.id for m in client.models.list()] == ["scripted-fake"]
    assert server.spans(lease) == []
    assert server.app.state.recorder.written == 0


def test_models_and_health(make_gateway):
    server = make_gateway(token=TOKEN)
    lease = server.lease()
    assert [m.id for m in client_for(server, lease).models.list()] == ["scripted-fake"]
    health = httpx.get(server.url + "/health")  # no token needed
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_auth(make_gateway):
    server = make_gateway(token=TOKEN)
    lease = server.lease()
    with pytest.raises(openai.AuthenticationError) as wrong:
        client_for(server, lease, api_key="wrong").chat.completions.create(model="m", messages=MESSAGES)
    assert wrong.value.status_code == 401
    assert wrong.value.body["code"] == "invalid_api_key"
    missing = httpx.post(server.base_url(lease) + "/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    # no call reached the model; the attempt is marked once as having had its key refused (nothing of the key)
    (mark,) = server.spans(lease)
    assert mark.name == Attr.SPAN_KEY_REFUSED and mark.attributes == {Attr.REFUSED_STATUS: 401}
    assert mark.status.message == "Invalid bearer token." and "wrong" not in str(mark)


def test_unknown_rollout_or_attempt_is_404(make_gateway):
    server = make_gateway()
    lease = server.lease()
    url = f"{server.url}/rollouts/ro-nope/attempts/{lease.attempt.attempt_id}/v1"
    with pytest.raises(openai.NotFoundError) as unknown_rollout:
        openai.OpenAI(base_url=url, api_key="x", max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert unknown_rollout.value.body["param"] == "rollout_id"
    url = f"{server.url}/rollouts/{lease.rollout.rollout_id}/attempts/at-nope/v1"
    with pytest.raises(openai.NotFoundError) as unknown_attempt:
        openai.OpenAI(base_url=url, api_key="x", max_retries=0).chat.completions.create(model="m", messages=MESSAGES)
    assert unknown_attempt.value.body["param"] == "attempt_id"
    assert httpx.get(f"{server.url}/no/such/path").status_code == 404


def test_ended_attempt_is_still_recorded(make_gateway):
    from lightrail.types import AttemptStatus

    server = make_gateway()
    lease = server.lease()
    server.call(server.store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0))
    client_for(server, lease).chat.completions.create(model="m", messages=MESSAGES)
    assert len(server.spans(lease)) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES}, "model"),
        ({"model": 3, "messages": MESSAGES}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": MESSAGES, "n": 0}, "n"),
        ({"model": "m", "messages": MESSAGES, "n": "2"}, "n"),
        ({"model": "m", "messages": MESSAGES, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": MESSAGES, "top_p": 0}, "top_p"),
        ({"model": "m", "messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": MESSAGES, "stop": [1]}, "stop[0]"),
        ({"model": "m", "messages": MESSAGES, "seed": 1.5}, "seed"),
        ({"model": "m", "messages": MESSAGES, "stream": "yes"}, "stream"),
        ({"model": "m", "messages": MESSAGES, "top_logprobs": 3}, "top_logprobs"),
        ({"model": "m", "messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty"),
        # a backend that cannot honour an option refuses it by name (the scripted fake has no model to penalise)
        ({"model": "m", "messages": MESSAGES, "logit_bias": {"42": 5}}, "logit_bias"),
        ({"model": "m", "messages": MESSAGES, "logit_bias": {"the": 5}}, "logit_bias"),
        ({"model": "m", "messages": MESSAGES, "presence_penalty": 2.5}, "presence_penalty"),
        ({"model": "m", "messages": MESSAGES, "response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"model": "m", "messages": MESSAGES, "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
        ),
        (
            {
                "model": "m",
                "messages": MESSAGES,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a b"}},
            },
            "response_format.json_schema.name",
        ),
        (
            {
                "model": "m",
                "messages": MESSAGES,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            },
            "response_format.json_schema.schema",
        ),
        # the scripted reply is not JSON: the fake refuses rather than break the contract an engine keeps
        ({"model": "m", "messages": MESSAGES, "response_format": {"type": "json_object"}}, "response_format"),
        # fields OpenAI does not know are refused as OpenAI refuses them; ones no backend here honours, by name
        ({"model": "m", "messages": MESSAGES, "top_k": 5}, "top_k"),
        ({"model": "m", "messages": MESSAGES, "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"model": "m", "messages": MESSAGES, "modalities": ["text", "audio"]}, "modalities"),
        ({"model": "m", "messages": MESSAGES, "reasoning_effort": "high"}, "reasoning_effort"),
        ({"model": "m", "messages": MESSAGES, "functions": [{"name": "f"}]}, "functions"),
        ({"model": "m", "messages": MESSAGES, "metadata": {"k": 1}}, "metadata"),
        ({"model": "m", "messages": MESSAGES, "tools": [{"type": "function"}]}, "tools[0].function.name"),
        ({"model": "m", "messages": MESSAGES, "tool_choice": "sometimes"}, "tool_choice"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ],
)
def test_invalid_chat_requests_name_the_field(make_gateway, body, param):
    server = make_gateway()
    lease = server.lease()
    response = httpx.post(server.base_url(lease) + "/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert param.split("[")[0].split(".")[0] in error["message"]
    [span] = server.spans(lease)  # refused calls are recorded too, as errors
    assert span.status.code is StatusCode.ERROR and span.status.message == error["message"]
    assert span.attributes[Attr.TOKEN_IDS_AVAILABLE] is False


def test_malformed_json_and_non_object(make_gateway):
    server = make_gateway()
    lease = server.lease()
    url = server.base_url(lease) + "/chat/completions"
    bad = httpx.post(url, content=b'{"model": "m", "messages": [', headers={"content-type": "application/json"})
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    array = httpx.post(url, json=[1, 2])
    assert array.status_code == 400 and array.json()["error"]["message"] == "The request body must be a JSON object."


def test_invalid_completions_request(make_gateway):
    server = make_gateway()
    lease = server.lease()
    client = client_for(server, lease)
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="m", prompt="x", echo=True)
    assert exc.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model="m", prompt=[1, 2, 3])
    assert exc.value.body["param"].startswith("prompt")


def test_oversized_body_is_413(make_gateway):
    server = make_gateway(max_body_bytes=10_000)
    lease = server.lease()
    big = [{"role": "user", "content": "x" * 20_000}]
    with pytest.raises(openai.APIStatusError) as exc:
        client_for(server, lease).chat.completions.create(model="m", messages=big)
    assert exc.value.status_code == 413
    assert exc.value.body["code"] == "request_too_large"

    def chunked():  # no content-length: the limit is enforced while reading
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"x" * 1000
        yield b'"}]}'

    response = httpx.post(server.base_url(lease) + "/chat/completions", content=chunked())
    assert response.status_code == 413


def test_backend_error_is_an_openai_bad_request(make_gateway):
    refusal = BackendError("prompt is 9000 tokens, the context is 2048", status=400, param="messages", code="ctx")
    server = make_gateway(ScriptedBackend([refusal]))
    lease = server.lease()
    with pytest.raises(openai.BadRequestError) as exc:
        client_for(server, lease).chat.completions.create(model="m", messages=MESSAGES)
    assert exc.value.body == {
        "message": "prompt is 9000 tokens, the context is 2048",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "ctx",
    }
    [span] = server.spans(lease)
    assert span.status.code is StatusCode.ERROR and "9000 tokens" in span.status.message


def test_backend_crash_is_500_and_recorded(make_gateway):
    def explode(request):
        raise RuntimeError("boom")

    server = make_gateway(ScriptedBackend(explode))
    lease = server.lease()
    with pytest.raises(openai.InternalServerError):
        client_for(server, lease).chat.completions.create(model="m", messages=MESSAGES)
    [span] = server.spans(lease)
    assert span.status.code is StatusCode.ERROR and "boom" in span.status.message
