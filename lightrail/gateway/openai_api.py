"""OpenAI's HTTP API at the gateway boundary: request validation and response bodies.

Incoming bodies are decoded once to plain JSON (that dict is what the span records as the request) and then
converted into the typed request structs below, so a missing or ill-typed field is named in a 400 error
(``param``), as OpenAI does. Accepted requests become the backend-facing `ChatRequest` / `CompletionRequest`
of `lightrail.types`; a backend's `Generation` becomes the response dict the agent receives (and the span
records).

Every option OpenAI documents is either honoured or refused: sampling options (penalties, ``logit_bias``,
``top_logprobs``, ``response_format``, ``parallel_tool_calls``, ``seed``, ``stop``, ``n``) go to the backend, which
enforces them (the embedded engine: `lightrail.engine`) or passes them on (an upstream), and a backend that cannot
honour one refuses it by name (`lightrail.types.BackendError`, a 400). Hints that do not change what is sampled
(``user``, ``metadata``, ``store``, ``service_tier``, ...) are accepted and not acted on. Options no backend here
can honour (audio, predicted outputs, web search, reasoning effort, ``echo``/``suffix``/``best_of``) are refused
with a 400 when set to a non-default value: silently ignoring them would record training data sampled from a
different distribution than the agent asked for. A field OpenAI does not know is refused as OpenAI refuses it
("Unrecognized request argument supplied"), except vLLM's ``return_token_ids`` / ``return_tokens_as_token_ids``.

Messages: ``developer`` reaches the backend as ``system`` (open-weight chat templates have no developer turn), text
parts (and an assistant's ``refusal``, part or field) as text, ``reasoning`` as ``reasoning_content``; any other
content part, the deprecated ``function`` role and ``function_call``, ``audio`` and keys a chat message does not have
are refused by name (`_chat_messages`; null values are ignored, as clients dump them back from a response). Every
field's treatment is listed in `lightrail.gateway.fields`.

A ``json_schema`` response format is checked to be a valid JSON Schema here (`check_response_format`), so a
malformed schema is a 400 that says what is wrong before any backend sees it.

Token strings are not part of a `Generation` (backends report ids), so logprob entries name each token as
``"token_id:<id>"``, vLLM's ``return_tokens_as_token_ids`` convention.

vLLM extension: a request with ``"return_token_ids": true`` gets ``prompt_token_ids`` and per-choice
``token_ids`` in the response (vLLM >= 0.10.2 field names), so one gateway can serve as another's upstream; such
a response also carries lightrail's ``logprobs_processed`` (`Generation.logprobs_processed`), so the downstream
gateway records which distribution the logprobs come from.
"""

from __future__ import annotations

import os
import re
import time
from typing import Annotated, Any, Literal

import msgspec

from lightrail.gateway.dialect import Dialect, Exchange
from lightrail.gateway.logprobs import chat_logprobs, completion_logprobs
from lightrail.types import Attr, ChatRequest, Choice, CompletionRequest, Generation, SamplingParams, content_text

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "ChatCompletionBody",
    "CompletionBody",
    "InvalidRequest",
    "TranslatedExchange",
    "chat_response",
    "check_json_schema",
    "check_response_format",
    "completion_response",
    "error_body",
    "parse_chat",
    "parse_completion",
]

JSON = Any

MAX_N = 128


class InvalidRequest(Exception):
    """A request the gateway refuses before it reaches a backend; becomes an OpenAI-style error body."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    status: int | None = None,
) -> dict[str, JSON]:
    """OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None


_Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
_TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
_N = Annotated[int, msgspec.Meta(ge=1, le=MAX_N)]
_MaxTokens = Annotated[int, msgspec.Meta(ge=1)]
_Stop = str | Annotated[list[str], msgspec.Meta(max_length=16)] | None


_Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]


class _SamplingFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    n: _N | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    max_tokens: _MaxTokens | None = None
    stop: _Stop = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    return_token_ids: bool | None = None
    """vLLM extension: include ``prompt_token_ids`` / ``token_ids`` in the response."""
    return_tokens_as_token_ids: bool | None = None
    """vLLM extension: name logprob tokens ``token_id:<id>`` (what this gateway always does)."""


