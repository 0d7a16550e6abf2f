"""Anthropic's Messages API (``POST /v1/messages``) as a gateway dialect, so agents written against the
``anthropic`` SDK run unmodified: ``anthropic.Anthropic(base_url=<attempt url without /v1>, api_key=<token>)``
(the gateway accepts the key as ``x-api-key``, which is how that SDK sends it).

A Messages request is translated into the equivalent chat-completions `ChatRequest`, so every backend (the
embedded engine, `OpenAIUpstream`) serves it and records token ids and logprobs exactly as for chat:

* ``system`` (a string or text blocks, joined with newlines) becomes a leading system message;
* user turns: ``text`` blocks become user messages and ``tool_result`` blocks become ``tool`` messages, in the
  order they come (text before a result is its own user message); a result's content is its text (text blocks
  joined), prefixed ``Error: `` when ``is_error`` is set, since chat has no such flag;
* assistant turns: ``text`` blocks become the content and ``tool_use`` blocks ``tool_calls`` whose
  ``arguments`` are the JSON of ``input``; the ``toolu_`` ids are kept, so a later ``tool_result`` links to its call;
* ``tools`` (``name``, ``description``, ``input_schema``) become function tools; ``tool_choice`` ``auto`` /
  ``any`` / ``tool`` / ``none`` becomes ``auto`` / ``required`` / the named function / ``none``, and
  ``disable_parallel_tool_use`` becomes ``parallel_tool_calls: false``;
* ``max_tokens``, ``stop_sequences`` (as ``stop``), ``temperature`` (0..1), ``top_p`` map one to one; ``metadata``
  (``user_id``), ``service_tier``, ``cache_control`` (also on blocks), ``inference_geo``, ``speed``,
  ``diagnostics``, ``user_profile_id``, ``workspace_id`` and ``output_config.effort`` are hints and ignored.

Refused with a 400 naming the field, because silently ignoring them would record training data sampled from a
different distribution than the agent asked for (or hide content the model never saw): ``top_k`` (no lightrail
backend samples with top-k), ``thinking`` unless disabled, ``output_config.format``, ``container``, server tools
(a ``type`` other than ``custom``), ``image`` / ``document`` / other non-text blocks, an assistant turn last
(prefill: chat backends start a new turn instead of continuing it), and any field the Messages API does not
document (``Extra inputs are not permitted``, as Anthropic says).

The response is a ``message`` whose content is a ``thinking`` block when a reasoning model reasoned (its
``<think>`` text; the ``signature`` is empty: nothing to verify; ``thinking`` blocks sent back are the assistant
turn's ``reasoning_content``), a text block (when there is text, or nothing at all), then one ``tool_use`` block per
tool call, with fresh ``toolu_`` ids; the recorded chat view uses the same ids. ``stop_reason`` is
``tool_use`` / ``max_tokens`` / ``stop_sequence`` / ``end_turn``: the backend reports which stop string ended a
choice (`lightrail.types.Choice.stop_sequence`: the engine and the scripted backend know it; an upstream knows it
when it is vLLM, whose ``stop_reason`` carries it); a choice that finished on ``stop`` without one ended on an
end-of-turn token (``end_turn``). ``usage`` counts the backend's prompt and completion ids.

With ``stream: true`` the same message is replayed as Anthropic's event stream (``message_start``, ``ping``,
per block ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` and ``message_stop``), so the SDK's ``messages.stream()``
assembles exactly the non-streamed message (see `lightrail.gateway.sse` for why streams are replays).

Recorded span (see `lightrail.gateway.dialect`): ``Attr.REQUEST`` is the equivalent chat-completions request
and ``Attr.RESPONSE`` the equivalent ``chat.completion`` (same ``msg_`` id), so adapters read these calls like
chat calls; ``Attr.DIALECT_REQUEST`` / ``Attr.DIALECT_RESPONSE`` hold the Messages bodies as sent and received.
Errors use Anthropic's envelope, ``{"type": "error", "error": {"type", "message"}}``, its type from the status.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, Literal

import msgspec

from lightrail.gateway.dialect import Dialect
from lightrail.gateway.openai_api import InvalidRequest, TranslatedExchange
from lightrail.types import ChatRequest, Generation, SamplingParams, ToolCall

__all__ = ["MESSAGES", "MessagesExchange", "error_body", "parse_messages"]

JSON = Any

_encode = msgspec.json.encode

#: Error ``type`` by HTTP status (Anthropic's documented error types); other 4xx are invalid requests, 5xx api errors.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    status: int | None = None,
) -> dict[str, JSON]:
    """Anthropic's error envelope ``{"type": "error", "error": {"type", "message"}}``; the error type follows the
    HTTP status (Anthropic's envelope has no ``param``: messages name the field)."""
    kind = ERROR_TYPES.get(status or 400) or ("api_error" if (status or 400) >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Metadata(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    user_id: str | None = None


class MessagesBody(msgspec.Struct, kw_only=True):
    """The documented fields of a Messages request (unknown fields are refused before conversion)."""

    model: str
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    messages: Annotated[list[dict[str, JSON]], msgspec.Meta(min_length=1)]
    system: str | list[dict[str, JSON]] | None = None
    tools: list[dict[str, JSON]] | None = None
    tool_choice: dict[str, JSON] | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    metadata: _Metadata | None = None
    stream: bool | None = None
    thinking: dict[str, JSON] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    output_config: dict[str, JSON] | None = None
    container: JSON = None
    # hints, ignored
    cache_control: JSON = None
    inference_geo: JSON = None
    speed: JSON = None
    diagnostics: JSON = None
    user_profile_id: JSON = None
    workspace_id: JSON = None


_FIELDS = frozenset(MessagesBody.__struct_fields__)

_TEXT = "text"
_TOOL_KEYS = frozenset(
    {
        "type",
        "name",
        "description",
        "input_schema",
        "cache_control",
        "strict",
        "defer_loading",
        "input_examples",
        "eager_input_streaming",
        "allowed_callers",
    }
)


def _convert(data: dict[str, JSON]) -> MessagesBody:
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    for required in ("model", "max_tokens", "messages"):
        if required not in data:
            raise InvalidRequest(f"{required}: Field required", param=required)
    try:
        return msgspec.convert(data, MessagesBody)
    except msgspec.ValidationError as exc:
        text = str(exc)
        message, _, where = text.partition(" - at `$")
        path = where.rstrip("`").lstrip(".")
        if "unknown field" in message:  # in ``metadata``
            field = message.split("`")[1]
            path = f"{path}.{field}" if path else field
            message = "Extra inputs are not permitted"
        raise InvalidRequest(f"{path}: {message}" if path else message, param=path or None) from None


def _refuse(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field}: {message}", param=field)


def _block_text(blocks: list[JSON], where: str) -> str:
    """The text of a list of text blocks (system prompt, tool result content)."""
    texts = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            raise _refuse(f"{where}[{j}]", "expected a content block object")
        kind = block.get("type")
        if kind != _TEXT:
            raise _refuse(
                f"{where}[{j}].type", f"{kind!r} content blocks are not supported by this gateway (text only)"
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise _refuse(f"{where}[{j}].text", "Field required (a string)")
        texts.append(text)
    return "\n".join(texts)


def _blocks(message: dict[str, JSON], where: str) -> list[dict[str, JSON]]:
    extra = [k for k in message if k not in ("role", "content")]
    if extra:
        raise _refuse(f"{where}.{extra[0]}", "Extra inputs are not permitted")
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": _TEXT, "text": content}]
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "expected a string or a list of content blocks")
    if not content:
        raise _refuse(f"{where}.content", "must not be empty")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _refuse(f"{where}.content[{j}]", "expected a content block object with a 'type'")
    return content


def _assistant(blocks: list[dict[str, JSON]], where: str, seen: set[str]) -> dict[str, JSON]:
    texts, calls, thoughts = [], [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block["type"]
        if kind == "thinking":  # a reasoning model's earlier thinking: back as the turn's reasoning_content
            if not isinstance(block.get("thinking"), str):
                raise _refuse(f"{at}.thinking", "Field required (a string)")
            thoughts.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == _TEXT:
            if not isinstance(block.get("text"), str):
                raise _refuse(f"{at}.text", "Field required (a string)")
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise _refuse(f"{at}.id", "Field required (a string)")
            if not isinstance(name, str) or not name:
                raise _refuse(f"{at}.name", "Field required (a string)")
            if not isinstance(arguments, dict):
                raise _refuse(f"{at}.input", "expected an object")
            seen.add(call_id)
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            )
        else:
            raise _refuse(f"{at}.type", f"{kind!r} content blocks are not supported by this gateway")
    text = "".join(texts)
    message: dict[str, JSON] = {"role": "assistant", "content": text}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["content"] = text or None  # as OpenAI sends it next to tool calls
        message["tool_calls"] = calls
    return message


def _user(blocks: list[dict[str, JSON]], where: str, seen: set[str]) -> list[dict[str, JSON]]:
    out: list[dict[str, JSON]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            out.append({"role": "user", "content": "".join(texts)})
            texts.clear()

    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = block["type"]
        if kind == _TEXT:
            if not isinstance(block.get("text"), str):
                raise _refuse(f"{at}.text", "Field required (a string)")
            texts.append(block["text"])
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise _refuse(f"{at}.tool_use_id", "Field required (a string)")
            if call_id not in seen:
                raise _refuse(f"{at}.tool_use_id", f"no earlier tool_use block has the id {call_id!r}")
            content = block.get("content")
            if content is None:
                text = ""
            elif isinstance(content, str):
                text = content
            elif isinstance(content, list):
                text = _block_text(content, f"{at}.content")
            else:
                raise _refuse(f"{at}.content", "expected a string or a list of text blocks")
            if block.get("is_error"):
                text = f"Error: {text}"
            flush()
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise _refuse(f"{at}.type", f"{kind!r} content blocks are not supported by this gateway")
    flush()
    return out


def _tools(tools: list[dict[str, JSON]]) -> list[dict[str, JSON]]:
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _refuse(
                f"tools[{i}].type", f"server tool {kind!r} is not supported by this gateway (custom tools only)"
            )
        extra = [k for k in tool if k not in _TOOL_KEYS]
        if extra:
            raise _refuse(f"tools[{i}].{extra[0]}", "Extra inputs are not permitted")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise _refuse(f"tools[{i}].name", "Field required (a string)")
        if not isinstance(schema, dict):
            raise _refuse(f"tools[{i}].input_schema", "Field required (a JSON schema object)")
        function: dict[str, JSON] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema
        if tool.get("strict") is True:
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: dict[str, JSON] | None, names: set[str]) -> tuple[JSON, bool | None]:
    """Chat ``tool_choice`` and ``parallel_tool_calls`` for Anthropic's ``tool_choice``."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    extra = [k for k in choice if k not in ("type", "name", "disable_parallel_tool_use")]
    if extra:
        raise _refuse(f"tool_choice.{extra[0]}", "Extra inputs are not permitted")
    parallel = False if choice.get("disable_parallel_tool_use") is True else None
    if kind == "auto":
        return "auto", parallel
    if kind == "none":
        return "none", None
    if kind in ("any", "tool") and not names:
        raise _refuse("tool_choice", f"tool_choice {kind!r} needs tools")
    if kind == "any":
        return "required", parallel
    if kind == "tool":
        name = choice.get("name")
        if name not in names:
            raise _refuse("tool_choice.name", f"no tool is named {name!r}")
        return {"type": "function", "function": {"name": name}}, parallel
    raise _refuse("tool_choice.type", "expected 'auto', 'any', 'tool' or 'none'")


def parse_messages(data: dict[str, JSON]) -> tuple[MessagesBody, ChatRequest, dict[str, JSON]]:
    """Validate a Messages body; returns the typed body, the backend request and the equivalent
    chat-completions request dict (what the span records), or raises `InvalidRequest` naming the bad field."""
    body = _convert(data)
    if body.top_k is not None:
        raise _refuse("top_k", "not supported: no backend of this gateway samples with top-k")
    thinking = body.thinking
    if thinking is not None and thinking.get("type") != "disabled":
        raise _refuse("thinking", "extended thinking is not supported by this gateway")
    config = body.output_config or {}
    for key in config:
        if key == "format" and config[key] is not None:
            raise _refuse("output_config.format", "structured outputs are not supported by this gateway")
        if key not in ("format", "effort"):
            raise _refuse(f"output_config.{key}", "Extra inputs are not permitted")
    if body.container is not None:
        raise _refuse("container", "containers are not supported by this gateway")
    stops = body.stop_sequences or []
    if not all(stops):
        raise _refuse("stop_sequences", "stop sequences must be non-empty strings")

    messages: list[dict[str, JSON]] = []
    if isinstance(body.system, str):
        if body.system:
            messages.append({"role": "system", "content": body.system})
    elif body.system:
        messages.append({"role": "system", "content": _block_text(body.system, "system")})
    seen: set[str] = set()
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise _refuse(f"{where}.role", "Input should be 'user' or 'assistant'")
        blocks = _blocks(message, where)
        if role == "assistant":
            messages.append(_assistant(blocks, where, seen))
        else:
            messages.extend(_user(blocks, where, seen))
    if body.messages[-1].get("role") == "assistant":
        raise _refuse(
            f"messages[{len(body.messages) - 1}]",
            "a final assistant turn (prefill) is not supported by this gateway: the last message must be the user's",
        )

    tools = _tools(body.tools) if body.tools else None
    tool_choice, parallel = _tool_choice(body.tool_choice, {t["function"]["name"] for t in tools or ()})
    if not tools:
        tool_choice, parallel = None, None  # chat servers refuse a tool_choice without tools
    sampling = SamplingParams(
        n=1,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=body.max_tokens,
        stop=list(stops),
    )
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        sampling=sampling,
    )
    chat: dict[str, JSON] = {
        "model": body.model,
        "messages": messages,
        "max_tokens": body.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    if stops:
        chat["stop"] = list(stops)
    if tools:
        chat["tools"] = tools
    if tool_choice is not None:
        chat["tool_choice"] = tool_choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    if body.metadata is not None and body.metadata.user_id:
        chat["user"] = body.metadata.user_id
    if body.stream:
        chat["stream"] = True
    return body, request, chat


# -- responses ------------------------------------------------------------------------------------------------


def new_tool_use_id() -> str:
    return f"toolu_{os.urandom(12).hex()}"


def _input(arguments: str) -> dict[str, JSON]:
    """A tool call's ``input`` object from its JSON arguments (``{}`` when the model wrote no valid object; the
    span keeps the arguments as generated)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}


def message_response(generation: Generation, response_id: str) -> dict[str, JSON]:
    """The ``message`` object for a one-choice generation (its tool calls already carry ``toolu_`` ids)."""
    choice = generation.choices[0]
    content: list[dict[str, JSON]] = []
    if choice.reasoning is not None:  # a reasoning model's thinking, first, as Claude's thinking blocks come
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text or not choice.tool_calls:  # an empty answer is one empty text block (agents read content[0])
        content.append({"type": "text", "text": choice.text})
    for call in choice.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)})
    if choice.tool_calls:
        stop_reason, stop_sequence = "tool_use", None
    elif choice.finish_reason == "stop" and choice.stop_sequence is not None:
        stop_reason, stop_sequence = "stop_sequence", choice.stop_sequence
    else:
        stop_reason, stop_sequence = _STOP_REASONS.get(choice.finish_reason, "end_turn"), None
    prompt = len(generation.prompt_ids) if generation.prompt_ids is not None else 0
    output = len(choice.token_ids) if choice.token_ids is not None else 0
    return {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": generation.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": prompt, "output_tokens": output},
    }


