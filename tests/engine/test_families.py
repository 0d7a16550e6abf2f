"""Each model family's real chat template and special tokens, end to end through the embedded engine and gateway.

For every family (`families.FAMILIES`: Qwen2.5, Qwen3, Llama 3.2 JSON, Mistral v0.3, Llama 3.2 pythonic): the tools are
rendered by the family's own template, a forced call is generated in the family's markup by a random model, parsed
back, reaches the agent as an OpenAI tool call (streamed and not), is fed back with its result in the family's
format, and an SFT target written for it tokenizes to what the model generated and parses to the same call.
"""

from __future__ import annotations

import json

import openai
import pytest
from families import FAMILIES, build_family_model, overfit

from lightrail.engine import Engine
from lightrail.engine.chat import ChatFormat
from lightrail.engine.formats import UnknownFormatError, formats_of
from lightrail.gateway import GatewayServer
from lightrail.store import MemoryStore
from lightrail.types import RolloutSpec, Task

pytestmark = pytest.mark.timeout(300)

# Enums and booleans: a random model's forced arguments are then short and always complete.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "metric": {"type": "boolean"}},
            "required": ["city", "metric"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, NOW]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request, tmp_path_factory):
    family = FAMILIES[request.param]
    return family, build_family_model(family, tmp_path_factory.mktemp("families") / family.name)


@pytest.fixture
async def served(family_dir):
    """The family's model in an engine behind a real gateway; yields (family, engine, routed OpenAI client)."""
    family, path = family_dir
    engine = Engine.from_pretrained(path)
    store = MemoryStore()
    await store.enqueue([RolloutSpec(task=Task(input="q"))])
    lease = await store.lease("worker-1")
    async with GatewayServer(engine, store, token="t") as gateway:
        root = gateway.url.removesuffix("/v1")
        base = f"{root}/rollouts/{lease.rollout.rollout_id}/attempts/{lease.attempt.attempt_id}/v1"
        client = openai.AsyncOpenAI(base_url=base, api_key="t", max_retries=0)
        yield family, engine, client
        await client.close()
    await engine.close()


def test_the_family_is_read_from_its_template(family_dir):
    family, path = family_dir
    fmt = formats_of(path)
    assert fmt.tool.name == family.tool_format
    assert (fmt.reasoning.name if fmt.reasoning else None) == family.reasoning
    assert "--tool-call-parser" in fmt.vllm_args() and family.tool_format in fmt.vllm_args()


async def test_a_forced_call_round_trips_to_the_agent(served):
    family, engine, client = served
    chat = engine.chat_format
    assert chat.native_tools and chat.native_tool_calls and chat.native_tool_results  # the family's own template
    prompt = chat.render(ASK, TOOLS)
    assert "get_weather" in prompt and "The weather in a city" in prompt

    for stream in (False, True):
        kwargs = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 64, "seed": 3}
        kwargs["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
        if stream:
            calls: dict[int, dict] = {}
            async for chunk in await client.chat.completions.create(**kwargs, stream=True):
                for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                    call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                    call["name"] += delta.function.name or "" if delta.function else ""
                    call["arguments"] += delta.function.arguments or "" if delta.function else ""
            (call,) = calls.values()
            name, arguments = call["name"], call["arguments"]
        else:
            reply = await client.chat.completions.create(**kwargs)
            assert reply.choices[0].finish_reason == "tool_calls"
            (tool_call,) = reply.choices[0].message.tool_calls
            name, arguments = tool_call.function.name, tool_call.function.arguments
        assert name == "get_weather"
        args = json.loads(arguments)
        assert set(args) == {"city", "metric"} and args["city"] in ("Paris", "Rome")

    # The result goes back in the family's format, and the call is rendered as the family writes it.
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "21"})
    again = chat.render(history, TOOLS)
    assert family.tool_result_marker in again
    assert chat.format.tool.parse(chat.assistant_text(history[1])).tool_calls[0].name == "get_weather"
    reply = await client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=4)
    assert reply.choices[0].finish_reason in ("length", "stop", "tool_calls")


async def test_the_sft_target_is_what_the_model_writes(served):
    """An assistant turn rendered for SFT tokenizes to the ids the engine generated for the same call."""
    family, engine, _ = served
    from lightrail.types import ChatRequest, SamplingParams

    request = ChatRequest(
        model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        sampling=SamplingParams(temperature=1.0, max_tokens=64, seed=5),
    )  # fmt: skip
    gen = await engine.chat(request)
    (choice,) = gen.choices
    (call,) = choice.tool_calls
    message = {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function",
               "function": {"name": call.name, "arguments": call.arguments}}]}  # fmt: skip
    target = engine.chat_format.assistant_text(message)
    ids = engine.tokenizer(target, add_special_tokens=False).input_ids
    generated = [t for t in choice.token_ids if t not in engine._eos_ids]
    assert engine.decode(ids) == engine.decode(generated)
    parsed = engine.chat_format.format.tool.parse(engine.decode(ids))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(call.name, json.loads(call.arguments))]


