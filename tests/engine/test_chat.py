"""Chat rendering (native template and Hermes fallback) and Hermes tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_cases import ADD_TOOL
from transformers import AutoTokenizer

from lightrail.engine import Engine
from lightrail.engine.chat import ChatFormat, parse_tool_calls
from lightrail.types import BackendError, ChatRequest, SamplingParams

# SmolLM2's template: ChatML turns, no notion of tools.
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "add 1 and 2, then 3 and 4"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "3"},
    {"role": "tool", "tool_call_id": "call_b", "content": "7"},
]

EXPECTED_TAIL = (
    "<|im_start|>user\nadd 1 and 2, then 3 and 4<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_parse_single_call():
    parsed = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert parsed.content == "" and parsed.malformed == 0
    (call,) = parsed.tool_calls
    assert call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
    assert call.id.startswith("call_") and len(call.id) > 10


def test_parse_content_and_several_calls():
    text = 'Let me add.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me add."
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", "{}"), ("b", '{"x": 1}')]
    assert len({c.id for c in parsed.tool_calls}) == 2


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{name: add}</tool_call>",  # not JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["add"]</tool_call>',  # not an object
        '<tool_call>{"name": "add", "arguments": "{oops"}</tool_call>',  # arguments text is not JSON
        '<tool_call>{"name": "add", "arguments": {"a": 1}',  # never closed (cut by max_tokens)
    ],
)
def test_malformed_calls_stay_text_and_are_counted(text):
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [] and parsed.content == text and parsed.malformed == 1


def test_good_and_malformed_calls_together():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{bad}</tool_call>'
    parsed = parse_tool_calls(text)
    assert [c.name for c in parsed.tool_calls] == ["a"]
    assert parsed.content == "<tool_call>{bad}</tool_call>" and parsed.malformed == 1


def test_plain_text_is_untouched():
    parsed = parse_tool_calls("  just text \n")
    assert parsed.content == "  just text \n" and parsed.tool_calls == [] and parsed.malformed == 0


def test_native_template_renders_tools_calls_and_results(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    assert fmt.native_tools and fmt.native_tool_calls and fmt.native_tool_results
    text = fmt.render(CONVERSATION, [ADD_TOOL])
    # The tiny models list tools compactly: a 512-position model cannot spend 200 tokens on a JSON schema.
    assert text.startswith("<|im_start|>system\nBe brief.\n<tools>add(a, b)</tools><|im_end|>\n")
    assert text.endswith(EXPECTED_TAIL)


def test_hermes_fallback_for_a_template_without_tools(tiny_tokenizer):
    plain = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = PLAIN_TEMPLATE
    fmt = ChatFormat(plain)
    assert not (fmt.native_tools or fmt.native_tool_calls or fmt.native_tool_results)
    text = fmt.render(CONVERSATION, [ADD_TOOL])
    # Tools go into the system prompt as a Hermes block; calls and results render as the native template does.
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(ADD_TOOL) in text
    assert text.endswith(EXPECTED_TAIL)
    without_system = fmt.render(CONVERSATION[1:], [ADD_TOOL])
    assert without_system.startswith("<|im_start|>system\n# Tools")


def test_content_parts_are_joined(tiny_tokenizer):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert "<|im_start|>user\nab<|im_end|>" in ChatFormat(tiny_tokenizer).render(msgs)


QWEN25 = (Path(__file__).parent / "templates" / "qwen2.5.jinja").read_text()


async def test_a_message_the_template_drops_is_refused_not_swallowed(tiny_dir, tiny_model):
    # Qwen2.5's template renders system, user, assistant and tool turns and skips any other role: without the
    # check, the developer text would vanish and Qwen's default system prompt take its place, silently
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = QWEN25
    chat = ChatFormat(tokenizer)
    dropped = [{"role": "user", "content": "hi"}, {"role": "developer", "content": "Answer in French."}]
    assert chat.dropped(dropped, chat.render(dropped)) == 1
    kept = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}]
    assert chat.dropped(kept, chat.render(kept)) is None
    engine = Engine(tiny_model, tokenizer, name="qwen-template")
    try:
        with pytest.raises(BackendError) as refused:
            await engine.chat(ChatRequest(model="m", messages=dropped, sampling=SamplingParams(max_tokens=2)))
        assert refused.value.param == "messages[1].role" and "drops this 'developer' message" in refused.value.message
        answered = await engine.chat(ChatRequest(model="m", messages=kept, sampling=SamplingParams(max_tokens=2)))
        assert "Answer in French." in engine.decode(answered.prompt_ids)
    finally:
        await engine.close()
