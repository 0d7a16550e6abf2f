"""The model families' formats as pure functions: parsing, rendering, detection, vLLM flags, closed schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrail.engine.constraints import closed_schema
from lightrail.engine.formats import REASONING_FORMATS, TOOL_FORMATS, UnknownFormatError, detect, model_format

TEMPLATES = Path(__file__).parent / "templates"
CALLS = [{"name": "add", "arguments": {"a": 1, "b": "x y"}}, {"name": "now", "arguments": {}}]


@pytest.mark.parametrize("name", list(TOOL_FORMATS))
def test_rendered_calls_parse_back(name):
    fmt = TOOL_FORMATS[name]
    parsed = fmt.parse(fmt.render(CALLS))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        (c["name"], c["arguments"]) for c in CALLS
    ]
    assert parsed.content == "" and parsed.malformed == 0


@pytest.mark.parametrize(
    ("name", "text", "calls", "content", "malformed"),
    [
        ("hermes", 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', ["f"], "Sure.", 0),
        ("hermes", '<tool_call>{"name": "f", "argu', [], '<tool_call>{"name": "f", "argu', 1),
        (
            "llama3_json",
            '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
            ["f", "g"],
            "",
            0,
        ),
        ("llama3_json", '{"answer": 42}', [], '{"answer": 42}', 0),  # JSON, but not a call: an answer
        ("llama3_json", "The capital is Paris.", [], "The capital is Paris.", 0),
        ("llama3_json", '{"name": "f", "parameters": {"x": ', [], '{"name": "f", "parameters": {"x": ', 1),
        ("mistral", ' [{"name": "f", "arguments": {"x": 1}}]', ["f"], "", 0),  # [TOOL_CALLS] dropped by decoding
        ("mistral", 'ok [TOOL_CALLS] [{"name": "f", "arguments": {}}]', ["f"], "ok", 0),
        ("mistral", "[1, 2] are numbers", [], "[1, 2] are numbers", 0),
        ("pythonic", '[f(x=1, flag=True, y="a"), g()]', ["f", "g"], "", 0),
        ("pythonic", "[f(x=true, y=null)]", ["f"], "", 0),  # JSON literals, as a grammar's %json writes nested values
        ("pythonic", "[1, 2, 3]", [], "[1, 2, 3]", 0),
        ("pythonic", "[f(x=1]", [], "[f(x=1]", 1),
    ],
)
def test_parse(name, text, calls, content, malformed):
    parsed = TOOL_FORMATS[name].parse(text)
    assert [c.name for c in parsed.tool_calls] == calls
    assert parsed.content == content and parsed.malformed == malformed


@pytest.mark.parametrize(
    ("fmt", "text", "reasoning", "rest"),
    [
        ("think", "<think>\nplan\n</think>\n\nanswer", "plan", "answer"),
        ("think", "answer only", None, "answer only"),
        ("think", "<think>\ncut by max_tok", "cut by max_tok", ""),
        ("think_open", "plan\n</think>\n\nanswer", "plan", "answer"),  # the prompt opened <think>
    ],
)
def test_reasoning_split(fmt, text, reasoning, rest):
    assert REASONING_FORMATS[fmt].split(text) == (reasoning, rest)


@pytest.mark.parametrize(
    ("template", "tool", "reasoning", "parsers"),
    [
        ("qwen2.5.jinja", "hermes", None, ["hermes"]),
        ("qwen3.jinja", "hermes", "think", ["hermes", "qwen3"]),
        ("llama3.2.jinja", "llama3_json", None, ["llama3_json"]),
        ("mistral-v0.3.jinja", "mistral", None, ["mistral"]),
        ("llama3.2-pythonic.jinja", "pythonic", None, ["pythonic"]),
    ],
)
def test_detection_and_vllm_flags(template, tool, reasoning, parsers):
    fmt = detect((TEMPLATES / template).read_text())
    assert fmt.tool.name == tool and (fmt.reasoning.name if fmt.reasoning else None) == reasoning
    args = fmt.vllm_args()
    assert args[:3] == ["--enable-auto-tool-choice", "--tool-call-parser", parsers[0]]
    assert args[3:] == (["--reasoning-parser", parsers[1]] if len(parsers) > 1 else [])


def test_a_template_without_tools_speaks_hermes_and_names_win():
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}").tool.name == "hermes"
    r1 = "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"  # DeepSeek-R1 opens the tag itself
    assert detect(r1).reasoning == REASONING_FORMATS["think_open"]
    assert model_format((TEMPLATES / "qwen3.jinja").read_text(), reasoning="none").reasoning is None
    with pytest.raises(UnknownFormatError, match="known formats: think, think_open, none"):
        model_format(None, reasoning="cot")


def test_schemas_are_closed_unless_they_say_otherwise():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}, "c": {"prefixItems": [{}]}},
        "$defs": {"d": {"type": "object"}},
    }
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is False
    open_ = {"type": "object", "additionalProperties": True, "properties": {"x": {"type": "object", "allOf": [{}]}}}
    assert closed_schema(open_) == open_  # an explicit choice, and allOf compositions, are left as they are
