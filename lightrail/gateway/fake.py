"""`ScriptedBackend`: a fake model backend for tests and benchmarks (no model, near-zero latency).

It answers from a script (or echoes the last user message) and reports deterministic fake token ids and
logprobs with the same shape a real engine reports, so everything downstream (gateway, spans, adapters,
training code paths) can be exercised without a model.

Its "tokenizer" is UTF-8 bytes: token id = byte value + `ScriptedBackend.ID_OFFSET`. So the ids of a choice
decode (`ScriptedBackend.decode`) to exactly its raw text, as with a real backend, and a test can check that a
span's ids match the text an agent received. A tool call is written into the raw text as Hermes-style markup
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) before being parsed out, like real tool-calling
models do.

Example::

    backend = ScriptedBackend(["Hello!", ScriptedReply(tool_calls=[("get_weather", {"city": "Paris"})])])
    app = create_gateway_app(backend, store)
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from lightrail.types import (
    BackendError,
    ChatRequest,
    Choice,
    CompletionRequest,
    FinishReason,
    Generation,
    ToolCall,
    content_text,
)

__all__ = ["ScriptedBackend", "ScriptedReply"]


class ScriptedReply(msgspec.Struct, kw_only=True):
    """One scripted answer: text and/or tool calls given as ``(name, arguments dict)`` pairs."""

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = msgspec.field(default_factory=list)


Reply = str | ScriptedReply | BackendError
Script = Sequence[Reply] | Callable[[ChatRequest | CompletionRequest], Reply]


class ScriptedBackend:
    """A fake backend answering from a script; implements the gateway's `Backend` protocol.

    ``script``: None echoes (the last user message for chat, the prompt for completions); a sequence is
    answered in order, one item per choice, cycling when exhausted; a callable gets the request and returns
    the reply for each choice. A `BackendError` item is raised instead of answered (to test error paths).
    Options a script cannot honour (penalties, ``logit_bias``) are refused by name; ``top_logprobs`` lists the
    scripted token first with its fake logprob, then made-up alternatives, each 1 nat less likely; a
    ``response_format`` is honoured by checking the scripted text against it (a reply that is not such JSON is
    refused, so a test's script cannot silently break the contract an engine would keep).
    ``delay_s`` simulates generation time (awaited, so it never blocks the event loop).

    Concurrency model: single event loop; the script cursor advances atomically between awaits.
    """

    ID_OFFSET = 10
    """Fake token id of byte ``b`` is ``b + ID_OFFSET`` (ids below it are never produced)."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        model: str = "scripted-fake",
        policy_version: int | None = 0,
        delay_s: float = 0.0,
    ) -> None:
        self.model = model
        self.policy_version = policy_version
        self.delay_s = delay_s
        self._script = script
        self._cursor = itertools.cycle(script) if isinstance(script, Sequence) and script else None
        self.requests: list[ChatRequest | CompletionRequest] = []
        """Every request received, oldest first (for tests to inspect what the gateway forwarded)."""

    # -- Backend protocol -----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return [self.model]

    async def chat(self, request: ChatRequest) -> Generation:
        return await self._generate(request, self._prompt(request), _last_user_text(request.messages))

    async def count_tokens(self, request: ChatRequest) -> int:
        """Tokens of the prompt `chat` would send for ``request`` (fake ids: one per UTF-8 byte)."""
        return len(self.encode(self._prompt(request)))

    @staticmethod
    def _prompt(request: ChatRequest) -> str:
        prompt = "".join(f"<|{m.get('role')}|>{content_text(m.get('content'))}\n" for m in request.messages)
        if request.tools:
            prompt = f"<|tools|>{json.dumps(request.tools, sort_keys=True)}\n" + prompt
        return prompt + "<|assistant|>"

    async def complete(self, request: CompletionRequest) -> Generation:
        return await self._generate(request, request.prompt, request.prompt)

    # -- fake tokenizer -------------------------------------------------------------------------------------

    @classmethod
    def encode(cls, text: str) -> list[int]:
        """Fake token ids of ``text`` (its UTF-8 bytes, offset)."""
        off = cls.ID_OFFSET
        return [b + off for b in text.encode()]

    @classmethod
    def decode(cls, token_ids: Sequence[int]) -> str:
        """The text of fake token ids (inverse of `encode`)."""
        off = cls.ID_OFFSET
        return bytes(t - off for t in token_ids).decode()

    # -- generation -----------------------------------------------------------------------------------------

    async def _generate(self, request: ChatRequest | CompletionRequest, prompt: str, echo: str) -> Generation:
        self.requests.append(request)
        sampling = request.sampling
        if sampling.max_tokens is not None and sampling.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1", param="max_tokens")
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        for name in ("presence_penalty", "frequency_penalty", "logit_bias"):
            if getattr(sampling, name):
                raise BackendError(f"{name} is not supported by the scripted backend (it has no model)", param=name)
        choices = [self._choice(self._next_reply(request, echo), request, i) for i in range(sampling.n)]
        if isinstance(request, ChatRequest) and request.response_format is not None:
            for choice in choices:
                _check_format(choice, request.response_format)
        return Generation(
            model=request.model or self.model,
            prompt_ids=self.encode(prompt),
            choices=choices,
            policy_version=self.policy_version,
        )

    def _next_reply(self, request: ChatRequest | CompletionRequest, echo: str) -> Reply:
        if self._script is None:
            return echo
        if self._cursor is not None:
            return next(self._cursor)
        if callable(self._script):
            return self._script(request)
        return echo  # an empty sequence echoes too

    def _choice(self, reply: Reply, request: ChatRequest | CompletionRequest, index: int) -> Choice:
        if isinstance(reply, BackendError):
            raise reply
        if isinstance(reply, str):
            reply = ScriptedReply(text=reply)
        sampling = request.sampling
        text = reply.text
        finish: FinishReason = "stop"
        matched: str | None = None
        for stop_string in sampling.stop:
            cut = text.find(stop_string)
            if cut >= 0:
                text, matched = text[:cut], stop_string
        calls: list[ToolCall] = []
        raw = text
        if reply.tool_calls and isinstance(request, ChatRequest):
            for k, (name, arguments) in enumerate(reply.tool_calls):
                args = json.dumps(arguments)
                raw += f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {args}}}</tool_call>'
                calls.append(ToolCall(id=f"call_{index}_{k}_{len(self.requests)}", name=name, arguments=args))
            finish = "tool_calls"
        if sampling.max_tokens is not None and len(raw.encode()) > sampling.max_tokens:
            # cut mid-way: whatever markup survives is plain text, as a real model's unparsed output would be
            raw = _utf8_prefix(raw, sampling.max_tokens)
            text, calls, finish, matched = raw, [], "length", None
        token_ids = self.encode(raw)
        seed = sampling.seed or 0
        # deterministic, plausible-looking logprobs in (-2.0, -0.01]
        logprobs = [-(((t * 2654435761 + p * 40503 + seed) % 199) + 1) / 100.0 for p, t in enumerate(token_ids)]
        stop = matched if finish == "stop" else None
        k = sampling.top_logprobs
        top = [[(t + j, lp - j) for j in range(k)] for t, lp in zip(token_ids, logprobs, strict=True)] if k else None
        return Choice(
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            top_logprobs=top,
            finish_reason=finish,
            tool_calls=calls,
            stop_sequence=stop,
        )


def _check_format(choice: Choice, response_format: dict[str, Any]) -> None:
    """Raise `BackendError` unless a choice's text is the JSON ``response_format`` asks for."""
    if choice.tool_calls or choice.finish_reason == "length":
        return  # a tool call answers instead of the text; a cut text cannot be whole JSON (as with an engine)
    try:
        value = json.loads(choice.text)
    except ValueError:
        value = None
    problem = None if isinstance(value, dict) else "is not a JSON object"
    schema = (response_format.get("json_schema") or {}).get("schema")
    if problem is None and schema is not None:
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
        problem = None if error is None else f"does not match the schema: {error.message}"
    if problem is not None:
        raise BackendError(
            f"response_format: the scripted reply {choice.text[:80]!r} {problem}", param="response_format"
        )


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 encoding has at most ``max_bytes`` bytes."""
    return text.encode()[:max_bytes].decode(errors="ignore")


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""