def _event(kind: str, data: dict[str, JSON]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode(data) + b"\n\n"


def message_stream(response: dict[str, JSON], chunk_chars: int) -> bytes:
    """All events of a streamed ``message``, replayed from the complete ``response``."""
    start = {**response, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0}
    out = [_event("message_start", {"type": "message_start", "message": start}), _event("ping", {"type": "ping"})]
    for index, block in enumerate(response["content"]):
        first: dict[str, JSON]
        if block["type"] == _TEXT:
            first, key, delta_type, whole = {"type": _TEXT, "text": ""}, _TEXT, "text_delta", block["text"]
        elif block["type"] == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            key, delta_type, whole = "thinking", "thinking_delta", block["thinking"]
        else:
            first = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            key, delta_type, whole = "partial_json", "input_json_delta", json.dumps(block["input"])
        out.append(
            _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": first})
        )
        for k in range(0, len(whole), chunk_chars):
            delta = {"type": delta_type, key: whole[k : k + chunk_chars]}
            out.append(_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    delta = {"stop_reason": response["stop_reason"], "stop_sequence": response["stop_sequence"]}
    out.append(_event("message_delta", {"type": "message_delta", "delta": delta, "usage": response["usage"]}))
    out.append(_event("message_stop", {"type": "message_stop"}))
    return b"".join(out)


_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"})
_COUNT_FIELDS |= {"cache_control", "mcp_servers", "context_management", "speed"}  # hints that change no prompt text


def parse_count_tokens(data: dict[str, JSON]) -> ChatRequest:
    """The backend request whose rendered prompt ``POST /v1/messages/count_tokens`` counts: a Messages body
    without ``max_tokens`` or sampling fields, validated like one (`InvalidRequest` naming the bad field)."""
    unknown = [k for k in data if k not in _COUNT_FIELDS]
    if unknown:
        raise InvalidRequest(f"{unknown[0]}: Extra inputs are not permitted", param=unknown[0])
    if data.get("mcp_servers"):
        raise _refuse("mcp_servers", "MCP servers are not supported by this gateway")
    counted = {k: v for k, v in data.items() if k not in ("cache_control", "mcp_servers", "context_management")}
    _, request, _ = parse_messages({**counted, "max_tokens": 1})
    return request


class MessagesExchange(TranslatedExchange):
    """``POST /v1/messages`` (Anthropic Messages API)."""

    endpoint = "messages"
    id_prefix = "msg_"

    def __init__(self, data: dict[str, JSON]) -> None:
        self.body, self.request, self.chat_request = parse_messages(data)
        self.stream = bool(self.body.stream)
        self.generation: Generation | None = None
        """The backend's generation with ``toolu_`` tool-call ids (what both views of the answer show)."""

    def respond(self, generation: Generation, response_id: str) -> dict[str, JSON]:
        choices = [
            msgspec.structs.replace(
                choice,
                tool_calls=[
                    ToolCall(id=new_tool_use_id(), name=c.name, arguments=c.arguments) for c in choice.tool_calls
                ],
            )
            for choice in generation.choices[:1]
        ]
        self.generation = msgspec.structs.replace(generation, choices=choices)
        return message_response(self.generation, response_id)

    def events(self, response: dict[str, JSON], generation: Generation, chunk_chars: int) -> bytes:
        return message_stream(response, chunk_chars)


MESSAGES = Dialect("/messages", MessagesExchange, error_body)
