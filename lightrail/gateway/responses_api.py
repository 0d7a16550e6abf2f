"""OpenAI's Responses API (``POST /v1/responses``) as a gateway dialect, so agents written against
``client.responses`` (the OpenAI Agents SDK's default model among them) run unmodified and are recorded like chat
calls.

A Responses request is translated into the equivalent chat-completions `ChatRequest`, so every backend (the
embedded engine, `OpenAIUpstream`) serves it and records token ids and logprobs exactly as for chat:

* ``instructions`` becomes a leading system message (not carried over by ``previous_response_id``, as OpenAI
  documents);
* ``input`` is a string (one user message) or a list of items: ``message`` items (``type`` may be omitted) with
  role ``user`` / ``system`` / ``developer`` (sent as ``system``: open-weight chat templates have no developer
  role) / ``assistant`` and content as a string or ``input_text`` / ``output_text`` / ``refusal`` parts (joined);
  ``function_call`` items (``call_id``, ``name``, ``arguments``) become ``tool_calls`` of an assistant message,
  merged into the assistant message just before them, so a replayed turn renders as the backend generated it;
  ``function_call_output`` items become ``tool`` messages whose ``tool_call_id`` is the ``call_id`` (a string
  output, or the text of ``input_text`` parts); ``reasoning`` items (their ``reasoning_text`` content) become
  the ``reasoning_content`` of the assistant turn they precede, as a reasoning model's output item carries its
  ``<think>`` text;
* ``tools`` (flat function tools: ``name``, ``description``, ``parameters``, ``strict``) become chat function
  tools; ``tool_choice`` ``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}`` and
  ``parallel_tool_calls`` map one to one;
* ``text.format`` (``text`` / ``json_object`` / ``json_schema`` with ``name``, ``schema``, ``strict``) becomes
  the chat ``response_format`` (the embedded engine enforces it by constrained decoding);
* ``max_output_tokens``, ``temperature``, ``top_p`` and ``top_logprobs`` map one to one;
* ``previous_response_id`` continues a conversation this process answered: the gateway remembers, in a bounded
  in-memory LRU (`CONVERSATIONS`), the input messages and the answer of every response (unless ``store`` is
  false, as OpenAI does); an unknown id is a 400 naming ``previous_response_id`` (``previous_response_not_found``);
* ``store``, ``metadata``, ``user``, ``include``, ``truncation``, ``reasoning``, ``service_tier``,
  ``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options``, ``safety_identifier``,
  ``max_tool_calls``, ``text.verbosity``, ``stream_options``, ``image``, ``access_programs`` are hints and
  ignored (``include: ["message.output_text.logprobs"]`` asks for logprobs in the output).

Refused with a 400 naming the field, because silently ignoring them would record training data sampled from a
different distribution than the agent asked for (or hide content the model never saw): hosted tools (a tool
``type`` other than ``function``: ``web_search``, ``file_search``, ...), their tool choices, ``prompt``
templates, ``conversation`` objects, ``background`` mode, ``context_management``, ``moderation``, non-text
content (images, files, audio), hosted-tool items and ``item_reference`` in ``input``, and any parameter the
Responses API does not document (``Unknown parameter: 'x'.``, code ``unknown_parameter``, as OpenAI says).

The answer is a ``response`` whose ``output`` is a ``message`` item with one ``output_text`` part (when there is
text, or nothing at all) followed by one ``function_call`` item per tool call with fresh ``call_`` ids (the
recorded chat view uses the same ids, so a later ``function_call_output`` links to its call in adapters). A
choice cut by ``max_output_tokens`` gives ``status: "incomplete"`` with ``incomplete_details.reason =
"max_output_tokens"``. Token strings are ``token_id:<id>`` (see `lightrail.gateway.openai_api`).

With ``stream: true`` the same response is replayed as OpenAI's event stream (``response.created``,
``response.in_progress``, per item ``response.output_item.added`` / content-part and text or argument deltas /
``response.output_item.done``, then ``response.completed`` or ``response.incomplete``), each event numbered by
``sequence_number`` and named by an SSE ``event:`` line, so the SDK's ``responses.stream()`` assembles exactly
the non-streamed response (see `lightrail.gateway.sse` for why streams are replays).

Recorded span (see `lightrail.gateway.dialect`): ``Attr.REQUEST`` is the equivalent chat-completions request
(the whole conversation, ``previous_response_id`` history included) and ``Attr.RESPONSE`` the equivalent
``chat.completion`` (same ``resp_`` id); ``Attr.DIALECT_REQUEST`` / ``Attr.DIALECT_RESPONSE`` hold the Responses
bodies as sent and received.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Annotated, Any, Literal

import msgspec

from lightrail.gateway.dialect import Dialect
from lightrail.gateway.openai_api import (
    InvalidRequest,
    TranslatedExchange,
    _convert,
    chat_message,
    check_json_schema,
    error_body,
)
from lightrail.gateway.sse import _pieces
from lightrail.types import ChatRequest, Generation, SamplingParams, ToolCall

__all__ = [
    "CONVERSATIONS",
    "RESPONSES",
    "Conversations",
    "ResponsesBody",
    "ResponsesExchange",
    "parse_responses",
    "response_object",
    "response_stream",
]

JSON = Any

_encode = msgspec.json.encode
_decode = msgspec.json.decode

LOGPROBS_INCLUDE = "message.output_text.logprobs"


# -- remembered conversations (previous_response_id) ----------------------------------------------------------


class Conversations:
    """A bounded LRU of answered conversations: response id -> the chat messages of that response's input (its
    instructions excepted) and its answer, kept encoded (compact, and every reader gets a fresh copy).

    Bounded by count and by encoded size; the least recently used conversations go first. Thread-safe (one lock;
    entries are immutable bytes).
    """

    def __init__(self, max_items: int = 4096, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict[str, JSON]]) -> None:
        blob = _encode(messages)
        with self._lock:
            old = self._items.pop(response_id, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[response_id] = blob
            self._bytes += len(blob)
            while self._items and (len(self._items) > self.max_items or self._bytes > self.max_bytes):
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    def get(self, response_id: str) -> list[dict[str, JSON]] | None:
        with self._lock:
            blob = self._items.get(response_id)
            if blob is None:
                return None
            self._items.move_to_end(response_id)
        return _decode(blob)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


CONVERSATIONS = Conversations()
"""The process's remembered conversations (response ids are random, so gateways in one process can share it)."""