class ChatCompletionBody(_SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """A chat-completions request: every field OpenAI documents (see the module docstring for which are
    honoured, accepted as hints, or refused)."""

    messages: Annotated[list[dict[str, JSON]], msgspec.Meta(min_length=1)]
    tools: list[dict[str, JSON]] | None = None
    tool_choice: str | dict[str, JSON] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: _MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    response_format: dict[str, JSON] | None = None
    # hints: accepted, not acted on
    metadata: Annotated[dict[str, str], msgspec.Meta(max_length=16)] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # refused when set (no backend here can honour them); typed so a bad type is still named precisely
    modalities: list[str] | None = None
    audio: dict[str, JSON] | None = None
    prediction: dict[str, JSON] | None = None
    web_search_options: dict[str, JSON] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    functions: list[dict[str, JSON]] | None = None
    function_call: str | dict[str, JSON] | None = None


class CompletionBody(_SamplingFields, kw_only=True, forbid_unknown_fields=True):
    """A (legacy) completions request: every field OpenAI documents."""

    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


def _param_of(err: msgspec.ValidationError) -> str | None:
    """The dotted field path a msgspec validation message points at (``messages[0].role``)."""
    text = str(err)
    at = _AT.search(text)
    path = at.group(1) if at else ""
    missing = _MISSING.search(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return path.replace("[...]", "") or None  # msgspec's "any key of a dict": the dict is the field


def decode_json(body: bytes) -> dict[str, JSON]:
    """Decode a request body into a JSON object, or raise `InvalidRequest`."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


_UNKNOWN = re.compile(r"Object contains unknown field `([^`]*)`")


def _convert(data: dict[str, JSON], type_: type) -> Any:
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        unknown = _UNKNOWN.search(str(exc))
        if unknown and " - at `$." not in str(exc):  # a top-level field OpenAI does not know
            name = unknown.group(1)
            raise InvalidRequest(f"Unrecognized request argument supplied: {name}", param=name) from None
        param = _param_of(exc)
        message = str(exc).split(" - at ")[0]
        raise InvalidRequest(f"Invalid value for '{param}': {message}" if param else message, param=param) from None


def _refuse_unsupported(body: _SamplingFields) -> None:
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")


def _refuse_unservable(body: ChatCompletionBody) -> None:
    """Options no backend of this gateway can honour: a 400 naming the option when it is set."""
    if body.modalities is not None and body.modalities != ["text"]:
        raise InvalidRequest("Only modalities ['text'] are supported by this gateway.", param="modalities")
    for name in ("audio", "prediction", "web_search_options", "reasoning_effort", "verbosity"):
        if getattr(body, name) is not None:
            raise InvalidRequest(f"{name} is not supported by this gateway.", param=name)
    if body.functions is not None or body.function_call is not None:
        param = "functions" if body.functions is not None else "function_call"
        raise InvalidRequest(
            f"{param} (deprecated) is not supported by this gateway; use tools and tool_choice.", param=param
        )


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """OpenAI's string token-id keys as ints (the backend checks they are in its vocabulary)."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if token < 0 or str(token) != key.strip():
            raise InvalidRequest(
                f"Invalid value for 'logit_bias': keys must be token ids (non-negative integers), got {key!r}.",
                param="logit_bias",
            )
        out[token] = value
    return out


def _sampling(body: _SamplingFields, max_tokens: int | None, top_logprobs: int = 0) -> SamplingParams:
    stop = body.stop
    return SamplingParams(
        n=body.n or 1,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=max_tokens,
        stop=[stop] if isinstance(stop, str) else (stop or []),
        seed=body.seed,
        top_logprobs=top_logprobs,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        logit_bias=_logit_bias(body.logit_bias),
    )


_SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def check_json_schema(schema: JSON, *, name: str, param: str) -> None:
    """Raise `InvalidRequest` (naming ``param`` and where in the schema) unless ``schema`` is a valid JSON
    Schema: checked against its own metaschema (``$schema``, else draft 2020-12) with ``jsonschema``."""
    if not isinstance(schema, dict):
        raise InvalidRequest(
            f"Invalid schema for response format '{name}': the schema must be a JSON object.", param=param
        )
    import jsonschema  # a few ms on first use; only requests with a schema pay it

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidRequest(
            f"Invalid JSON schema '{name}' in {param}: at {where}: {exc.message}", param=param
        ) from None


def check_response_format(fmt: JSON, param: str = "response_format") -> dict[str, JSON] | None:
    """Validate OpenAI's chat ``response_format`` (``param`` names it in errors); None for free text.

    ``json_schema`` needs a ``name`` (OpenAI's pattern) and, when a ``schema`` is given, a valid JSON Schema
    (checked against its metaschema with ``jsonschema``); a ``json_schema`` without a schema means any JSON
    object, as with ``json_object``."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest(f"Invalid type for '{param}': expected an object.", param=param)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidRequest(
            f"Invalid value for '{param}.type': {kind!r}; expected 'text', 'json_object' or 'json_schema'.",
            param=f"{param}.type",
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest(f"Missing required parameter: '{param}.json_schema'.", param=f"{param}.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise InvalidRequest(
            f"Invalid value for '{param}.json_schema.name': expected 1-64 letters, digits, '_' or '-'.",
            param=f"{param}.json_schema.name",
        )
    schema = spec.get("schema")
    if schema is None:
        return {"type": "json_object"}
    check_json_schema(schema, name=name, param=f"{param}.json_schema.schema")
    return {"type": "json_schema", "json_schema": spec}


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_AS_ROLE = {"developer": "system"}
"""Roles the backend gets under another name: open-weight chat templates have no ``developer`` turn (Qwen2.5's and
Qwen3's skip it), and OpenAI defines it as the system prompt of its newer models."""


def _chat_messages(messages: list[dict[str, JSON]]) -> list[dict[str, JSON]]:
    """The messages the backend renders, checked: ``developer`` as ``system``; content parts as text (``text``
    parts, and an assistant's ``refusal`` parts as the text it refused with). A part the model cannot be shown
    (images, audio, files) and the deprecated ``function`` role are refused with a 400 naming them: dropping them
    would record a call for training on a prompt the agent did not send. Messages are copied only when changed."""
    out = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(f"messages[{i}] is missing its 'role'.", param=f"messages[{i}].role")
        if role not in _ROLES:
            raise InvalidRequest(
                f"Invalid value for 'messages[{i}].role': {role!r}; expected one of {sorted(_ROLES)}.",
                param=f"messages[{i}].role",
            )
        if role == "function":
            raise InvalidRequest(
                f"messages[{i}].role 'function' (deprecated) is not supported by this gateway; send tool results "
                "as role 'tool' with a 'tool_call_id'.",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"Invalid type for 'messages[{i}].content': expected a string, an array of parts or null.",
                param=f"messages[{i}].content",
            )
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise InvalidRequest(
                f"messages[{i}] has role 'tool' but no 'tool_call_id'.", param=f"messages[{i}].tool_call_id"
            )
        for key, value in message.items():
            if value is None or key in _MESSAGE_KEYS:
                continue  # null keys are what clients dump back from a response object (refusal, audio, ...)
            if key in _UNSERVABLE_KEYS:
                raise InvalidRequest(
                    f"messages[{i}].{key} is not supported by this gateway ({_UNSERVABLE_KEYS[key]}).",
                    param=f"messages[{i}].{key}",
                )
            raise InvalidRequest(
                f"Unrecognized argument messages[{i}].{key}: a chat message has {', '.join(_MESSAGE_KEYS)}.",
                param=f"messages[{i}].{key}",
            )
        if role in _AS_ROLE:
            message = {**message, "role": _AS_ROLE[role]}
        if isinstance(content, list):
            message = {**message, "content": _text_parts(content, i, role)}
        reasoning = message.get("reasoning")
        if reasoning is not None:  # newer vLLM releases name it so; templates read reasoning_content
            message = {k: v for k, v in message.items() if k != "reasoning"}
            message.setdefault("reasoning_content", reasoning)
        refusal = message.get("refusal")
        if role == "assistant" and isinstance(refusal, str) and refusal:
            # the text the assistant refused with is what it said: shown as its content
            text = content_text(message.get("content"))
            message = {k: v for k, v in message.items() if k != "refusal"}
            message["content"] = f"{text}{refusal}" if text else refusal
        out.append(message)
    return out


_MESSAGE_KEYS = (
    "role", "content", "name", "tool_calls", "tool_call_id", "refusal", "reasoning_content", "reasoning", "annotations",
)  # fmt: skip
"""Message keys the gateway reads; ``name`` and ``annotations`` are recorded, the others shown to the model."""
_UNSERVABLE_KEYS = {
    "audio": "no audio: send the transcript as content",
    "function_call": "deprecated; use tool_calls",
}


def _text_parts(parts: list[JSON], i: int, role: str) -> list[dict[str, JSON]]:
    out = []
    for j, part in enumerate(parts):
        at = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" and role == "assistant" else "text" if kind == "text" else None
        if key is None:
            raise InvalidRequest(
                f"{at}.type {kind!r} is not supported by this gateway: the model is shown text only "
                f"({'text and refusal parts' if role == 'assistant' else 'text parts'}).",
                param=f"{at}.type",
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise InvalidRequest(f"Invalid type for '{at}.{key}': expected a string.", param=f"{at}.{key}")
        out.append({"type": "text", "text": text})
    return out


def _check_tools(tools: list[dict[str, JSON]] | None, tool_choice: JSON) -> None:
    names = set()
    for i, tool in enumerate(tools or ()):
        if tool.get("type") != "function":
            raise InvalidRequest(f"tools[{i}].type must be 'function'.", param=f"tools[{i}].type")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"tools[{i}].function.name is required.", param=f"tools[{i}].function.name")
        names.add(function["name"])
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    if tool_choice == "required":
        if not tools:
            raise InvalidRequest("tool_choice 'required' needs tools.", param="tool_choice")
        return
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") == "function" and isinstance(name, str):
            if name not in names:
                raise InvalidRequest(f"tool_choice names an unknown function {name!r}.", param="tool_choice")
            return
    raise InvalidRequest(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}.",
        param="tool_choice",
    )


def parse_chat(data: dict[str, JSON]) -> tuple[ChatCompletionBody, ChatRequest]:
    """Validate a chat-completions body; returns the typed body and the backend request, or raises
    `InvalidRequest` naming the bad field."""
    body: ChatCompletionBody = _convert(data, ChatCompletionBody)
    _refuse_unsupported(body)
    _refuse_unservable(body)
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("logprobs must be true when top_logprobs is set.", param="top_logprobs")
    response_format = check_response_format(body.response_format)
    messages = _chat_messages(body.messages)
    _check_tools(body.tools, body.tool_choice)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=body.tools or None,
        tool_choice=body.tool_choice,
        response_format=response_format,
        parallel_tool_calls=body.parallel_tool_calls if body.tools else None,
        sampling=_sampling(body, max_tokens, body.top_logprobs or 0),
    )
    return body, request


#: OpenAI's documented default for the legacy completions endpoint (vLLM keeps it too).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def parse_completion(data: dict[str, JSON]) -> tuple[CompletionBody, CompletionRequest]:
    """Validate a completions body (one text prompt); returns the typed body and the backend request."""
    body: CompletionBody = _convert(data, CompletionBody)
    _refuse_unsupported(body)
    if body.echo:
        raise InvalidRequest("echo is not supported by this gateway.", param="echo")
    if body.suffix:
        raise InvalidRequest("suffix is not supported by this gateway.", param="suffix")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise InvalidRequest("best_of is not supported by this gateway.", param="best_of")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    sampling = _sampling(body, max_tokens, body.logprobs or 0)
    request = CompletionRequest(model=body.model, prompt=prompt, sampling=sampling)
    return body, request


# -- responses ------------------------------------------------------------------------------------------------


def new_response_id(prefix: str) -> str:
    """``chatcmpl-...`` / ``resp_...``: the prefix and 24 random hex digits, unique enough to link rewards to
    calls."""
    return f"{prefix}{os.urandom(12).hex()}"


def usage_of(generation: Generation) -> dict[str, int]:
    """Token counts from the backend's ids (0 where a backend reports no ids)."""
    prompt = len(generation.prompt_ids) if generation.prompt_ids is not None else 0
    completion = sum(len(c.token_ids) for c in generation.choices if c.token_ids is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_message(choice: Choice) -> dict[str, JSON]:
    """The assistant ``message`` of a chat choice: content, ``tool_calls``, and the model's reasoning as
    ``reasoning_content`` (the field vLLM's reasoning parsers and DeepSeek's API use) when it reasoned."""
    message: dict[str, JSON] = {"role": "assistant", "content": choice.text}
    if choice.reasoning is not None:
        message["reasoning_content"] = choice.reasoning
    if choice.tool_calls:
        message["content"] = choice.text or None  # OpenAI sends null content next to tool calls
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in choice.tool_calls
        ]
    return message


def chat_response(
    generation: Generation, *, response_id: str, logprobs: bool, token_ids: bool = False
) -> dict[str, JSON]:
    """The ``chat.completion`` object for a generation."""
    choices = []
    for i, choice in enumerate(generation.choices):
        out: dict[str, JSON] = {
            "index": i,
            "message": chat_message(choice),
            "logprobs": chat_logprobs(choice) if logprobs else None,
            "finish_reason": choice.finish_reason,
        }
        if token_ids:
            out["token_ids"] = choice.token_ids
            out["stop_reason"] = choice.stop_sequence  # vLLM's field: the stop string that ended the choice
        choices.append(out)
    response: dict[str, JSON] = {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": generation.model,
        "choices": choices,
        "usage": usage_of(generation),
        "system_fingerprint": None,
    }
    if token_ids:
        response["prompt_token_ids"] = generation.prompt_ids
        response["logprobs_processed"] = generation.logprobs_processed  # lightrail's, for a gateway downstream
    return response


def completion_response(
    generation: Generation, *, response_id: str, logprobs: bool, token_ids: bool = False
) -> dict[str, JSON]:
    """The ``text_completion`` object for a generation."""
    choices = []
    for i, choice in enumerate(generation.choices):
        out: dict[str, JSON] = {
            "index": i,
            "text": choice.text,
            "logprobs": completion_logprobs(choice) if logprobs else None,
            # a text completion has no tool calls; "tool_calls" can only come from a confused backend
            "finish_reason": "stop" if choice.finish_reason == "tool_calls" else choice.finish_reason,
        }
        if token_ids:
            out["prompt_token_ids"] = generation.prompt_ids
            out["token_ids"] = choice.token_ids
        choices.append(out)
    response: dict[str, JSON] = {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": generation.model,
        "choices": choices,
        "usage": usage_of(generation),
        "system_fingerprint": None,
    }
    if token_ids:
        response["logprobs_processed"] = generation.logprobs_processed
    return response


Endpoint = Literal["chat.completions", "completions"]


# -- dialects -------------------------------------------------------------------------------------------------


class TranslatedExchange(Exchange):
    """An exchange of an API that is translated to chat for the backend (Responses, Anthropic Messages): the span
    records the chat view the adapters read (``chat_request`` and the answer as a chat completion of
    ``generation``, the choices that API returns) next to the API's own bodies."""

    chat_request: dict[str, JSON]
    generation: Generation | None = None

    def recorded(self, data: dict[str, JSON], response: dict[str, JSON] | None) -> dict[str, JSON]:
        chat = None
        if response is not None and self.generation is not None:
            chat = chat_response(self.generation, response_id=response["id"], logprobs=False)
        return {
            Attr.REQUEST: self.chat_request,
            Attr.RESPONSE: chat,
            Attr.DIALECT_REQUEST: data,
            Attr.DIALECT_RESPONSE: response,
        }


class ChatExchange(Exchange):
    """``POST /v1/chat/completions``."""

    endpoint = "chat.completions"
    id_prefix = "chatcmpl-"

    def __init__(self, data: dict[str, JSON]) -> None:
        self.body, self.request = parse_chat(data)
        self.stream = bool(self.body.stream)

    def respond(self, generation: Generation, response_id: str) -> dict[str, JSON]:
        body = self.body
        return chat_response(
            generation, response_id=response_id, logprobs=bool(body.logprobs), token_ids=bool(body.return_token_ids)
        )

    def events(self, response: dict[str, JSON], generation: Generation, chunk_chars: int) -> bytes:
        from lightrail.gateway.sse import chat_stream  # sse imports this module's logprob helpers

        body = self.body
        return chat_stream(
            response,
            generation.choices,
            logprobs=bool(body.logprobs),
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            token_ids=bool(body.return_token_ids),
            chunk_chars=chunk_chars,
        )


class CompletionExchange(Exchange):
    """``POST /v1/completions`` (legacy text completions)."""

    endpoint = "completions"
    id_prefix = "cmpl-"

    def __init__(self, data: dict[str, JSON]) -> None:
        self.body, self.request = parse_completion(data)
        self.stream = bool(self.body.stream)

    def respond(self, generation: Generation, response_id: str) -> dict[str, JSON]:
        body = self.body
        return completion_response(
            generation,
            response_id=response_id,
            logprobs=body.logprobs is not None,
            token_ids=bool(body.return_token_ids),
        )

    def events(self, response: dict[str, JSON], generation: Generation, chunk_chars: int) -> bytes:
        from lightrail.gateway.sse import completion_stream

        body = self.body
        return completion_stream(
            response,
            generation.choices,
            logprobs=body.logprobs is not None,
            include_usage=bool(body.stream_options and body.stream_options.include_usage),
            token_ids=bool(body.return_token_ids),
            chunk_chars=chunk_chars,
        )


CHAT = Dialect("/chat/completions", ChatExchange, error_body)
COMPLETIONS = Dialect("/completions", CompletionExchange, error_body)
