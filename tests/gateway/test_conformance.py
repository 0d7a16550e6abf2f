"""Conformance: what unmodified agents send, through ``lightrail gateway serve`` as they would meet it.

The stack is three real processes started from the command line: a store server, a gateway serving the tiny random
model with the embedded engine (``--model``), and a gateway forwarding to that one (``--upstream``). Every client
below runs against both, on a per-attempt route, and every call it makes must come back in the shape the client
expects and be recorded as a span with the prompt's and the answer's token ids (the training data), whichever API
it spoke: chat completions (sync, async, streamed, ``parse``), the Responses API, Anthropic Messages, the OpenAI
Agents SDK's default model with a tool and an ``output_type``, LangChain's ``with_structured_output`` and
LangGraph's prebuilt ReAct agent.

The tiny model is random: it never writes JSON or a tool call by itself, so structured outputs pass only because
the engine enforces them (and, through the upstream, because the request reached the engine intact).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from lightrail.engine import build_tiny_model
from lightrail.store import SyncStoreClient
from lightrail.types import Attr, RolloutSpec, Task
from tests._frameworks import needs_agents_sdk, needs_langgraph
from tests._served import Served, free_port, served

STORE_TOKEN, ENGINE_TOKEN, UPSTREAM_TOKEN = "store-t0ken", "engine-t0ken", "upstream-t0ken"


class Capital(BaseModel):
    # bounded strings and an enum: a random model fills a free string until max_tokens, and the SDKs refuse to
    # parse a cut answer; the bounds are part of the schema the engine enforces
    country: str = Field(max_length=24)
    capital: str = Field(max_length=24)
    continent: Literal["Africa", "Americas", "Asia", "Europe", "Oceania"]


@dataclass
class Stack:
    store: SyncStoreClient
    gateways: dict[str, Served]
    tokens: dict[str, str]

    def attempt(self, backend: str) -> tuple[str, str, str]:
        """A new running attempt: ``(base_url, rollout_id, attempt_id)`` on the ``backend`` gateway."""
        self.store.enqueue([RolloutSpec(task=Task(input="conformance"))])
        lease = self.store.lease(f"conformance-{backend}")
        assert lease is not None
        rollout_id, attempt_id = lease.rollout.rollout_id, lease.attempt.attempt_id
        root = self.gateways[backend].root
        return f"{root}/rollouts/{rollout_id}/attempts/{attempt_id}/v1", rollout_id, attempt_id

    def calls(self, rollout_id: str, attempt_id: str, n: int) -> list:
        """The attempt's LLM-call spans once ``n`` have arrived (the gateways write them in the background)."""
        for _ in range(200):
            spans = [s for s in self.store.query_spans(rollout_id, attempt_id) if s.name == Attr.SPAN_LLM_CALL]
            if len(spans) >= n:
                return sorted(spans, key=lambda s: s.seq)
            asyncio.run(asyncio.sleep(0.05))
        raise AssertionError(f"expected {n} llm-call spans, found {len(spans)}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("conformance")
    model = build_tiny_model(tmp / "tiny", size="tiny", seed=0)
    lightrail = [sys.executable, "-m", "lightrail"]
    store_port, engine_port, upstream_port = free_port(), free_port(), free_port()
    store_url = f"http://127.0.0.1:{store_port}"
    store_cmd = [*lightrail, "store", "serve", "--db", str(tmp / "store.db"), "--port", str(store_port)]
    common = ["--store", store_url, "--store-token", STORE_TOKEN]
    engine_cmd = [*lightrail, "gateway", "serve", "--model", str(model), "--port", str(engine_port)]
    engine_cmd += [*common, "--token", ENGINE_TOKEN]
    upstream_cmd = [*lightrail, "gateway", "serve", "--upstream", f"http://127.0.0.1:{engine_port}/v1"]
    upstream_cmd += ["--upstream-api-key", ENGINE_TOKEN, "--port", str(upstream_port), *common]
    upstream_cmd += ["--token", UPSTREAM_TOKEN]
    env = {"LIGHTRAIL_TOKEN": STORE_TOKEN}
    with (
        served(store_cmd, store_port, tmp / "store.log", 60, env) as _store,
        served(engine_cmd, engine_port, tmp / "engine.log", 120) as engine,
        served(upstream_cmd, upstream_port, tmp / "upstream.log", 60) as upstream,
    ):
        client = SyncStoreClient(store_url, token=STORE_TOKEN)
        try:
            yield Stack(
                client, {"engine": engine, "upstream": upstream}, {"engine": ENGINE_TOKEN, "upstream": UPSTREAM_TOKEN}
            )
        finally:
            client.close()


BACKENDS = ["engine", "upstream"]


def assert_recorded(span, response_id: str | None = None) -> None:
    """A span a trainer can learn from: prompt ids, answer ids and logprobs, a policy version, the response id."""
    a = span.attributes
    assert span.status.code.value == "ok", span.status
    assert a[Attr.TOKEN_IDS_AVAILABLE] is True
    assert a[Attr.PROMPT_IDS] and all(isinstance(t, int) for t in a[Attr.PROMPT_IDS])
    for choice in a[Attr.CHOICES]:
        assert choice["token_ids"] and len(choice["logprobs"]) == len(choice["token_ids"])
    assert a[Attr.POLICY_VERSION] is not None or a[Attr.ENDPOINT]  # upstream: version unknown to the hop
    assert isinstance(a[Attr.REQUEST].get("messages"), list)  # the chat view adapters read
    if response_id is not None:
        assert a[Attr.RESPONSE_ID] == response_id


# -- OpenAI chat completions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_openai_sync_async_and_streamed_chat(stack, backend):
    import openai

    base_url, rid, aid = stack.attempt(backend)
    messages = [{"role": "user", "content": "Say something."}]
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    plain = client.chat.completions.create(model="policy", messages=messages, max_tokens=8, seed=7)

    async def streamed() -> tuple[str, str]:
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
        stream = await aclient.chat.completions.create(
            model="policy", messages=messages, max_tokens=8, seed=7, stream=True
        )
        text, rid_ = "", ""
        async for chunk in stream:
            rid_ = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        await aclient.close()
        return text, rid_

    text, stream_id = asyncio.run(streamed())
    assert text == plain.choices[0].message.content  # same seed, same tokens, streamed or not
    first, second = stack.calls(rid, aid, 2)
    assert_recorded(first, plain.id)
    assert_recorded(second, stream_id)
    assert first.attributes[Attr.CHOICES][0]["token_ids"] == second.attributes[Attr.CHOICES][0]["token_ids"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_openai_parse_with_a_pydantic_model(stack, backend):
    import openai

    base_url, rid, aid = stack.attempt(backend)
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    completion = client.chat.completions.parse(
        model="policy",
        messages=[{"role": "user", "content": "The capital of France, as JSON."}],
        response_format=Capital,
        max_tokens=200,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Capital)  # validated by the SDK against the schema the engine enforced
    (span,) = stack.calls(rid, aid, 1)
    assert_recorded(span, completion.id)
    assert "json_schema" in span.attributes.get(Attr.LOGPROBS_PROCESSED, [])


# -- Responses API ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_openai_responses_text_stream_and_continuation(stack, backend):
    import openai

    base_url, rid, aid = stack.attempt(backend)
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    first = client.responses.create(
        model="policy", instructions="Be brief.", input="Say something.", max_output_tokens=8
    )
    assert first.id.startswith("resp_") and isinstance(first.output_text, str)
    with client.responses.stream(
        model="policy", input="And again.", previous_response_id=first.id, max_output_tokens=8
    ) as stream:
        events = list(stream)
    # 8 tokens of a random model: usually cut by max_output_tokens, which ends the stream with response.incomplete
    assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
    final = events[-1].response
    assert final.id.startswith("resp_") and final.status == events[-1].type.split(".")[1]
    spans = stack.calls(rid, aid, 2)
    assert_recorded(spans[0], first.id)
    assert_recorded(spans[1], final.id)
    history = spans[1].attributes[Attr.REQUEST]["messages"]
    # the first turn is remembered; its instructions are not (OpenAI: instructions apply to one response only)
    assert [m["role"] for m in history] == ["user", "assistant", "user"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_openai_responses_structured_output(stack, backend):
    import openai

    base_url, rid, aid = stack.attempt(backend)
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    response = client.responses.parse(
        model="policy", input="The capital of France, as JSON.", text_format=Capital, max_output_tokens=200
    )
    assert isinstance(response.output_parsed, Capital)
    (span,) = stack.calls(rid, aid, 1)
    assert_recorded(span, response.id)


def _ids(choice) -> list[int]:
    return [int(entry.token.removeprefix("token_id:")) for entry in choice.logprobs.content]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sampling_options_are_honoured_and_recorded(stack, backend):
    """Every sampling option an agent may set reaches the engine (through the upstream hop too) and changes what is
    sampled; hints are accepted; the span says which processing shaped the recorded logprobs."""
    import openai

    base_url, rid, aid = stack.attempt(backend)
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    messages = [{"role": "user", "content": "Count to ten."}]
    greedy = client.chat.completions.create(
        model="policy", messages=messages, temperature=0, max_completion_tokens=1, logprobs=True, top_logprobs=3
    )
    [first] = greedy.choices[0].logprobs.content
    assert len(first.top_logprobs) == 3  # greedy: the sampled token is the most likely one
    assert first.top_logprobs[0].token == first.token and first.top_logprobs[0].logprob == first.logprob
    assert [t.logprob for t in first.top_logprobs] == sorted((t.logprob for t in first.top_logprobs), reverse=True)
    favourite = int(first.token.removeprefix("token_id:"))

    options = dict(
        model="policy",
        messages=messages,
        n=2,
        seed=11,
        max_completion_tokens=6,
        logprobs=True,
        top_logprobs=2,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        logit_bias={str(favourite): -100},  # banned: never sampled again
        user="user-1",  # hints: accepted
        metadata={"experiment": "conformance"},
    )
    plain = client.chat.completions.create(**options)
    stream = client.chat.completions.create(**options, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    streamed = ["", ""]
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == [c.message.content for c in plain.choices]  # same seed, same tokens, streamed or not
    assert len(plain.choices) == 2
    for choice in plain.choices:
        ids = _ids(choice)
        assert 0 < len(ids) <= 6 and favourite not in ids
        assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
    spans = stack.calls(rid, aid, 3)
    recorded = spans[1].attributes
    assert_recorded(spans[1], plain.id)
    assert [c["token_ids"] for c in recorded[Attr.CHOICES]] == [_ids(c) for c in plain.choices]  # each choice
    assert set(recorded[Attr.LOGPROBS_PROCESSED]) == {"presence_penalty", "frequency_penalty", "logit_bias"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_schema_outputs_of_the_random_model_validate(stack, backend):
    """The random model never writes JSON by itself; with a json_schema response format every answer validates."""
    import jsonschema
    import openai

    base_url, rid, aid = stack.attempt(backend)
    client = openai.OpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "integer", "minimum": 0, "maximum": 99},
            "unit": {"enum": ["m", "km"]},
            "note": {"type": "string", "maxLength": 12},
        },
        "required": ["answer", "unit", "note"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "distance", "schema": schema, "strict": True}}
    free = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "How far?"}], max_tokens=40, seed=1
    )
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)  # unconstrained, the random model writes no JSON
    answers = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "How far?"}], response_format=fmt, n=4, max_tokens=80
    )
    for choice in answers.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)
    bad = {"type": "json_schema", "json_schema": {"name": "distance", "schema": {"type": "object", "required": 3}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], response_format=bad)
    assert refused.value.body["param"] == "response_format.json_schema.schema"