# -- request --------------------------------------------------------------------------------------------------


class _Text(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    format: dict[str, JSON] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesBody(msgspec.Struct, kw_only=True):
    """The documented fields of a Responses request (others are refused before conversion)."""

    model: str
    input: str | list[dict[str, JSON]] | None = None
    instructions: str | None = None
    tools: list[dict[str, JSON]] | None = None
    tool_choice: str | dict[str, JSON] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    text: _Text | None = None
    previous_response_id: str | None = None
    stream: bool | None = None
    stream_options: dict[str, JSON] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict[str, JSON] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, JSON] | None = None
    safety_identifier: str | None = None
    max_tool_calls: Annotated[int, msgspec.Meta(ge=1)] | None = None
    image: dict[str, JSON] | None = None
    access_programs: dict[str, JSON] | None = None
    # refused when set (see the module docstring); typed so a bad type is still named precisely
    background: bool | None = None
    background_options: dict[str, JSON] | None = None
    conversation: str | dict[str, JSON] | None = None
    prompt: dict[str, JSON] | None = None
    context_management: list[dict[str, JSON]] | None = None
    moderation: dict[str, JSON] | None = None


_FIELDS = frozenset(ResponsesBody.__struct_fields__)


def _refuse(param: str, message: str, *, code: str | None = None, status: int = 400) -> InvalidRequest:
    """A 400 whose message names ``param`` (``Invalid value for 'x': ...`` unless the message quotes it)."""
    if f"'{param}'" not in message:
        message = f"Invalid value for '{param}': {message}"
    return InvalidRequest(message, param=param, code=code, status=status)


def _invalid(param: str, expected: str) -> InvalidRequest:
    return _refuse(param, f"Invalid value for '{param}': expected {expected}.", code="invalid_value")


