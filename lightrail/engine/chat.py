"""Chat prompts and tool calls: OpenAI messages in, prompt text out; generated text in, `ToolCall`s out.

The tokenizer's own chat template is used whenever it can express what the request contains. Three capabilities
are probed once per tokenizer by rendering sentinel messages: tool definitions (``tools=``), assistant
``tool_calls`` and ``tool``-role results. Whatever the template cannot render is rewritten into Hermes markup
before templating (the format Qwen2.5, Hermes and the self-built tiny models use):

* tool definitions -> a system prompt with a ``<tools>`` JSON block and the instruction to answer with
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* assistant ``tool_calls`` -> ``<tool_call>`` blocks appended to the assistant content;
* ``tool`` messages -> a user turn with one ``<tool_response>`` block per result.

Generated text is parsed back with `parse_tool_calls`. Pure functions and a small stateless class: no locks.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from lightrail.types import ToolCall, content_text

__all__ = ["ChatFormat", "ParsedToolCalls", "hermes_tools_prompt", "normalize_messages", "parse_tool_calls"]

_PROBE_TOOL = "lr_probe_tool_7f3a"
_PROBE_CALL = "lr_probe_call_7f3a"
_PROBE_RESULT = "lr_probe_result_7f3a"

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes-style system-prompt section that lists ``tools`` and says how to call them."""
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``messages`` with string content (templates concatenate strings) and tool-call arguments as
    parsed JSON objects where possible (what chat templates expect; they serialise them with ``tojson``)."""
    out = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError("every message must be an object with a 'role'")
        m = dict(message)
        m["content"] = content_text(m.get("content"))
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                fn = dict(call.get("function") or call)
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    # Unparseable arguments stay as text: the model wrote them, render them back as written.
                    with contextlib.suppress(json.JSONDecodeError):
                        args = json.loads(args) if args.strip() else {}
                calls.append({"id": call.get("id"), "type": "function", "function": {**fn, "arguments": args}})
            m["tool_calls"] = calls
        out.append(m)
    return out


def _render_call(fn: dict[str, Any]) -> str:
    args = fn.get("arguments", {})
    args_json = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {args_json}}}\n</tool_call>'


class ChatFormat:
    """Renders chat requests to prompt text with a tokenizer's chat template, falling back to Hermes markup for
    whatever the template cannot express (see the module docstring). Probes run once, at construction."""

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; use text completions or set tokenizer.chat_template")
        self.tokenizer = tokenizer
        user = {"role": "user", "content": "hi"}
        probe_tool = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}
        call = {"id": "call_0", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {}}}
        assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
        tool = {"role": "tool", "tool_call_id": "call_0", "content": _PROBE_RESULT}
        self.native_tools = _PROBE_TOOL in self._try([user], tools=[probe_tool])
        self.native_tool_calls = _PROBE_CALL in self._try([user, assistant])
        # A generic template echoes any role, so it "renders" tool messages as `<|im_start|>tool ...`, a turn the
        # model never saw. Only a template that knows tools is trusted to know how their results look.
        self.native_tool_results = self.native_tools and _PROBE_RESULT in self._try([user, assistant, tool])

    def _try(self, messages: list[dict[str, Any]], tools: list | None = None) -> str:
        try:
            return self._apply(messages, tools)
        except Exception:  # a template that chokes on a feature does not support it
            return ""

    def _apply(self, messages: list[dict[str, Any]], tools: list | None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """Prompt text for ``messages`` (OpenAI format) offering ``tools``, ending with the assistant turn opener."""
        msgs = normalize_messages(messages)
        if tools and not self.native_tools:
            section = hermes_tools_prompt(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {
                    **msgs[0],
                    "content": f"{msgs[0]['content']}\n\n{section}" if msgs[0]["content"] else section,
                }
            else:
                msgs.insert(0, {"role": "system", "content": section})
        if not self.native_tool_calls:
            for i, m in enumerate(msgs):
                if m["role"] == "assistant" and m.get("tool_calls"):
                    blocks = [_render_call(c["function"]) for c in m["tool_calls"]]
                    text = "\n".join(([m["content"]] if m["content"] else []) + blocks)
                    msgs[i] = {"role": "assistant", "content": text}
        if not self.native_tool_results:
            merged: list[dict[str, Any]] = []
            for m in msgs:
                if m["role"] != "tool":
                    merged.append(m)
                    continue
                block = f"<tool_response>\n{m['content']}\n</tool_response>"
                if merged and merged[-1].get("_tool_results"):
                    merged[-1]["content"] += "\n" + block
                else:
                    merged.append({"role": "user", "content": block, "_tool_results": True})
            msgs = [{k: v for k, v in m.items() if k != "_tool_results"} for m in merged]
        return self._apply(msgs, tools if (tools and self.native_tools) else None)

    def assistant_text(self, message: dict[str, Any]) -> str:
        """The text a model generates for an assistant ``message``: its content, then one Hermes block per tool
        call (what `parse_tool_calls` reads back). Supervised targets are built from it, so a model learns to
        write exactly what the engine parses."""
        (m,) = normalize_messages([message])
        blocks = [_render_call(c["function"]) for c in m.get("tool_calls") or ()]
        return "\n".join(([m["content"]] if m["content"] else []) + blocks)


@dataclass(frozen=True)
class ParsedToolCalls:
    """What `parse_tool_calls` found: the content left outside tool-call blocks, the calls, and how many blocks
    were malformed (bad JSON, no name, or unclosed; those stay in ``content`` as plain text)."""

    content: str
    tool_calls: list[ToolCall]
    malformed: int


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks out of generated text.

    Well-formed blocks become `ToolCall`s (``arguments`` as JSON text) and are removed from the content, which is
    then stripped of surrounding whitespace. Malformed blocks are left in the content verbatim. Without any
    well-formed block the content is ``text`` unchanged.

    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>').tool_calls[0].arguments
    '{"a": 1}'
    """
    calls: list[ToolCall] = []
    malformed = 0
    pieces: list[str] = []
    pos = 0
    for match in _TOOL_CALL_RE.finditer(text):
        call = _parse_one(match.group(1))
        if call is None:
            malformed += 1
            continue
        pieces.append(text[pos : match.start()])
        pos = match.end()
        calls.append(call)
    pieces.append(text[pos:])
    # An opening tag with no closing tag after the last complete block (e.g. cut by max_tokens).
    if "<tool_call>" in _TOOL_CALL_RE.sub("", text):
        malformed += 1
    if not calls:
        return ParsedToolCalls(text, [], malformed)
    return ParsedToolCalls("".join(pieces).strip(), calls, malformed)


def _parse_one(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except json.JSONDecodeError:
            return None
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=arguments)
