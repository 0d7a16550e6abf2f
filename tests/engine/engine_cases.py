"""Shared test data for the engine tests (imported by name: pytest puts this directory on sys.path)."""

from __future__ import annotations

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}

#: (messages, tools, reply the tuned model learns; ends with the tokenizer's EOS)
TUNED_REPLIES = [
    (
        [{"role": "user", "content": "add 1 and 2"}],
        [ADD_TOOL],
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
    ),
    ([{"role": "user", "content": "broken call"}], [ADD_TOOL], "<tool_call>\n{name: add, oops}\n</tool_call>"),
    ([{"role": "user", "content": "say hello"}], None, "Hello there, Tom!"),
]