async def test_forced_calls_admit_only_what_the_schema_declares(served):
    """Strict by default: a tool without parameters gets ``{}``; ``parallel_tool_calls: false`` one call."""
    family, engine, client = served
    reply = await client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "now"}},
        max_tokens=48, seed=1,
    )  # fmt: skip
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("now", {})
    for seed in range(3):
        reply = await client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_tokens=64, seed=seed,
        )  # fmt: skip
        calls = reply.choices[0].message.tool_calls
        assert len(calls) == 1
        args = json.loads(calls[0].function.arguments)
        assert set(args) <= {"city", "metric"}


def test_an_unknown_tool_markup_is_a_one_line_error_naming_the_formats(tiny_tokenizer):
    tokenizer = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<fn>{{ tools }}</fn>{% endif %}"
    )
    with pytest.raises(UnknownFormatError) as caught:
        ChatFormat(tokenizer)
    message = str(caught.value)
    assert "\n" not in message and "hermes, llama3_json, mistral, pythonic" in message
    assert ChatFormat(tokenizer, tool_format="llama3_json").format.tool.name == "llama3_json"  # named: no guessing
    with pytest.raises(UnknownFormatError, match="unknown tool_format 'gorilla'"):
        ChatFormat(tokenizer, tool_format="gorilla")


REASONED = "<think>\nTwo plus three is five.\n</think>\n\nThe answer is 5."
SUM = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def reasoning_model(tmp_path_factory):
    """The Qwen3 family's random model, overfit for a few seconds to answer `SUM` with `REASONED`."""
    path = build_family_model(FAMILIES["qwen3"], tmp_path_factory.mktemp("qwen3") / "qwen3")
    overfit(path, SUM, None, REASONED)
    return path


async def test_reasoning_comes_back_split_and_stays_in_the_trained_tokens(reasoning_model, tmp_path):
    import anthropic

    from lightrail.store import open_store

    engine = Engine.from_pretrained(reasoning_model)
    store = open_store(str(tmp_path / "store.db"))
    await store.enqueue([RolloutSpec(task=Task(input="q"))])
    lease = await store.lease("worker-1")
    try:
        async with GatewayServer(engine, store, token="t") as gateway:
            root = gateway.url.removesuffix("/v1")
            base = f"{root}/rollouts/{lease.rollout.rollout_id}/attempts/{lease.attempt.attempt_id}"
            async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="t", max_retries=0) as client:
                reply = await client.chat.completions.create(model="m", messages=SUM, temperature=0, max_tokens=40)
                message = reply.choices[0].message
                assert message.content == "The answer is 5."
                assert message.reasoning_content == "Two plus three is five."  # type: ignore[attr-defined]

                chunks = await client.chat.completions.create(
                    model="m", messages=SUM, temperature=0, max_tokens=40, stream=True
                )
                thought, said = "", ""
                async for chunk in chunks:
                    delta = chunk.choices[0].delta if chunk.choices else None
                    thought += getattr(delta, "reasoning_content", None) or "" if delta else ""
                    said += delta.content or "" if delta else ""
                assert (thought, said) == ("Two plus three is five.", "The answer is 5.")

                response = await client.responses.create(model="m", input="What is 2 + 3?", temperature=0)
                kinds = [item.type for item in response.output]
                assert kinds == ["reasoning", "message"] and response.output_text == "The answer is 5."
                assert response.output[0].content[0].text == "Two plus three is five."  # type: ignore[union-attr]

            async with anthropic.AsyncAnthropic(base_url=base, api_key="t", max_retries=0) as claude:
                answer = await claude.messages.create(
                    model="m", max_tokens=40, messages=SUM, extra_body={"temperature": 0}
                )
                assert [b.type for b in answer.content] == ["thinking", "text"]
                assert answer.content[0].thinking == "Two plus three is five."  # type: ignore[union-attr]
        spans = await store.query_spans(lease.rollout.rollout_id, lease.attempt.attempt_id)  # flushed at stop
    finally:
        await engine.close()
        await store.close()
    # The recorded token ids hold the reasoning (it is trained on), and the SFT target of the recorded answer
    # (reasoning_content + content) is those same tokens.
    from lightrail.types import Attr

    chat_span = next(s for s in spans if s.attributes.get(Attr.CHOICES))
    ids = chat_span.attributes[Attr.CHOICES][0]["token_ids"]
    assert "Two plus three is five." in engine.decode(ids)
    target = engine.chat_format.assistant_text(
        {"role": "assistant", "content": "The answer is 5.", "reasoning_content": "Two plus three is five."}
    )
    assert engine.tokenizer(target, add_special_tokens=False).input_ids == [t for t in ids if t not in engine._eos_ids]

    # The dashboard shows the thinking folded above the answer.
    from starlette.testclient import TestClient

    from lightrail.dashboard import create_dashboard_app

    with TestClient(create_dashboard_app(lambda: open_store(str(tmp_path / "store.db")))) as client:
        page = client.get(f"/ui/rollouts/{lease.rollout.rollout_id}").text
    assert '<details class="reasoning"' in page and "Two plus three is five." in page


def test_the_cli_prints_the_family_and_its_vllm_flags(family_dir):
    import subprocess
    import sys

    family, path = family_dir
    out = subprocess.run(
        [sys.executable, "-m", "lightrail", "models", "formats", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"tool calls: {family.tool_format}" in out.stdout
    assert f"--tool-call-parser {family.tool_format}" in out.stdout