_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _content_text(content: JSON, where: str) -> str:
    """The text of a message's content (a string, or text parts joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"{where}.content", "a string or an array of content parts")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _invalid(at, "a content part object with a 'type'")
        kind = part["type"]
        if kind not in _TEXT_PARTS:
            raise _refuse(
                f"{at}.type",
                f"Content parts of type {kind!r} are not supported by this gateway (text only).",
                code="unsupported_value",
            )
        text = part.get("refusal") if kind == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise _invalid(f"{at}.{'refusal' if kind == 'refusal' else 'text'}", "a string")
        texts.append(text)
    return "".join(texts)


_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _items_to_messages(items: list[JSON], seen: set[str]) -> list[dict[str, JSON]]:
    """Chat messages for Responses input items (see the module docstring). ``seen``: call ids of earlier
    function calls (extended with this input's)."""
    out: list[dict[str, JSON]] = []
    merge_ok = False  # may the next function_call join the last message (an assistant turn of this input)?
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _invalid(where, "an input item object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _refuse(
                    f"{where}.role",
                    f"Invalid value for '{where}.role': {role!r}; expected one of "
                    "'user', 'system', 'developer', 'assistant'.",
                    code="invalid_value",
                )
            if "content" not in item:
                raise _refuse(f"{where}.content", f"Missing required parameter: '{where}.content'.")
            text = _content_text(item["content"], where)
            if role == "assistant" and out and out[-1].get("reasoning_content") and not out[-1].get("content"):
                out[-1]["content"] = text  # the answer that followed its reasoning item
            else:
                out.append({"role": _ROLES[role], "content": text})
            merge_ok = role == "assistant"
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
                if not isinstance(value, str):
                    raise _refuse(f"{where}.{key}", f"Missing required parameter: '{where}.{key}'.")
            if not call_id or not name:
                raise _invalid(f"{where}.{'call_id' if not call_id else 'name'}", "a non-empty string")
            seen.add(call_id)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if merge_ok:
                last = out[-1]
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None  # as OpenAI sends an assistant message with tool calls and no text
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                merge_ok = True
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _refuse(f"{where}.call_id", f"Missing required parameter: '{where}.call_id'.")
            if call_id not in seen:
                raise _refuse(
                    f"{where}.call_id",
                    f"No tool call found for function call output with call_id {call_id}.",
                    code="invalid_value",
                )
            if isinstance(output, list):
                text = _content_text(output, f"{where}.output")
            elif isinstance(output, str):
                text = output
            else:
                raise _refuse(f"{where}.output", f"Missing required parameter: '{where}.output'.")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
            merge_ok = False
        elif kind == "reasoning":
            # A reasoning model's earlier thinking goes back on the assistant turn it preceded, as the chat API's
            # ``reasoning_content`` (the model's template decides whether its prompt shows it).
            parts = item.get("content")
            text = "".join(
                p["text"]
                for p in (parts if isinstance(parts, list) else ())
                if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
            if text:
                out.append({"role": "assistant", "content": None, "reasoning_content": text})
                merge_ok = True
        else:
            raise _refuse(
                f"{where}.type",
                f"Input items of type {kind!r} are not supported by this gateway "
                "(message, function_call, function_call_output, reasoning).",
                code="unsupported_value",
            )
    return out


_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict", "defer_loading"})


def _tools(tools: list[dict[str, JSON]]) -> list[dict[str, JSON]]:
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise _refuse(
                f"tools[{i}].type",
                f"Tools of type {kind!r} are not supported by this gateway (function tools only).",
                code="unsupported_value",
            )
        extra = [k for k in tool if k not in _TOOL_KEYS]
        if extra:
            raise _refuse(
                f"tools[{i}].{extra[0]}", f"Unknown parameter: 'tools[{i}].{extra[0]}'.", code="unknown_parameter"
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise _refuse(f"tools[{i}].name", f"Missing required parameter: 'tools[{i}].name'.")
        function: dict[str, JSON] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise _invalid(f"tools[{i}].parameters", "a JSON schema object")
            function["parameters"] = parameters
        if tool.get("strict") is not None:
            function["strict"] = bool(tool["strict"])
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: JSON, names: set[str]) -> JSON:
    """The chat ``tool_choice`` for a Responses one."""
    if choice is None or choice in ("auto", "none"):
        return choice
    if choice == "required":
        if not names:
            raise _refuse("tool_choice", "Invalid value for 'tool_choice': 'required' needs tools.")
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            name = choice.get("name")
            if name not in names:
                raise _refuse("tool_choice.name", f"Tool choice names an unknown function {name!r}.")
            return {"type": "function", "function": {"name": name}}
        raise _refuse(
            "tool_choice.type",
            f"Tool choice of type {kind!r} is not supported by this gateway (function tools only).",
            code="unsupported_value",
        )
    raise _invalid("tool_choice", "'none', 'auto', 'required' or {'type': 'function', 'name': ...}")


def _response_format(fmt: dict[str, JSON] | None) -> dict[str, JSON] | None:
    """The chat ``response_format`` for ``text.format`` (None for free text)."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        name, schema = fmt.get("name"), fmt.get("schema")
        if not isinstance(name, str) or not name:
            raise _refuse("text.format.name", "Missing required parameter: 'text.format.name'.")
        if not isinstance(schema, dict):
            raise _refuse("text.format.schema", "Missing required parameter: 'text.format.schema'.")
        check_json_schema(schema, name=name, param="text.format.schema")
        spec: dict[str, JSON] = {"name": name, "schema": schema}
        if isinstance(fmt.get("description"), str):
            spec["description"] = fmt["description"]
        if fmt.get("strict") is not None:
            spec["strict"] = bool(fmt["strict"])
        return {"type": "json_schema", "json_schema": spec}
    raise _invalid("text.format.type", "'text', 'json_object' or 'json_schema'")


def _check_fields(data: dict[str, JSON]) -> None:
    for key in data:
        if key not in _FIELDS:
            raise _refuse(key, f"Unknown parameter: '{key}'.", code="unknown_parameter")
    if "model" not in data:
        raise _refuse("model", "Missing required parameter: 'model'.", code="missing_required_parameter")


def _refuse_unsupported(body: ResponsesBody) -> None:
    if body.background:
        raise _refuse("background", "Background responses are not supported by this gateway.")
    if body.conversation is not None:
        raise _refuse("conversation", "Conversations are not supported by this gateway; use previous_response_id.")
    if body.prompt is not None:
        raise _refuse("prompt", "Prompt templates are not supported by this gateway.")
    if body.context_management:
        raise _refuse("context_management", "Context management is not supported by this gateway.")
    if body.moderation is not None:
        raise _refuse("moderation", "Moderation is not supported by this gateway.")
    if body.stream_options is not None and not body.stream:
        raise _refuse("stream_options", "stream_options is only allowed when stream is true.")


def parse_responses(
    data: dict[str, JSON], conversations: Conversations = CONVERSATIONS
) -> tuple[ResponsesBody, ChatRequest, dict[str, JSON], list[dict[str, JSON]]]:
    """Validate a Responses body; returns the typed body, the backend request, the equivalent chat request body
    (what the span records) and the conversation so far without instructions (what a later
    ``previous_response_id`` continues), or raises `InvalidRequest` naming the bad field."""
    _check_fields(data)
    body: ResponsesBody = _convert(data, ResponsesBody)
    _refuse_unsupported(body)

    history: list[dict[str, JSON]] = []
    if body.previous_response_id is not None:
        previous = conversations.get(body.previous_response_id)
        if previous is None:
            raise _refuse(
                "previous_response_id",
                f"Previous response with id '{body.previous_response_id}' not found.",
                code="previous_response_not_found",
            )
        history = previous
    if body.input is None and not history:
        raise _refuse("input", "Missing required parameter: 'input'.", code="missing_required_parameter")
    seen = {c["id"] for m in history for c in m.get("tool_calls") or ()}
    if isinstance(body.input, str):
        new = [{"role": "user", "content": body.input}]
    else:
        new = _items_to_messages(body.input or [], seen)
    conversation = history + new
    if not conversation:
        raise _refuse("input", "Invalid value for 'input': the conversation is empty.", code="invalid_value")
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation

    tools = _tools(body.tools) if body.tools else None
    tool_choice = _tool_choice(body.tool_choice, {t["function"]["name"] for t in tools or ()})
    if not tools and tool_choice == "none":
        tool_choice = None  # chat servers refuse a tool_choice without tools
    parallel = body.parallel_tool_calls if tools else None
    response_format = _response_format(body.text.format if body.text is not None else None)
    sampling = SamplingParams(
        n=1,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=body.max_output_tokens,
        top_logprobs=body.top_logprobs or 0,
    )
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=response_format,
        parallel_tool_calls=parallel,
        sampling=sampling,
    )
    chat: dict[str, JSON] = {"model": body.model, "messages": messages}
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    chat["temperature"] = sampling.temperature
    chat["top_p"] = sampling.top_p
    if tools:
        chat["tools"] = tools
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    if response_format is not None:
        chat["response_format"] = response_format
    if body.top_logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.top_logprobs
    if body.user:
        chat["user"] = body.user
    if body.stream:
        chat["stream"] = True
    return body, request, chat, conversation


# -- response -------------------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}{os.urandom(12).hex()}"


def _logprobs(choice: Any, lo: int = 0, hi: int | None = None) -> list[dict[str, JSON]]:
    """Responses ``logprobs`` entries for the choice's tokens ``lo:hi`` (all of them by default)."""
    ids, lps = choice.token_ids, choice.logprobs
    if ids is None or lps is None:
        return []
    hi = len(ids) if hi is None else hi
    tops = choice.top_logprobs
    out = []
    for k in range(lo, min(hi, len(ids), len(lps))):
        alternatives = tops[k] if tops is not None and k < len(tops) else ()
        out.append(
            {
                "token": f"token_id:{ids[k]}",
                "bytes": [],
                "logprob": lps[k],
                "top_logprobs": [{"token": f"token_id:{t}", "bytes": [], "logprob": lp} for t, lp in alternatives],
            }
        )
    return out


def _usage(generation: Generation) -> dict[str, JSON]:
    choice = generation.choices[0]
    prompt = len(generation.prompt_ids) if generation.prompt_ids is not None else 0
    output = len(choice.token_ids) if choice.token_ids is not None else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _echo_text(body: ResponsesBody) -> dict[str, JSON]:
    fmt = body.text.format if body.text is not None and body.text.format is not None else {"type": "text"}
    text: dict[str, JSON] = {"format": fmt}
    if body.text is not None and body.text.verbosity is not None:
        text["verbosity"] = body.text.verbosity
    return text


def response_object(body: ResponsesBody, generation: Generation, response_id: str) -> dict[str, JSON]:
    """The ``response`` object for a one-choice generation (its tool calls already carry ``call_`` ids)."""
    choice = generation.choices[0]
    incomplete = choice.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    output: list[dict[str, JSON]] = []
    if choice.reasoning is not None:
        reasoning_text: list[JSON] = [{"type": "reasoning_text", "text": choice.reasoning}]
        output.append(
            {"id": _new_id("rs_"), "type": "reasoning", "summary": [], "content": reasoning_text, "status": "completed"}
        )
    if choice.text or not choice.tool_calls:  # an empty answer is one empty text part (output_text == "")
        part: dict[str, JSON] = {"type": "output_text", "text": choice.text, "annotations": []}
        if body.include and LOGPROBS_INCLUDE in body.include:
            part["logprobs"] = _logprobs(choice)
        message: dict[str, JSON] = {"id": _new_id("msg_"), "type": "message", "role": "assistant", "status": status}
        message["content"] = [part]
        output.append(message)
    for call in choice.tool_calls:
        output.append(
            {
                "id": _new_id("fc_"),
                "type": "function_call",
                "status": "completed",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
    now = int(time.time())
    return {
        "id": response_id,
        "object": "response",
        "created_at": now,
        "status": status,
        "background": False,
        "completed_at": None if incomplete else now,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": body.max_tool_calls,
        "model": generation.model,
        "output": output,
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "prompt_cache_key": body.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": body.safety_identifier,
        "service_tier": "default",
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": _echo_text(body),
        "tool_choice": "auto" if body.tool_choice is None else body.tool_choice,
        "tools": list(body.tools or ()),
        "top_logprobs": body.top_logprobs or 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled",
        "usage": _usage(generation),
        "user": body.user,
        "metadata": dict(body.metadata or {}),
    }


def _event(kind: str, data: dict[str, JSON], seq: list[int]) -> bytes:
    data = {"type": kind, "sequence_number": seq[0], **data}
    seq[0] += 1
    return b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n"


def response_stream(response: dict[str, JSON], choice: Any, *, logprobs: bool, chunk_chars: int) -> bytes:
    """All events of a streamed ``response``, replayed from the complete one. ``choice``: the backend's choice
    (its token logprobs are spread over the text deltas, in order, when ``logprobs``)."""
    seq = [0]
    start = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    start["completed_at"] = None
    out = [
        _event("response.created", {"response": start}, seq),
        _event("response.in_progress", {"response": start}, seq),
    ]
    n_tokens = len(choice.token_ids) if choice.token_ids is not None else 0
    for index, item in enumerate(response["output"]):
        item_id = item["id"]
        where = {"item_id": item_id, "output_index": index}
        if item["type"] == "message":
            out.append(
                _event(
                    "response.output_item.added",
                    {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
                    seq,
                )
            )
            part = item["content"][0]
            text = part["text"]
            empty = {"type": "output_text", "text": "", "annotations": []}
            if logprobs:
                empty["logprobs"] = []
            out.append(_event("response.content_part.added", {**where, "content_index": 0, "part": empty}, seq))
            for piece, lo, hi in _pieces(text, n_tokens, chunk_chars) if text else [("", 0, n_tokens)]:
                if not piece and not logprobs:
                    continue
                lps = _logprobs(choice, lo, hi) if logprobs else []
                delta = {**where, "content_index": 0, "delta": piece, "logprobs": lps}
                out.append(_event("response.output_text.delta", delta, seq))
            done = {**where, "content_index": 0, "text": text, "logprobs": part.get("logprobs") or []}
            out.append(_event("response.output_text.done", done, seq))
            out.append(_event("response.content_part.done", {**where, "content_index": 0, "part": part}, seq))
        elif item["type"] == "reasoning":
            added = {**item, "status": "in_progress", "content": []}
            out.append(_event("response.output_item.added", {"output_index": index, "item": added}, seq))
            text = item["content"][0]["text"]
            for k in range(0, len(text), chunk_chars):
                delta = {**where, "content_index": 0, "delta": text[k : k + chunk_chars]}
                out.append(_event("response.reasoning_text.delta", delta, seq))
            out.append(_event("response.reasoning_text.done", {**where, "content_index": 0, "text": text}, seq))
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            out.append(_event("response.output_item.added", {"output_index": index, "item": added}, seq))
            arguments = item["arguments"]
            for k in range(0, len(arguments), chunk_chars):
                delta = {**where, "delta": arguments[k : k + chunk_chars]}
                out.append(_event("response.function_call_arguments.delta", delta, seq))
            done = {**where, "name": item["name"], "arguments": arguments}
            out.append(_event("response.function_call_arguments.done", done, seq))
        out.append(_event("response.output_item.done", {"output_index": index, "item": item}, seq))
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    out.append(_event(final, {"response": response}, seq))
    return b"".join(out)


# -- dialect --------------------------------------------------------------------------------------------------


class ResponsesExchange(TranslatedExchange):
    """``POST /v1/responses`` (OpenAI Responses API)."""

    endpoint = "responses"
    id_prefix = "resp_"
    conversations: Conversations = CONVERSATIONS

    def __init__(self, data: dict[str, JSON]) -> None:
        self.body, self.request, self.chat_request, self.conversation = parse_responses(data, self.conversations)
        self.stream = bool(self.body.stream)
        self.generation: Generation | None = None
        """The backend's generation (first choice) with ``call_`` tool-call ids (what both views show)."""

    def respond(self, generation: Generation, response_id: str) -> dict[str, JSON]:
        choices = [
            msgspec.structs.replace(
                choice,
                tool_calls=[
                    ToolCall(id=_new_id("call_"), name=c.name, arguments=c.arguments) for c in choice.tool_calls
                ],
            )
            for choice in generation.choices[:1]
        ]
        self.generation = msgspec.structs.replace(generation, choices=choices)
        return response_object(self.body, self.generation, response_id)

    def answered(self, response: dict[str, JSON]) -> None:
        if self.body.store is False or self.generation is None:
            return  # OpenAI cannot continue an unstored response either
        answer = chat_message(self.generation.choices[0])
        self.conversations.put(response["id"], [*self.conversation, answer])

    def events(self, response: dict[str, JSON], generation: Generation, chunk_chars: int) -> bytes:
        choice = (self.generation or generation).choices[0]
        logprobs = bool(self.body.include and LOGPROBS_INCLUDE in self.body.include)
        return response_stream(response, choice, logprobs=logprobs, chunk_chars=chunk_chars)


RESPONSES = Dialect("/responses", ResponsesExchange, error_body)
