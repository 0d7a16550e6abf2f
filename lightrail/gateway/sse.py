"""Server-sent events in OpenAI's streaming format, produced from a complete response.

The gateway asks its backend for the whole generation and then replays it as chunks. This is on purpose: the
token ids recorded for a streamed call are then exactly those of the same call made without streaming, and
the chunks an agent assembles equal the message the span records. The cost is time-to-first-token (the
agent sees the first chunk when the generation is done), which training does not care about.

Chunk sequence per choice, as OpenAI sends it: a role delta, content deltas (carrying their share of the
logprobs), one delta per tool call announcing id/name followed by its arguments, then an empty delta with
``finish_reason``; after all choices an optional usage chunk (``stream_options.include_usage``), then
``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from lightrail.gateway.logprobs import chat_logprobs, completion_logprobs

__all__ = ["chat_stream", "completion_stream"]

_encode = msgspec.json.encode
DONE = b"data: [DONE]\n\n"

#: Characters per content delta: small enough that clients see real incremental deltas.
CHUNK_CHARS = 64


def _event(obj: Any) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


def _pieces(text: str, n_tokens: int, chunk_chars: int) -> list[tuple[str, int, int]]:
    """Split ``text`` into deltas and give each a contiguous, in-order share of the ``n_tokens`` tokens.

    Without the tokenizer the split cannot follow token boundaries; what matters to clients is that the
    concatenation of deltas (and of their logprobs) is the whole.
    """
    k = max(1, -(-len(text) // chunk_chars))
    bounds = [(i * n_tokens) // k for i in range(k + 1)]
    return [(text[i * chunk_chars : (i + 1) * chunk_chars], bounds[i], bounds[i + 1]) for i in range(k)]


def chat_stream(
    response: dict[str, Any],
    choices: list[Any],
    *,
    logprobs: bool,
    include_usage: bool,
    token_ids: bool = False,
    chunk_chars: int = CHUNK_CHARS,
) -> bytes:
    """All SSE events of a streamed chat completion, from its (non-streamed) ``response`` dict and the
    backend's `lightrail.types.Choice` list (for token ids and logprobs).

    Every token id and logprob is carried by exactly one chunk, in order: by the content deltas when there is
    text, else by the first tool-call delta, else by an empty content delta.
    """
    head: dict[str, Any] = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
        "system_fingerprint": None,
    }
    if include_usage:
        head["usage"] = None  # OpenAI sends null usage on every chunk but the last when usage is requested
    out: list[bytes] = []

    def emit(index: int, delta: dict[str, Any], *, finish: str | None = None, span: tuple[int, int] | None = None):
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        ids, lps = choices[index].token_ids, choices[index].logprobs
        if span is not None and ids is not None:
            lo, hi = span
            if logprobs and lps is not None:
                choice["logprobs"] = chat_logprobs(choices[index], lo, hi)
            if token_ids:
                choice["token_ids"] = ids[lo:hi]
        event = {**head, "choices": [choice]}
        if token_ids and not out:  # vLLM puts the prompt ids on the first chunk only
            event["prompt_token_ids"] = response.get("prompt_token_ids")
        out.append(_event(event))

    for index, body in enumerate(response["choices"]):
        message = body["message"]
        ids = choices[index].token_ids
        n_tokens = len(ids) if ids is not None else 0
        emit(index, {"role": "assistant", "content": "" if message["content"] is not None else None})
        text = message["content"] or ""
        carried = 0
        if message.get("reasoning_content"):  # reasoning streams first, as the model wrote it (token ids go with text)
            for piece, _, _ in _pieces(message["reasoning_content"], 0, chunk_chars):
                emit(index, {"reasoning_content": piece})
        for piece, lo, hi in _pieces(text, n_tokens, chunk_chars) if text else ():
            emit(index, {"content": piece}, span=(lo, hi))
            carried = hi
        for j, call in enumerate(message.get("tool_calls") or ()):
            function = call["function"]
            announce = {"index": j, "id": call["id"], "type": "function"}
            announce["function"] = {"name": function["name"], "arguments": ""}
            emit(index, {"tool_calls": [announce]}, span=(carried, n_tokens) if j == 0 else None)
            carried = n_tokens
            emit(index, {"tool_calls": [{"index": j, "function": {"arguments": function["arguments"]}}]})
        if carried < n_tokens:  # no text and no tool call, yet tokens (an EOS alone, say)
            emit(index, {"content": ""}, span=(carried, n_tokens))
        emit(index, {}, finish=body["finish_reason"])
    if include_usage:
        out.append(_event({**head, "choices": [], "usage": response["usage"]}))
    out.append(DONE)
    return b"".join(out)


def completion_stream(
    response: dict[str, Any],
    choices: list[Any],
    *,
    logprobs: bool,
    include_usage: bool,
    token_ids: bool = False,
    chunk_chars: int = CHUNK_CHARS,
) -> bytes:
    """All SSE events of a streamed text completion (see `chat_stream`)."""
    head = {
        "id": response["id"],
        "object": "text_completion",
        "created": response["created"],
        "model": response["model"],
        "system_fingerprint": None,
    }
    if include_usage:
        head["usage"] = None
    out = []
    for index, (body, choice) in enumerate(zip(response["choices"], choices, strict=True)):
        ids = choice.token_ids
        n_tokens = len(ids) if ids is not None else 0
        text = body["text"]
        pieces = _pieces(text, n_tokens, chunk_chars) if text else [("", 0, n_tokens)]
        for k, (piece, lo, hi) in enumerate(pieces):
            lp = None
            if logprobs and ids is not None and choice.logprobs is not None:
                lp = completion_logprobs(choice, lo, hi)
            c: dict[str, Any] = {"index": index, "text": piece, "logprobs": lp, "finish_reason": None}
            if token_ids:
                if k == 0:
                    c["prompt_token_ids"] = body.get("prompt_token_ids")
                c["token_ids"] = ids[lo:hi] if ids is not None else None
            out.append(_event({**head, "choices": [c]}))
        last = {"index": index, "text": "", "logprobs": None, "finish_reason": body["finish_reason"]}
        out.append(_event({**head, "choices": [last]}))
    if include_usage:
        out.append(_event({**head, "choices": [], "usage": response["usage"]}))
    out.append(DONE)
    return b"".join(out)
