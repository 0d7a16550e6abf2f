"""Structured outputs in the embedded engine: json_object / json_schema / forced tool calls, with the real tiny
random model (it never writes JSON by itself, so every valid output is the grammar's doing)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from lightrail.engine import Engine
from lightrail.engine.constraints import Constraint, build_grammar, grammars_for
from lightrail.types import BackendError, ChatRequest, SamplingParams

USER = [{"role": "user", "content": "Answer in JSON."}]

ADDRESS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "zip": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
    },
    "required": ["city", "zip"],
    "additionalProperties": False,
}
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "address": {"$ref": "#/$defs/Address"},
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
        "$defs": {"Address": ADDRESS},
    },
    "enum_array": {
        "type": "object",
        "properties": {
            "priority": {"enum": ["low", "medium", "high"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "done": {"type": "boolean"},
        },
        "required": ["priority", "tags", "done"],
        "additionalProperties": False,
    },
    "anyof_null": {
        "type": "object",
        "properties": {
            "score": {"anyOf": [{"type": "number", "minimum": -10, "maximum": 10}, {"type": "null"}]},
            "note": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}]},
        },
        "required": ["score", "note"],
        "additionalProperties": False,
    },
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": -99, "maximum": 99},
                    "b": {"type": "integer", "minimum": -99, "maximum": 99},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Lima"]}, "units": {"enum": ["c", "f"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def chat(n: int = 1, seed: int = 0, max_tokens: int = 200, temperature: float = 1.0, **kwargs) -> ChatRequest:
    sampling = SamplingParams(n=n, seed=seed, max_tokens=max_tokens, temperature=temperature)
    return ChatRequest(model="tiny", messages=kwargs.pop("messages", USER), sampling=sampling, **kwargs)


@pytest.mark.parametrize("name", list(SCHEMAS))
async def test_json_schema_outputs_all_validate(engine, name):
    schema = SCHEMAS[name]
    gen = await engine.chat(chat(n=16, seed=3, response_format=schema_format(schema)))
    assert gen.logprobs_processed == ["json_schema"]
    assert len(gen.choices) == 16
    for choice in gen.choices:
        assert choice.finish_reason == "stop", choice.text
        assert choice.token_ids[-1] in engine._eos_ids  # the grammar completed, then EOS was forced
        jsonschema.validate(json.loads(choice.text), schema)


async def test_json_object_outputs_parse(engine):
    gen = await engine.chat(chat(n=8, seed=1, max_tokens=300, response_format={"type": "json_object"}))
    assert gen.logprobs_processed == ["json_object"]
    finished = [c for c in gen.choices if c.finish_reason == "stop"]
    assert finished  # the random model rambles inside strings; most samples still close within 300 tokens
    for choice in finished:
        assert isinstance(json.loads(choice.text), dict)
    for choice in gen.choices:
        if choice.finish_reason == "length":  # cut short: a prefix of a JSON object, as OpenAI returns it
            assert choice.text.startswith("{") and len(choice.token_ids) == 300


async def test_max_tokens_cut_is_length(engine):
    gen = await engine.chat(chat(n=2, max_tokens=4, response_format=schema_format(SCHEMAS["nested"])))
    for choice in gen.choices:
        assert choice.finish_reason == "length" and len(choice.token_ids) == 4
        assert '{"name": "'.startswith(choice.text) or choice.text.startswith('{"name": "')


async def test_tool_choice_required_calls_validate(engine):
    gen = await engine.chat(chat(n=8, seed=2, max_tokens=400, tools=TOOLS, tool_choice="required"))
    assert gen.logprobs_processed == ["tool_choice"]
    assert engine.stats["malformed_tool_calls"] == 0
    for choice in gen.choices:
        assert choice.tool_calls, choice.text
        if choice.finish_reason != "length":
            assert choice.finish_reason == "tool_calls" and choice.text == ""
        for call in choice.tool_calls:
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])


async def test_parallel_tool_calls_false_gives_exactly_one_call(engine):
    req = chat(n=8, seed=4, max_tokens=400, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    gen = await engine.chat(req)
    for choice in gen.choices:
        assert choice.finish_reason == "tool_calls" and choice.text == ""
        assert len(choice.tool_calls) == 1
        call = choice.tool_calls[0]
        jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
        raw = engine.decode(choice.token_ids)
        assert raw == f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'


async def test_named_tool_choice(engine):
    choice = {"type": "function", "function": {"name": "lookup"}}
    gen = await engine.chat(chat(n=8, seed=5, max_tokens=400, tools=TOOLS, tool_choice=choice))
    for c in gen.choices:
        assert c.finish_reason == "tool_calls"
        assert [t.name for t in c.tool_calls] == ["lookup"]
        jsonschema.validate(json.loads(c.tool_calls[0].arguments), PARAMS["lookup"])


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (
            {"response_format": schema_format({"type": "object", "properties": {"a": {"type": "no-such"}}})},
            "response_format",
        ),
        (
            {"response_format": schema_format({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}})},
            "response_format",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ],
)
async def test_bad_constraints_are_400s_and_the_engine_keeps_serving(engine, kwargs, param):
    with pytest.raises(BackendError) as info:
        await engine.chat(chat(**kwargs))
    assert info.value.status == 400 and info.value.param == param
    gen = await engine.chat(chat(max_tokens=3))
    assert len(gen.choices[0].token_ids) >= 1


async def test_compiled_grammar_is_cached(engine):
    fmt = schema_format(SCHEMAS["enum_array"])
    await engine.chat(chat(max_tokens=2, response_format=fmt))
    grammars = grammars_for(engine.tokenizer, engine.model.config.vocab_size, engine._eos_ids)
    before = grammars.compiled
    await engine.chat(chat(max_tokens=2, seed=9, response_format=fmt))
    assert grammars.compiled == before


def _replay(engine: Engine, request: ChatRequest, prompt_ids: list[int], token_ids: list[int]):
    """Per generated token: the model's logits (full forward, no cache) and the grammar's allowed-token mask."""
    grammars = grammars_for(engine.tokenizer, engine.model.config.vocab_size, engine._eos_ids)
    grammar = build_grammar(request, engine.chat_format.format.tool, grammars.tags)
    row = Constraint(grammar.kind, grammars, grammars.compile(grammar)).new_row()
    with torch.inference_mode():
        logits = engine.model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1 : -1].float()
    masks = []
    for token in token_ids:
        bitmask = torch.zeros((1, (grammars.vocab_size + 31) // 32), dtype=torch.int32)
        grammars.fill([(0, row)], bitmask)
        bits = ((bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).bool().flatten()
        masks.append(bits[: logits.shape[1]])
        assert row.advance(token)
    return logits, torch.stack(masks)


async def test_logprobs_are_those_of_the_masked_distribution(engine):
    req = chat(n=4, seed=7, response_format=schema_format(SCHEMAS["nested"]))
    gen = await engine.chat(req)
    stricter = 0
    for choice in gen.choices:
        logits, allowed = _replay(engine, req, gen.prompt_ids, choice.token_ids)
        tokens = torch.tensor(choice.token_ids)
        assert allowed[torch.arange(len(tokens)), tokens].all()  # masked-out tokens are never sampled
        masked = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        recorded = torch.tensor(choice.logprobs)
        expected = masked[torch.arange(len(tokens)), tokens]
        # Would fail if the logprobs were taken before masking: those are the (lower) unmasked ones.
        assert torch.allclose(recorded, expected, atol=1e-4), (recorded - expected).abs().max()
        unmasked = torch.log_softmax(logits, dim=-1)[torch.arange(len(tokens)), tokens]
        assert (recorded >= unmasked - 1e-5).all()
        stricter += int((recorded > unmasked + 1e-2).sum())
        assert torch.allclose(masked.exp().sum(-1), torch.ones(len(tokens)), atol=1e-5)
        # Steps where the grammar allows a single token (e.g. EOS at the end) have logprob 0.
        single = allowed.sum(-1) == 1
        assert torch.allclose(recorded[single], torch.zeros(int(single.sum())), atol=1e-5)
    assert stricter > 10


async def test_constrained_and_free_rows_share_a_batch(tiny_model, tiny_tokenizer):
    engine = Engine(tiny_model, tiny_tokenizer, name="tiny", gather_window_s=0.2)
    try:
        free = chat(n=2, seed=11, max_tokens=40)
        constrained = chat(n=2, seed=12, response_format=schema_format(SCHEMAS["enum_array"]))
        g_free, g_cons = await asyncio.gather(engine.chat(free), engine.chat(constrained))
        assert engine.stats["batches"] == 1 and engine.stats["max_rows_in_batch"] == 4
        assert g_free.logprobs_processed == [] and g_cons.logprobs_processed == ["json_schema"]
        for choice in g_cons.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.text), SCHEMAS["enum_array"])
        # The free rows sampled from the untouched model distribution.
        for choice in g_free.choices:
            with torch.inference_mode():
                ids = torch.tensor([g_free.prompt_ids + choice.token_ids])
                logits = tiny_model(ids).logits[0, len(g_free.prompt_ids) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1)[torch.arange(len(choice.token_ids)), torch.tensor(choice.token_ids)]
            assert torch.allclose(torch.tensor(choice.logprobs), logp, atol=1e-4)
        # And they are what the same seed gives alone (the constrained neighbours did not perturb them).
        alone = await engine.chat(free)
        assert [c.token_ids for c in alone.choices] == [c.token_ids for c in g_free.choices]
    finally:
        await engine.close()


async def test_seeded_constrained_sampling_is_deterministic(engine):
    req = chat(n=3, seed=21, tools=TOOLS, tool_choice="required", max_tokens=300)
    a = await engine.chat(req)
    b = await engine.chat(req)
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert [c.logprobs for c in a.choices] == [c.logprobs for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1  # rows of one request still differ


async def test_response_format_with_tools_on_offer_allows_either(engine):
    req = chat(n=8, seed=6, max_tokens=400, tools=TOOLS, response_format=schema_format(SCHEMAS["anyof_null"]))
    gen = await engine.chat(req)
    assert gen.logprobs_processed == ["json_schema"]
    for choice in gen.choices:
        if choice.finish_reason == "tool_calls":
            for call in choice.tool_calls:
                jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
        else:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.text), SCHEMAS["anyof_null"])


def test_unconstrained_requests_build_no_grammar():
    assert build_grammar(chat()) is None
    assert build_grammar(chat(response_format={"type": "text"})) is None
    assert build_grammar(chat(tools=TOOLS, tool_choice="auto")) is None
    assert build_grammar(chat(tools=TOOLS, tool_choice="none")) is None