# -- Anthropic Messages ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_anthropic_messages_and_stream(stack, backend):
    anthropic = pytest.importorskip("anthropic", reason="the anthropic client is part of the dev extra")

    base_url, rid, aid = stack.attempt(backend)
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=stack.tokens[backend], max_retries=0)
    message = client.messages.create(
        model="policy",
        max_tokens=8,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say something."}],
    )
    assert message.id.startswith("msg_") and message.content[0].type == "text"
    with client.messages.stream(
        model="policy", max_tokens=8, messages=[{"role": "user", "content": "Again."}]
    ) as stream:
        streamed = stream.get_final_message()
    spans = stack.calls(rid, aid, 2)
    assert_recorded(spans[0], message.id)
    assert_recorded(spans[1], streamed.id)
    assert spans[0].attributes[Attr.ENDPOINT] == "messages"


# -- frameworks ------------------------------------------------------------------------------------------------------


@needs_agents_sdk
@pytest.mark.parametrize("backend", BACKENDS)
def test_agents_sdk_default_model_with_a_tool_and_an_output_type(stack, backend):
    import openai
    from agents import Agent, ModelSettings, RunConfig, Runner, function_tool, set_default_openai_client

    base_url, rid, aid = stack.attempt(backend)
    looked_up: list[str] = []

    # the tool withdraws itself once used, so the random model's second turn must be the output type (left a
    # choice, a random model may call the tool again and again)
    @function_tool(is_enabled=lambda ctx, agent: not looked_up)
    def lookup_capital(country: Literal["France", "Germany", "Italy"]) -> str:  # bounded, like Capital
        """The capital of a country."""
        looked_up.append(country)
        return "Paris"

    agent = Agent(
        name="geographer",
        model="policy",  # a model name, as users write it: the SDK's default model class (Responses API) serves it
        instructions="Look the capital up, then answer.",
        tools=[lookup_capital],
        output_type=Capital,
        # tool_choice required on the first turn: the random model then calls the tool for sure (the SDK resets it
        # after a tool call so the second turn answers with the output type); one call per turn, else a random
        # model may go on calling until max_tokens
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0.0
        ),
        reset_tool_choice=True,
    )
    client = openai.AsyncOpenAI(base_url=base_url, api_key=stack.tokens[backend], max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    config = RunConfig(tracing_disabled=True)
    result = asyncio.run(Runner.run(agent, "The capital of France?", run_config=config, max_turns=4))
    assert isinstance(result.final_output, Capital)
    assert looked_up, "the agent never called its tool"
    spans = stack.calls(rid, aid, 2)
    assert all(s.attributes[Attr.ENDPOINT] == "responses" for s in spans)
    for span in spans:
        assert_recorded(span)


@needs_langgraph
@pytest.mark.parametrize("backend", BACKENDS)
def test_langchain_with_structured_output(stack, backend):
    from langchain_openai import ChatOpenAI

    base_url, rid, aid = stack.attempt(backend)
    llm = ChatOpenAI(model="policy", base_url=base_url, api_key=stack.tokens[backend], max_retries=0, max_tokens=200)
    answer = llm.with_structured_output(Capital).invoke("The capital of France, as JSON.")
    assert isinstance(answer, Capital)
    (span,) = stack.calls(rid, aid, 1)
    assert_recorded(span)


@needs_langgraph
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # still LangGraph's prebuilt agent in 1.x
@pytest.mark.parametrize("backend", BACKENDS)
def test_langgraph_prebuilt_react_agent(stack, backend):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    base_url, rid, aid = stack.attempt(backend)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    llm = ChatOpenAI(model="policy", base_url=base_url, api_key=stack.tokens[backend], max_retries=0, max_tokens=64)
    agent = create_react_agent(llm, [add])
    state = agent.invoke({"messages": [("user", "What is 2 + 3?")]}, {"recursion_limit": 6})
    assert state["messages"][-1].type == "ai"
    spans = stack.calls(rid, aid, 1)
    for span in spans:
        assert_recorded(span)
        assert span.attributes[Attr.REQUEST]["tools"][0]["function"]["name"] == "add"


def test_every_api_answers_its_token_and_refuses_a_wrong_one(stack):
    import httpx

    base_url, _, _ = stack.attempt("engine")
    for path, body in [
        ("/chat/completions", {"model": "p", "messages": [{"role": "user", "content": "x"}]}),
        ("/responses", {"model": "p", "input": "x"}),
        ("/messages", {"model": "p", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}),
    ]:
        r = httpx.post(base_url + path, json=body, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401, (path, r.text)
        assert json.loads(r.text)
        ok = httpx.post(base_url + path, json=body, headers={"authorization": f"Bearer {ENGINE_TOKEN}"}, timeout=60)
        assert ok.status_code == 200, (path, ok.text)  # the route exists and answers the right token
