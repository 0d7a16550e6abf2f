"""Chat prompts and tool calls: OpenAI messages in, prompt text out; generated text in, reasoning, content and
`ToolCall`s out, in the model family's own formats (`lightrail.engine.formats`).

The tokenizer's own chat template is used whenever it can express what the request contains. Three capabilities
are probed once per tokenizer by rendering sentinel messages: tool definitions (``tools=``), assistant
``tool_calls`` and ``tool``-role results. Whatever the template cannot render is rewritten before templating:

* tool definitions -> a system prompt listing the tools and how the family calls them (`ToolFormat.tools_prompt`);
* assistant ``tool_calls`` -> the family's call markup appended to the assistant content (`ToolFormat.render`);
  also when the template refuses a turn (Llama 3's allows one call per turn: a turn with two is written as the
  model writes two calls);
* ``tool`` messages -> a user turn with one Hermes ``<tool_response>`` block per result.

Generated text is split with `ChatFormat.parse` (reasoning first, then tool calls). Pure functions and a small
stateless class: no locks.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from lightrail.engine.formats import TOOL_FORMATS, ModelFormat, ParsedToolCalls, model_format
from lightrail.types import content_text

__all__ = ["ChatFormat", "ParsedToolCalls", "hermes_tools_prompt", "normalize_messages", "parse_tool_calls"]

_PROBE_TOOL = "lr_probe_tool_7f3a"
_PROBE_CALL = "lr_probe_call_7f3a"
_PROBE_RESULT = "lr_probe_result_7f3a"
_HERMES = TOOL_FORMATS["hermes"]


def hermes_tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes-style system-prompt section that lists ``tools`` and says how to call them."""
    return _HERMES.tools_prompt(tools)


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split Hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks out of generated text.

    Well-formed blocks become `ToolCall`s (``arguments`` as JSON text) and are removed from the content, which is
    then stripped of surrounding whitespace. Malformed blocks are left in the content verbatim. Without any
    well-formed block the content is ``text`` unchanged. Other families: ``TOOL_FORMATS[name].parse``.

    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>').tool_calls[0].arguments
    '{"a": 1}'
    """
    return _HERMES.parse(text)


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


class ChatFormat:
    """Renders chat requests to prompt text with a tokenizer's chat template and reads generated text back, in the
    model family's formats (detected from the template, or named: ``tool_format``, ``reasoning``). Probes run once,
    at construction. Raises `lightrail.engine.formats.UnknownFormatError` for a template whose tool markup is not
    known and no ``tool_format``."""

    def __init__(self, tokenizer: Any, *, tool_format: str | None = None, reasoning: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; use text completions or set tokenizer.chat_template")
        self.tokenizer = tokenizer
        self.format: ModelFormat = model_format(tokenizer.chat_template, tool_format, reasoning)
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
            return self._apply(self.format.tool.prepare(messages), tools)
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
            section = self.format.tool.tools_prompt(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {
                    **msgs[0],
                    "content": f"{msgs[0]['content']}\n\n{section}" if msgs[0]["content"] else section,
                }
            else:
                msgs.insert(0, {"role": "system", "content": section})
        if not self.native_tool_results:
            msgs = _tool_results_as_user_turns(msgs)
        native_tools = tools if (tools and self.native_tools) else None
        if self.native_tool_calls:
            with contextlib.suppress(Exception):  # the template refused a turn: write its calls as text below
                return self._apply(self.format.tool.prepare(msgs), native_tools)
        return self._apply(self.format.tool.prepare(self._calls_as_text(msgs)), native_tools)

    def dropped(self, messages: list[dict[str, Any]], prompt: str) -> int | None:
        """The index of the first message the rendered ``prompt`` does not show, else None.

        A chat template skips what it has no markup for (Qwen2.5's and Qwen3's skip a ``developer`` turn, any role
        they do not name): a message other than the assistant's whose text (stripped, as Llama's templates trim
        it) is absent from the prompt was dropped. Assistant turns are not checked: templates rewrite them on
        purpose (Qwen3 drops the reasoning of earlier turns)."""
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") == "assistant":
                continue
            text = content_text(message.get("content")).strip()
            if text and text not in prompt:
                return i
        return None

    def _calls_as_text(self, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for m in msgs:
            if m["role"] == "assistant" and m.get("tool_calls"):
                text = self.format.tool.render([c["function"] for c in m["tool_calls"]])
                m = {"role": "assistant", "content": "\n".join(([m["content"]] if m["content"] else []) + [text])}
            out.append(m)
        return out

    def assistant_text(self, message: dict[str, Any]) -> str:
        """The text a model generates for an assistant ``message`` (see `ModelFormat.assistant_text`): supervised
        targets are built from it, so a model learns to write exactly what `parse` reads back."""
        (m,) = normalize_messages([message])
        return self.format.assistant_text(m)

    def parse(self, text: str, tools: bool = True) -> tuple[str | None, ParsedToolCalls]:
        """(reasoning, content and tool calls) of generated ``text``: the reasoning block split off first (when the
        family reasons), then the family's tool calls parsed out of the rest (when ``tools`` were offered)."""
        reasoning = None
        if self.format.reasoning is not None:
            reasoning, text = self.format.reasoning.split(text)
        if not tools:
            return reasoning, ParsedToolCalls(text, [], 0)
        return reasoning, self.format.tool.parse(text)


def _tool_results_as_user_turns(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in merged]
