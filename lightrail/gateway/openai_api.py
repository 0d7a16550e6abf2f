"""OpenAI's HTTP API at the gateway boundary: request validation and response bodies.

Incoming bodies are decoded once to plain JSON (that dict is what the span records as the request) and then
converted into the typed request structs below, so a missing or ill-typed field is named in a 400 error
(``param``), as OpenAI does. Accepted requests become the backend-facing `ChatRequest` / `CompletionRequest`
of `lightrail.types`; a backend's `Generation` becomes the response dict the agent receives (and the span
records).

Fields that OpenAI clients send as hints (``user``, ``metadata``, ``store``, ``parallel_tool_calls``, ...) are
ignored. Fields that would change what is sampled and that no backend is asked to honour (penalties,
``logit_bias``, structured ``response_format``, ``echo``/``suffix``/``best_of``) are refused with a 400 when
set to a non-default value: silently ignoring them would record training data sampled from a different
distribution than the agent asked for.

Token strings are not part of a `Generation` (backends report ids), so logprob entries name each token as
``"token_id:<id>"``, vLLM's ``return_tokens_as_token_ids`` convention.

vLLM extension: a request with ``"return_token_ids": true`` gets ``prompt_token_ids`` and per-choice
``token_ids`` in the response (vLLM >= 0.10.2 field names), so one gateway can serve as another's upstream.
"""

from __future__ import annotations

import os
import re
import time
from typing import Annotated, Any, Literal

import msgspec

from lightrail.gateway.dialect import Dialect, Exchange
from lightrail.types import ChatRequest, Choice, CompletionRequest, Generation, SamplingParams

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "ChatCompletionBody",
    "CompletionBody",
    "InvalidRequest",
    "chat_response",
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


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str
    n: _N | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    max_tokens: _MaxTokens | None = None
    stop: _Stop = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    """vLLM extension: include ``prompt_token_ids`` / ``token_ids`` in the response."""
    # Refused unless default (see module docstring); typed so a bad type is still named precisely.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionBody(_SamplingFields, kw_only=True):
    """The fields of a chat-completions request the gateway reads (others are ignored)."""

    messages: Annotated[list[dict[str, JSON]], msgspec.Meta(min_length=1)]
    tools: list[dict[str, JSON]] | None = None
    tool_choice: str | dict[str, JSON] | None = None
    max_completion_tokens: _MaxTokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    response_format: dict[str, JSON] | None = None


class CompletionBody(_SamplingFields, kw_only=True):
    """The fields of a (legacy) completions request the gateway reads (others are ignored)."""

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
    return path or None


def decode_json(body: bytes) -> dict[str, JSON]:
    """Decode a request body into a JSON object, or raise `InvalidRequest`."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return data


def _convert(data: dict[str, JSON], type_: type) -> Any:
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        param = _param_of(exc)
        message = str(exc).split(" - at ")[0]
        raise InvalidRequest(f"Invalid value for '{param}': {message}" if param else message, param=param) from None


def _refuse_unsupported(body: _SamplingFields) -> None:
    if body.presence_penalty:
        raise InvalidRequest("presence_penalty is not supported by this gateway.", param="presence_penalty")
    if body.frequency_penalty:
        raise InvalidRequest("frequency_penalty is not supported by this gateway.", param="frequency_penalty")
    if body.logit_bias:
        raise InvalidRequest("logit_bias is not supported by this gateway.", param="logit_bias")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options is only allowed when stream is true.", param="stream_options")


def _sampling(body: _SamplingFields, max_tokens: int | None) -> SamplingParams:
    stop = body.stop
    return SamplingParams(
        n=body.n or 1,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_tokens=max_tokens,
        stop=[stop] if isinstance(stop, str) else (stop or []),
        seed=body.seed,
    )


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _check_messages(messages: list[dict[str, JSON]]) -> None:
    for i, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(f"messages[{i}] is missing its 'role'.", param=f"messages[{i}].role")
        if role not in _ROLES:
            raise InvalidRequest(
                f"Invalid value for 'messages[{i}].role': {role!r}; expected one of {sorted(_ROLES)}.",
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
    if body.top_logprobs:
        raise InvalidRequest(
            "top_logprobs > 0 is not supported: the gateway reports the sampled token's logprob only.",
            param="top_logprobs",
        )
    fmt = body.response_format
    if fmt is not None and fmt.get("type", "text") != "text":
        raise InvalidRequest("Only response_format {'type': 'text'} is supported.", param="response_format")
    _check_messages(body.messages)
    _check_tools(body.tools, body.tool_choice)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    request = ChatRequest(
        model=body.model,
        messages=body.messages,
        tools=body.tools or None,
        tool_choice=body.tool_choice,
        sampling=_sampling(body, max_tokens),
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
    request = CompletionRequest(model=body.model, prompt=prompt, sampling=_sampling(body, max_tokens))
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


def token_label(token_id: int) -> str:
    return f"token_id:{token_id}"


def chat_logprobs(token_ids: list[int] | None, logprobs: list[float] | None) -> dict[str, JSON] | None:
    """OpenAI's ``choice.logprobs`` for chat (sampled tokens only, no alternatives)."""
    if token_ids is None or logprobs is None:
        return None
    content = [
        {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
        for t, lp in zip(token_ids, logprobs, strict=False)
    ]
    return {"content": content, "refusal": None}


def chat_message(choice: Choice) -> dict[str, JSON]:
    message: dict[str, JSON] = {"role": "assistant", "content": choice.text}
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
            "logprobs": chat_logprobs(choice.token_ids, choice.logprobs) if logprobs else None,
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
    return response


def completion_logprobs(token_ids: list[int] | None, logprobs: list[float] | None) -> dict[str, JSON] | None:
    """OpenAI's legacy ``choice.logprobs`` (sampled tokens only; no text offsets, no alternatives)."""
    if token_ids is None or logprobs is None:
        return None
    return {
        "tokens": [f"token_id:{t}" for t in token_ids],
        "token_logprobs": list(logprobs),
        "top_logprobs": None,
        "text_offset": None,
    }


def completion_response(
    generation: Generation, *, response_id: str, logprobs: bool, token_ids: bool = False
) -> dict[str, JSON]:
    """The ``text_completion`` object for a generation."""
    choices = []
    for i, choice in enumerate(generation.choices):
        out: dict[str, JSON] = {
            "index": i,
            "text": choice.text,
            "logprobs": completion_logprobs(choice.token_ids, choice.logprobs) if logprobs else None,
            # a text completion has no tool calls; "tool_calls" can only come from a confused backend
            "finish_reason": "stop" if choice.finish_reason == "tool_calls" else choice.finish_reason,
        }
        if token_ids:
            out["prompt_token_ids"] = generation.prompt_ids
            out["token_ids"] = choice.token_ids
        choices.append(out)
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": generation.model,
        "choices": choices,
        "usage": usage_of(generation),
        "system_fingerprint": None,
    }


Endpoint = Literal["chat.completions", "completions"]


# -- dialects -------------------------------------------------------------------------------------------------


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
