"""The OpenAI Responses API on the gateway, driven by the real ``openai`` SDK (sync and async) and the OpenAI
Agents SDK's default model against a real server on 127.0.0.1: text and item inputs, a function-call round trip,
previous_response_id, streaming, text.format, refusals, recorded spans and their chat view, and the embedded
engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from lightrail.adapters import spans_to_messages
from lightrail.adapters.episode import build_episode
from lightrail.adapters.rewards import ToolRewardRule
from lightrail.gateway import ScriptedBackend
from lightrail.gateway.fake import ScriptedReply
from lightrail.gateway.responses_api import CONVERSATIONS
from lightrail.types import Attr

TOKEN = "secret-token"
MODEL = "scripted-fake"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
CHAT_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": WEATHER_TOOL["parameters"],
        "strict": False,
    },
}


def client_for(server, lease=None) -> openai.OpenAI:
    base_url = server.base_url(lease) if lease is not None else f"{server.url}/v1"
    return openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0)


def _weather_script(request):
    """A tool call first; once the tool answered, the weather."""
    if request.messages[-1]["role"] == "tool":
        return f"It is {request.messages[-1]['content']}."
    return ScriptedReply(text="Let me look.", tool_calls=[("get_weather", {"city": "Paris"})])


def test_text_input_instructions_and_sampling_sync_and_async(make_gateway):
    backend = ScriptedBackend(["Hello there!"])
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)  # unrouted /v1/responses: served, not recorded
    response = client.responses.create(
        model=MODEL,
        input="Hi",
        instructions="You are terse.",
        max_output_tokens=64,
        temperature=0.5,
        top_p=0.9,
        store=True,
        metadata={"k": "v"},
        user="u-1",
        truncation="disabled",
        service_tier="auto",
        prompt_cache_key="pk",
        safety_identifier="sid",
        reasoning={"effort": "low"},
        include=["message.output_text.logprobs"],
        parallel_tool_calls=True,
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert response.output_text == "Hello there!"
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.id.startswith("msg_")
    [part] = item.content
    assert part.type == "output_text" and part.annotations == []
    assert [lp.token for lp in part.logprobs] == [f"token_id:{t}" for t in ScriptedBackend.encode("Hello there!")]
    assert response.usage.output_tokens == len(b"Hello there!")
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert (response.instructions, response.temperature, response.top_p) == ("You are terse.", 0.5, 0.9)
    assert (response.max_output_tokens, response.metadata, response.user) == (64, {"k": "v"}, "u-1")
    request = backend.requests[-1]
    assert request.messages == [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    s = request.sampling
    assert (s.n, s.temperature, s.top_p, s.max_tokens) == (1, 0.5, 0.9, 64)
    assert request.tools is None and request.response_format is None
    assert server.spans(server.lease()) == []

    async def go():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0) as aclient:
            return await aclient.responses.create(model=MODEL, input="Hi again")

    answer = asyncio.run(go())
    assert answer.output_text == "Hello there!" and answer.output[0].content[0].logprobs is None
    assert backend.requests[-1].messages == [{"role": "user", "content": "Hi again"}]
    assert backend.requests[-1].sampling.max_tokens is None


def test_items_function_call_round_trip_chat_view_and_adapters(make_gateway):
    backend = ScriptedBackend(_weather_script, policy_version=3)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}],
        },
    ]
    first = client.responses.create(model=MODEL, input=items, tools=[WEATHER_TOOL], tool_choice="auto")
    assert [o.type for o in first.output] == ["message", "function_call"]
    assert first.output_text == "Let me look."
    call = first.output[1]
    assert (call.name, json.loads(call.arguments), call.status) == ("get_weather", {"city": "Paris"}, "completed")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert backend.requests[-1].tools == [CHAT_WEATHER_TOOL] and backend.requests[-1].tool_choice == "auto"

    # the agent replays the whole output (as the Agents SDK does) plus the tool's result; a reasoning item is dropped
    replay = [
        *items,
        *(o.model_dump(exclude_none=True) for o in first.output),
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": call.call_id, "output": "21C"},
    ]
    second = client.responses.create(model=MODEL, input=replay, tools=[WEATHER_TOOL])
    assert second.output_text == "It is 21C." and [o.type for o in second.output] == ["message"]
    assistant = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}
        ],
    }
    expected = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        assistant,
        {"role": "tool", "tool_call_id": call.call_id, "content": "21C"},
    ]
    assert backend.requests[-1].messages == expected

    first_span, second_span = server.spans(lease)
    for span, response in ((first_span, first), (second_span, second)):
        attributes = span.attributes
        assert attributes[Attr.ENDPOINT] == "responses"
        assert attributes[Attr.RESPONSE_ID] == response.id
        assert attributes[Attr.RESPONSE]["id"] == response.id
        assert attributes[Attr.RESPONSE]["object"] == "chat.completion"
        assert attributes[Attr.DIALECT_RESPONSE]["id"] == response.id
        assert attributes[Attr.POLICY_VERSION] == 3
    assert first_span.attributes[Attr.RESPONSE]["choices"][0]["message"] == assistant
    assert first_span.attributes[Attr.REQUEST]["tools"] == [CHAT_WEATHER_TOOL]
    assert second_span.attributes[Attr.REQUEST]["messages"] == expected
    assert second_span.attributes[Attr.DIALECT_REQUEST]["input"][-1]["type"] == "function_call_output"

    samples = spans_to_messages([first_span, second_span])
    assert [s.turn for s in samples] == [0, 1]
    assert samples[1].messages[:-1] == expected
    assert samples[1].messages[-1] == {"role": "assistant", "content": "It is 21C."}
    episode = build_episode([second_span, first_span], tool_rewards_rule=ToolRewardRule(success=0.5, error=-1.0))
    [reward] = episode.intermediate
    assert (reward.value, reward.response_id, reward.source) == (0.5, first.id, "tool")

    # a tool output for a call nobody made is refused, as OpenAI does
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model=MODEL, input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]
        )
    assert info.value.body["param"] == "input[0].call_id" and "call_nope" in info.value.body["message"]


def test_previous_response_id_continues_the_conversation(make_gateway):
    backend = ScriptedBackend(_weather_script)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)
    first = client.responses.create(
        model=MODEL, input="Weather in Paris?", instructions="Rule one.", tools=[WEATHER_TOOL]
    )
    call = first.output[1]
    # instructions are not carried over; the conversation (input and answer) is
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        instructions="Rule two.",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "It is sunny." and second.previous_response_id == first.id
    history = [
        {"role": "system", "content": "Rule two."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]
    assert backend.requests[-1].messages == history
    third = client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks!", store=False)
    assert backend.requests[-1].messages == [
        *history[1:],
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks!"},
    ]
    # the chat view records the whole conversation
    spans = server.spans(lease)
    assert spans[2].attributes[Attr.REQUEST]["messages"] == backend.requests[-1].messages
    assert spans[2].attributes[Attr.DIALECT_REQUEST]["previous_response_id"] == second.id

    # an unstored response cannot be continued, nor can an unknown one
    for unknown in (third.id, "resp_0000"):
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, previous_response_id=unknown, input="more")
        assert info.value.body["param"] == "previous_response_id"
        assert info.value.body["code"] == "previous_response_not_found"
        assert unknown in info.value.body["message"]
    assert CONVERSATIONS.get(first.id) is not None


def _normalized(response) -> dict:
    data = response.model_dump()
    for key in ("id", "created_at", "completed_at"):
        data.pop(key)
    for item in data["output"]:
        item.pop("id")
        item.pop("parsed_arguments", None)  # the stream helper's parsed views (ParsedResponse)
        for part in item.get("content") or ():
            part.pop("parsed", None)
        if item["type"] == "function_call":
            item.pop("call_id")
    return data


@pytest.mark.parametrize(
    "reply",
    [
        "A fairly long answer, to be cut into several deltas of a few characters each.",
        ScriptedReply(
            text="Checking both.", tool_calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
        ),
        ScriptedReply(tool_calls=[("get_weather", {"city": "Rome"})]),
        "",
    ],
)
def test_streaming_assembles_the_non_streamed_response(make_gateway, reply):
    backend = ScriptedBackend([reply])
    server = make_gateway(backend, token=TOKEN, stream_chunk_chars=5)
    lease = server.lease()
    client = client_for(server, lease)
    params = {"model": MODEL, "input": "go", "tools": [WEATHER_TOOL], "include": ["message.output_text.logprobs"]}
    plain = client.responses.create(**params)
    with client.responses.stream(**params) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert _normalized(streamed) == _normalized(plain)
    assert streamed.output_text == plain.output_text
    raw = list(client.responses.create(**params, stream=True))
    assert [e.sequence_number for e in raw] == list(range(len(raw)))
    kinds = [e.type for e in raw]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert _normalized(raw[-1].response) == _normalized(plain)
    if plain.output_text:
        deltas = [e for e in raw if e.type == "response.output_text.delta"]
        assert len(deltas) > 1 and "".join(d.delta for d in deltas) == plain.output_text
        message_logprobs = plain.output[0].content[0].logprobs
        assert [lp.logprob for d in deltas for lp in d.logprobs] == [lp.logprob for lp in message_logprobs]
    for call in (o for o in plain.output if o.type == "function_call"):
        assert call.arguments in {e.arguments for e in raw if e.type == "response.function_call_arguments.done"}
    assert {e.type for e in events} >= {"response.created", "response.completed", "response.output_item.done"}

    # the SSE wire format: an `event:` line naming each event's type, no [DONE]
    with httpx.stream(
        "POST",
        f"{server.base_url(lease)}/responses",
        json={**params, "stream": True},
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as http:
        assert http.headers["content-type"].startswith("text/event-stream")
        blocks = [b for b in http.read().decode().split("\n\n") if b]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.removeprefix("event: ") == json.loads(data_line.removeprefix("data: "))["type"]

    # streamed or not, every call records the same ids
    spans = server.spans(lease)
    assert len(spans) == 4
    assert all(s.attributes[Attr.CHOICES] == spans[0].attributes[Attr.CHOICES] for s in spans)
    assert [s.attributes[Attr.STREAM] for s in spans] == [False, True, True, True]


def test_max_output_tokens_is_incomplete_streamed_or_not(make_gateway):
    backend = ScriptedBackend(["This answer is much longer than eight tokens."])
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)
    plain = client.responses.create(model=MODEL, input="go", max_output_tokens=8)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert plain.output_text == "This ans" and plain.output[0].status == "incomplete"
    raw = list(client.responses.create(model=MODEL, input="go", max_output_tokens=8, stream=True))
    assert raw[-1].type == "response.incomplete"
    assert _normalized(raw[-1].response) == _normalized(plain)


def test_text_format_reaches_the_backend(make_gateway):
    backend = ScriptedBackend(['{"city": "Paris", "celsius": 21}'])
    server = make_gateway(backend, token=TOKEN)
    client = client_for(server)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
        "required": ["city", "celsius"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}
    response = client.responses.create(model=MODEL, input="Weather?", text={"format": fmt, "verbosity": "low"})
    assert backend.requests[-1].response_format == {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema, "strict": True},
    }
    assert response.text.format.type == "json_schema" and response.text.format.name == "weather"

    class Weather(BaseModel):
        city: str
        celsius: int

    parsed = client.responses.parse(model=MODEL, input="Weather?", text_format=Weather)
    assert parsed.output_parsed == Weather(city="Paris", celsius=21)
    assert backend.requests[-1].response_format["json_schema"]["name"] == "Weather"

    client.responses.create(model=MODEL, input="Any JSON", text={"format": {"type": "json_object"}})
    assert backend.requests[-1].response_format == {"type": "json_object"}
    client.responses.create(model=MODEL, input="Free text", text={"format": {"type": "text"}})
    assert backend.requests[-1].response_format is None

    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", text={"format": {"type": "json_schema", "schema": schema}})
    assert info.value.body["param"] == "text.format.name"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"frobnicate": 1}, "frobnicate"),
        ({"seed": 7}, "seed"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 3.0}, "temperature"),
        ({"input": [{"type": "computer_call", "id": "c"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"tools": [WEATHER_TOOL, {"type": "web_search"}]}, "tools[1].type"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"background": True}, "background"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_refusals_name_the_field(make_gateway, extra, named):
    backend = ScriptedBackend(["never"])
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    body = {"model": MODEL, "input": "Hi", **extra}
    response = httpx.post(
        f"{server.base_url(lease)}/responses", json=body, headers={"authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == named and error["type"] == "invalid_request_error"
    assert f"'{named}'" in error["message"]
    if extra.get("frobnicate") or extra.get("seed"):
        assert error["code"] == "unknown_parameter" and error["message"] == f"Unknown parameter: '{named}'."
    assert backend.requests == []
    [span] = server.spans(lease)  # refused calls are recorded too, as errors
    assert span.attributes[Attr.ENDPOINT] == "responses" and span.status.code == "error"
    with pytest.raises(openai.BadRequestError):  # the SDK surfaces it as a 400
        client_for(server).responses.create(model=MODEL, input="Hi", extra_body=extra)


def test_routed_span_records_ids_logprobs_and_the_chat_view(make_gateway):
    backend = ScriptedBackend(["Paris."], policy_version=7)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    client = client_for(server, lease)
    response = client.responses.create(
        model=MODEL, input="Capital of France?", instructions="Be brief.", top_logprobs=2
    )
    [span] = server.spans(lease)
    attributes = span.attributes
    [choice] = attributes[Attr.CHOICES]
    assert ScriptedBackend.decode(choice["token_ids"]) == response.output_text == "Paris."
    assert len(choice["logprobs"]) == len(choice["token_ids"]) == response.usage.output_tokens
    assert len(attributes[Attr.PROMPT_IDS]) == response.usage.input_tokens
    assert attributes[Attr.TOKEN_IDS_AVAILABLE] is True
    assert attributes[Attr.POLICY_VERSION] == 7
    assert attributes[Attr.RESPONSE_ID] == response.id
    assert attributes[Attr.MODEL] == MODEL and attributes[Attr.STREAM] is False
    assert backend.requests[-1].sampling.top_logprobs == 2
    chat = attributes[Attr.REQUEST]
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
    ]
    assert (chat["model"], chat["temperature"], chat["top_p"], chat["top_logprobs"]) == (MODEL, 1.0, 1.0, 2)
    assert attributes[Attr.RESPONSE]["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert attributes[Attr.RESPONSE]["usage"]["completion_tokens"] == response.usage.output_tokens
    assert attributes[Attr.DIALECT_REQUEST]["instructions"] == "Be brief."
    assert attributes[Attr.DIALECT_RESPONSE]["output"][0]["content"][0]["text"] == "Paris."
    [sample] = spans_to_messages([span])
    assert sample.messages[-1] == {"role": "assistant", "content": "Paris."}


# -- the OpenAI Agents SDK's default model (OpenAIResponsesModel) -------------------------------------------------


class Weather(BaseModel):
    city: str
    celsius: int


class Verdict(BaseModel):
    ok: bool


@pytest.fixture
def agents_sdk():
    """The Agents SDK with tracing off; its default client restored afterwards."""
    agents = pytest.importorskip("agents")
    from agents.models import _openai_shared

    previous = _openai_shared.get_default_openai_client()
    agents.set_tracing_disabled(True)
    yield agents
    _openai_shared.set_default_openai_client(previous)
    agents.set_tracing_disabled(False)  # a global flag: later tests see the SDK's default


def test_agents_sdk_default_model_with_a_tool_and_an_output_type(make_gateway, agents_sdk):
    agents = agents_sdk

    def script(request):
        if request.messages[-1]["role"] == "tool":
            return json.dumps({"city": "Paris", "celsius": int(request.messages[-1]["content"])})
        return ScriptedReply(tool_calls=[("get_weather", {"city": "Paris"})])

    backend = ScriptedBackend(script, policy_version=2)
    server = make_gateway(backend, token=TOKEN)
    lease = server.lease()
    looked_up: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current temperature in a city, in Celsius."""
        looked_up.append(city)
        return "21"

    agent = agents.Agent(
        name="forecaster", instructions="Look it up.", tools=[get_weather], output_type=Weather, model="policy"
    )

    async def run():
        client = openai.AsyncOpenAI(base_url=server.base_url(lease), api_key=TOKEN, max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        result = await agents.Runner.run(agent, "Weather in Paris?")
        streamed = agents.Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in streamed.stream_events():
            pass
        return result, streamed

    result, streamed = asyncio.run(run())
    assert result.final_output == streamed.final_output == Weather(city="Paris", celsius=21)
    assert looked_up == ["Paris", "Paris"]
    spans = server.spans(lease)
    assert [s.attributes[Attr.STREAM] for s in spans] == [False, False, True, True]
    for span in spans:
        attributes = span.attributes
        assert attributes[Attr.ENDPOINT] == "responses" and attributes[Attr.TOKEN_IDS_AVAILABLE] is True
        assert attributes[Attr.POLICY_VERSION] == 2 and attributes[Attr.RESPONSE_ID].startswith("resp_")
        assert attributes[Attr.REQUEST]["response_format"]["json_schema"]["schema"]["required"] == ["city", "celsius"]
        assert attributes[Attr.REQUEST]["tools"][0]["function"]["name"] == "get_weather"
        assert attributes[Attr.REQUEST]["messages"][0] == {"role": "system", "content": "Look it up."}
    # the second call of each run carries the first call's tool call, linked by id, and the tool's result
    for first, second in ((spans[0], spans[1]), (spans[2], spans[3])):
        [call] = first.attributes[Attr.RESPONSE]["choices"][0]["message"]["tool_calls"]
        assert second.attributes[Attr.REQUEST]["messages"][-2]["tool_calls"] == [call]
        assert second.attributes[Attr.REQUEST]["messages"][-1] == {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": "21",
        }
    samples = spans_to_messages(spans[:2])
    assert [s.turn for s in samples] == [0, 1]
    assert json.loads(samples[1].messages[-1]["content"]) == {"city": "Paris", "celsius": 21}


def test_agents_sdk_on_the_tiny_engine_with_constrained_output(make_gateway, agents_sdk):
    """The random-weight tiny model calls the tool because tool_choice forces it, then answers the output type
    because the engine enforces the schema (the tool is disabled once used, so JSON is the only way out)."""
    pytest.importorskip("torch")
    from lightrail.engine import Engine, prepare_model

    agents = agents_sdk
    engine = Engine.from_pretrained(prepare_model("tiny"))
    server = make_gateway(engine, token=TOKEN)
    try:
        lease = server.lease()
        looked_up: list[str] = []

        @agents.function_tool(is_enabled=lambda ctx, agent: not looked_up)
        def lookup(city: str) -> str:
            """Look a city up."""
            looked_up.append(city)
            return "21C"

        agent = agents.Agent(
            name="judge",
            instructions="Answer.",
            tools=[lookup],
            output_type=Verdict,
            model="tiny",
            model_settings=agents.ModelSettings(temperature=0.0, max_tokens=96, tool_choice="required"),
        )

        async def run():
            client = openai.AsyncOpenAI(base_url=server.base_url(lease), api_key=TOKEN, max_retries=0)
            agents.set_default_openai_client(client, use_for_tracing=False)
            return await agents.Runner.run(agent, "Is Paris warm?", max_turns=3)

        result = asyncio.run(run())
        assert isinstance(result.final_output, Verdict) and len(looked_up) == 1
        first, second = server.spans(lease)
        assert first.attributes[Attr.LOGPROBS_PROCESSED] == ["tool_choice"]
        assert second.attributes[Attr.LOGPROBS_PROCESSED] == ["json_schema"]
        for span in (first, second):
            [choice] = span.attributes[Attr.CHOICES]
            assert span.attributes[Attr.TOKEN_IDS_AVAILABLE] is True
            assert len(choice["logprobs"]) == len(choice["token_ids"])
            assert span.attributes[Attr.POLICY_VERSION] == engine.policy_version
        answer = second.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"]
        assert Verdict.model_validate_json(answer) == result.final_output
        assert answer in engine.decode(second.attributes[Attr.CHOICES][0]["token_ids"])
    finally:
        server.call(engine.close())
