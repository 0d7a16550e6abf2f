"""What the gateway forwards to: the `Backend` protocol, `OpenAIUpstream`, a backend that is any
OpenAI-compatible server (vLLM, or another lightrail gateway), and `VersionedUpstream`, one whose weights a
trainer replaces while it serves.

A backend gets validated `ChatRequest` / `CompletionRequest`s and answers with a `Generation` carrying its own
token ids and logprobs (the training data). It raises `lightrail.types.BackendError` for problems the caller
can fix (the agent sees an OpenAI-style 4xx) and `UpstreamError` when the model server itself failed (502).
The embedded engine (`lightrail.engine.Engine`) implements the protocol structurally; this package never
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import msgspec

from lightrail._http import HTTPPool
from lightrail.types import (
    BackendError,
    ChatRequest,
    Choice,
    CompletionRequest,
    FinishReason,
    Generation,
    SamplingParams,
    ToolCall,
)

__all__ = ["Backend", "OpenAIUpstream", "UpstreamError", "VersionedUpstream", "close_backend"]


@runtime_checkable
class Backend(Protocol):
    """A model the gateway can forward to. Methods are called concurrently from one event loop."""

    async def chat(self, request: ChatRequest) -> Generation:
        """Sample ``request.sampling.n`` assistant turns for a conversation (chat template applied by the
        backend, whose token ids are reported in the `Generation`)."""
        ...

    async def complete(self, request: CompletionRequest) -> Generation:
        """Sample continuations of a text prompt."""
        ...

    def model_names(self) -> list[str]:
        """Names listed at ``/v1/models``."""
        ...


async def close_backend(backend: object) -> None:
    """Release what a backend holds (its ``aclose``, else its ``close``, sync or async); a backend with
    neither holds nothing to release."""
    closer = getattr(backend, "aclose", None) or getattr(backend, "close", None)
    if closer is not None and inspect.isawaitable(result := closer()):
        await result


class UpstreamError(Exception):
    """The upstream model server failed (unreachable, 5xx, unreadable answer): not the caller's fault."""

    status = 502


_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
}


# Typed views of the upstream's answers: msgspec validates the id lists in C while decoding, and fields a
# server does not send (``token_ids`` from a server without vLLM's extension) come back as None.
class _Function(msgspec.Struct):
    name: str
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function
    id: str = ""


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    reasoning_content: str | None = None  # vLLM with --reasoning-parser (and DeepSeek's API)
    reasoning: str | None = None  # newer vLLM releases name it so


class _TopLogprob(msgspec.Struct):
    token: str
    logprob: float


class _TokenLogprob(msgspec.Struct):
    logprob: float | None = None
    top_logprobs: list[_TopLogprob] | None = None


class _ChatLogprobs(msgspec.Struct):
    content: list[_TokenLogprob] | None = None


class _ChatChoice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None
    logprobs: _ChatLogprobs | None = None
    token_ids: list[int] | None = None
    stop_reason: str | int | None = None
    """vLLM: the stop string (or stop token id) that ended the choice."""


class _ChatCompletion(msgspec.Struct):
    choices: list[_ChatChoice]
    model: str = ""
    prompt_token_ids: list[int] | None = None
    logprobs_processed: list[str] | None = None
    """lightrail's extension (a gateway upstream): what shaped the distribution the logprobs come from."""


class _TextLogprobs(msgspec.Struct):
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None


class _TextChoice(msgspec.Struct):
    text: str = ""
    finish_reason: str | None = None
    logprobs: _TextLogprobs | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class _TextCompletion(msgspec.Struct):
    choices: list[_TextChoice]
    model: str = ""
    logprobs_processed: list[str] | None = None


class _Tokenized(msgspec.Struct):
    """vLLM's ``POST /tokenize`` answer (``max_model_len`` and the ids themselves are not needed here)."""

    count: int


_chat_decoder = msgspec.json.Decoder(_ChatCompletion)
_text_decoder = msgspec.json.Decoder(_TextCompletion)
_tokenized_decoder = msgspec.json.Decoder(_Tokenized)


class OpenAIUpstream:
    """Forward to an OpenAI-compatible server over HTTP, asking it for token ids and logprobs.

    The ids are requested with vLLM's documented extension ``"return_token_ids": true`` (vLLM >= 0.10.2:
    ``prompt_token_ids`` in the response, ``token_ids`` per choice) and sampled-token logprobs with
    ``"logprobs": true`` (chat) / ``"logprobs": 1`` (completions). A server that returns no ids yields a
    `Generation` with ``prompt_ids``/``token_ids`` None: the call is recorded with ``token_ids_available=False``
    and excluded from training, never re-tokenized. Against servers that reject unknown fields (OpenAI's
    own API) pass ``request_token_ids=False``.

    `count_tokens` (the gateway's Anthropic ``/v1/messages/count_tokens``) asks the upstream's tokenizer endpoint,
    vLLM's ``POST /tokenize`` at the server's root, which renders a chat as its ``/v1/chat/completions`` does (chat
    template, tools, the assistant turn opened). The count is the upstream's own, never an estimate: an upstream
    without that endpoint (OpenAI's API, another lightrail gateway, llama.cpp, SGLang) answers a 404 that says so.

    The sampling options an agent set are passed on (``response_format``, ``parallel_tool_calls``, penalties,
    ``logit_bias``, ``top_logprobs``): the upstream enforces them (vLLM does guided decoding itself) or refuses
    them, and its 4xx reaches the agent. Alternatives (``top_logprobs``) are asked as token ids (vLLM's
    ``return_tokens_as_token_ids``). The logprobs are what the upstream reports: vLLM reports the model's raw
    distribution unless it was started with ``--logprobs-mode processed_logprobs``, so
    `Generation.logprobs_processed` is empty unless the upstream says (a lightrail gateway upstream does).

    ``model`` overrides the model name of every request (agents often hard-code one); ``policy_version`` is
    stamped on every generation (set it when you load new weights into the server).

    HTTP goes through a lean keep-alive client (`lightrail._http`: 0.08 ms of CPU per call where httpx costs
    0.71 ms, `bench/http_client.py`); environment proxies are not used and redirects are not followed.

    Concurrency model: one event loop; connections are opened on first use in the running loop. Call
    `aclose` from that loop when done.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        policy_version: int | None = None,
        request_token_ids: bool = True,
        timeout_s: float = 600.0,
        max_connections: int = 512,
    ) -> None:
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.root = self.base_url[: -len("/v1")]
        """The server's root: vLLM serves ``/tokenize`` there, next to ``/v1``."""
        self.model = model
        self.policy_version = policy_version
        self.request_token_ids = request_token_ids
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = HTTPPool(self.root, headers=headers, timeout_s=timeout_s, max_connections=max_connections)
        self._models: list[str] = [model] if model else []

    # -- Backend protocol -----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """The ``model`` override if given, else the names the upstream listed at the last `refresh_models`."""
        return list(self._models)

    async def chat(self, request: ChatRequest) -> Generation:
        return await self._chat(request, self.model or request.model)

    async def complete(self, request: CompletionRequest) -> Generation:
        return await self._complete(request, self.model or request.model)

    async def _chat(self, request: ChatRequest, model: str) -> Generation:
        body: dict[str, Any] = {"model": model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.response_format is not None:
            body["response_format"] = request.response_format
        self._sampling(body, request.sampling)
        body["logprobs"] = True
        if request.sampling.top_logprobs:
            body["top_logprobs"] = request.sampling.top_logprobs
        data: _ChatCompletion = await self._post("/v1/chat/completions", body, _chat_decoder)
        choices = []
        for c in data.choices:
            calls = [
                ToolCall(id=t.id, name=t.function.name, arguments=t.function.arguments or "")
                for t in c.message.tool_calls or ()
            ]
            content = c.logprobs.content if c.logprobs is not None else None
            logprobs = [e.logprob for e in content] if content is not None else None
            choice = _choice(c.message.content or "", c.token_ids, logprobs, c.finish_reason, calls)
            choice.reasoning = c.message.reasoning_content or c.message.reasoning
            if request.sampling.top_logprobs and content is not None:
                choice.top_logprobs = [[_token_id(t.token, t.logprob) for t in e.top_logprobs or ()] for e in content]
            if choice.finish_reason == "stop" and isinstance(c.stop_reason, str):
                choice.stop_sequence = c.stop_reason
            choices.append(choice)
        return self._generation(data.model, data.prompt_token_ids, choices, data.logprobs_processed)

    async def _complete(self, request: CompletionRequest, model: str) -> Generation:
        body: dict[str, Any] = {"model": model, "prompt": request.prompt}
        self._sampling(body, request.sampling)
        body["logprobs"] = max(1, request.sampling.top_logprobs)
        data: _TextCompletion = await self._post("/v1/completions", body, _text_decoder)
        choices, prompt_ids = [], None
        for c in data.choices:
            logprobs = c.logprobs.token_logprobs if c.logprobs is not None else None
            choice = _choice(c.text, c.token_ids, logprobs, c.finish_reason, [])
            tops = c.logprobs.top_logprobs if c.logprobs is not None else None
            if request.sampling.top_logprobs and tops is not None:
                # vLLM lists the sampled token too when it is not among the most likely: keep the top k
                k = request.sampling.top_logprobs
                choice.top_logprobs = [
                    sorted((_token_id(t, lp) for t, lp in (top or {}).items()), key=lambda a: -a[1])[:k] for top in tops
                ]
            choices.append(choice)
            prompt_ids = prompt_ids or c.prompt_token_ids
        return self._generation(data.model, prompt_ids, choices, data.logprobs_processed)

    async def count_tokens(self, request: ChatRequest) -> int:
        """Tokens of the prompt the upstream renders for ``request``, counted by its ``POST /tokenize`` (vLLM's).
        An upstream without that endpoint is a `BackendError` 404 naming it (the caller sees why, not a guess); its
        other 4xx reach the caller as they are; an answer without a count is an `UpstreamError`."""
        body: dict[str, Any] = {"model": self._counting_model(request), "messages": request.messages,
                                "add_generation_prompt": True}  # fmt: skip
        if request.tools:
            body["tools"] = request.tools
        try:
            counted: _Tokenized = await self._post("/tokenize", body, _tokenized_decoder)
        except BackendError as exc:
            if exc.status not in (404, 405):
                raise
            raise BackendError(
                f"The upstream at {self.root} cannot count tokens: POST /tokenize answered {exc.status} "
                f"({exc.message}). Counting needs vLLM's tokenizer endpoint there (or the embedded engine); "
                "lightrail does not estimate a count.",
                status=404,
                code="count_tokens_unsupported",
            ) from None
        return counted.count

    # -- helpers --------------------------------------------------------------------------------------------

    def _counting_model(self, request: ChatRequest) -> str:
        """The model name `count_tokens` asks the tokenizer endpoint for."""
        return self.model or request.model

    async def refresh_models(self) -> list[str]:
        """Ask the upstream for its models (``GET /v1/models``) unless a ``model`` override is set."""
        if not self.model:
            status, content = await self._http.request("GET", "/v1/models")
            if status == 200:
                self._models = [m["id"] for m in msgspec.json.decode(content).get("data", [])]
        return self.model_names()

    async def aclose(self) -> None:
        """Close idle upstream connections."""
        await self._http.aclose()

    def _sampling(self, body: dict[str, Any], s: SamplingParams) -> None:
        if s.top_logprobs and not self.request_token_ids:
            raise BackendError(
                "top_logprobs is not supported by this upstream: its alternatives cannot be named by token id "
                "(request_token_ids=False)",
                param="top_logprobs",
            )
        body["n"] = s.n
        body["temperature"] = s.temperature
        body["top_p"] = s.top_p
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if s.stop:
            body["stop"] = s.stop
        if s.seed is not None:
            body["seed"] = s.seed
        if s.presence_penalty:
            body["presence_penalty"] = s.presence_penalty
        if s.frequency_penalty:
            body["frequency_penalty"] = s.frequency_penalty
        if s.logit_bias:
            body["logit_bias"] = {str(token): bias for token, bias in s.logit_bias.items()}
        if self.request_token_ids:
            body["return_token_ids"] = True
            if s.top_logprobs:
                body["return_tokens_as_token_ids"] = True

    async def _post(self, path: str, body: dict[str, Any], decoder: msgspec.json.Decoder) -> Any:
        try:
            status, content = await self._http.request("POST", path, msgspec.json.encode(body))
        except (OSError, TimeoutError) as exc:  # ConnectionError is an OSError
            raise UpstreamError(f"upstream {self.base_url} unreachable: {exc!r}") from exc
        if status == 200:
            try:
                return decoder.decode(content)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise UpstreamError(f"upstream {self.root}{path} sent an unreadable answer: {exc}") from None
        try:
            data = msgspec.json.decode(content)
        except msgspec.DecodeError:
            data = None
        text = content[:500].decode(errors="replace")
        if 400 <= status < 500:
            error = data.get("error") if isinstance(data, dict) else None
            if isinstance(error, dict):  # OpenAI's envelope
                raise BackendError(
                    str(error.get("message") or f"upstream returned {status}"),
                    status=status,
                    param=error.get("param"),
                    code=None if error.get("code") is None else str(error.get("code")),
                )
            message = data.get("message") if isinstance(data, dict) else None  # vLLM's older flat ErrorResponse
            raise BackendError(str(message or text or f"upstream returned {status}"), status=status)
        raise UpstreamError(f"upstream {self.root}{path} returned {status}: {text}")

    def _generation(
        self, model: str, prompt_ids: list[int] | None, choices: list[Choice], processed: list[str] | None
    ) -> Generation:
        if any(c.token_ids is None for c in choices):
            prompt_ids = None  # ids are all-or-nothing: a call is trainable only with every id
        return Generation(
            model=model or self.model or "",
            prompt_ids=prompt_ids,
            choices=choices,
            policy_version=self.policy_version,
            logprobs_processed=processed or [],
        )


class VersionedUpstream(OpenAIUpstream):
    """An `OpenAIUpstream` in front of a model server whose weights a trainer replaces while it serves (vLLM as
    the rollout engine of `GRPO`): it routes each request to the current policy and stamps every `Generation`
    with the policy version that actually answered it.

    Two ways the server's policy changes, both driven by the trainer through this object:

    * LoRA adapters (`route` then `drain`): each version is an adapter loaded on the server under its own name
      (``policy-v3``). `route` makes NEW requests use the new name; requests already sent keep theirs. Every
      request is counted against the name it was sent with until its answer arrives, so `drain` returns once
      the old adapter has no request left and the trainer may unload it. The version recorded is looked up
      from the ``model`` the server says answered (vLLM echoes the adapter name), falling back to the name the
      request was sent with.
    * Full weights (`paused`): the name stays ``served_name``; inside ``async with upstream.paused():`` no
      request is in flight (new ones wait at the door, in-flight ones have finished), so the trainer reloads
      the weights and calls `set_version`; the waiting requests then go out on the new weights. A request's
      version is the one current when it went out, which the pause makes the version of every token.

    A request that the server rejects with 404 because its adapter vanished (unloaded by someone else) is sent
    again once on the current adapter instead of failing.

    Concurrency model: one event loop. Choosing a request's name and counting it happen with no await in
    between, so a name that is no longer current and has a zero count never gets another request.
    """

    def __init__(self, base_url: str, *, served_name: str, policy_version: int = 0, **options: Any) -> None:
        super().__init__(base_url, model=served_name, policy_version=policy_version, **options)
        self.served_name = served_name
        self._current = served_name
        self._versions: dict[str, int] = {served_name: policy_version}
        self._in_flight: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}
        self._open = asyncio.Event()
        self._open.set()
        self._running = 0
        self._all_idle = asyncio.Event()
        self._all_idle.set()

    # -- what is served -------------------------------------------------------------------------------------

    @property
    def current(self) -> str:
        """The model name new requests are sent with (``served_name`` or the current adapter's)."""
        return self._current

    def in_flight(self, name: str | None = None) -> int:
        """Requests sent and not yet answered (on ``name`` only, if given)."""
        return self._running if name is None else self._in_flight.get(name, 0)

    def route(self, name: str, version: int) -> str:
        """Send new requests to ``name`` (already loaded on the server), which serves ``version``; returns the
        name requests went to before. In-flight requests are untouched."""
        current = self._versions[self._current]
        if version < current:
            raise ValueError(f"policy version must not go back: {version} < current {current}")
        previous, self._current = self._current, name
        self._versions[name] = version
        self.policy_version = version
        return previous

    def set_version(self, version: int) -> None:
        """The weights behind the current name are now ``version`` (call inside `paused`, after the reload)."""
        if self._open.is_set() and self._running:
            raise RuntimeError("set_version while requests are in flight: reload inside `async with paused()`")
        self.route(self._current, version)

    async def drain(self, name: str) -> None:
        """Wait until no request sent with ``name`` is still waiting for its answer."""
        if name == self._current:
            raise ValueError(f"{name!r} still receives new requests: `route` elsewhere before draining it")
        if self._in_flight.get(name, 0):
            await self._idle.setdefault(name, asyncio.Event()).wait()

    def forget(self, name: str) -> None:
        """Drop a drained, unloaded adapter's name (a late echo of it then falls back to the sent name)."""
        if name != self.served_name and name != self._current and not self._in_flight.get(name):
            self._versions.pop(name, None)
            self._idle.pop(name, None)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold new requests at the door and wait until none is in flight; reopen on exit (also on error)."""
        if not self._open.is_set():
            raise RuntimeError("already paused")
        self._open.clear()
        try:
            await self._all_idle.wait()
            yield
        finally:
            self._open.set()

    # -- Backend protocol -----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return [self.served_name]

    def _counting_model(self, request: ChatRequest) -> str:
        # the name the server knows: a policy's adapter on a shared server answers to `current`, not `served_name`
        return self._current

    async def chat(self, request: ChatRequest) -> Generation:
        return await self._send(request, self._chat)

    async def complete(self, request: CompletionRequest) -> Generation:
        return await self._send(request, self._complete)

    async def _send(self, request: Any, call: Any) -> Generation:
        for attempt in (0, 1):
            while not self._open.is_set():
                await self._open.wait()
            name = self._current
            version = self._versions[name]
            self._enter(name)
            try:
                generation: Generation = await call(request, name)
            except BackendError as exc:
                if attempt == 0 and exc.status == 404 and name != self._current:
                    continue  # its adapter was unloaded under it: the current one answers instead
                raise
            finally:
                self._leave(name)
            answered = self._versions.get(generation.model, version)
            return msgspec.structs.replace(generation, policy_version=answered)
        raise AssertionError("unreachable")

    def _enter(self, name: str) -> None:
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        self._running += 1
        self._all_idle.clear()
        idle = self._idle.get(name)
        if idle is not None:
            idle.clear()

    def _leave(self, name: str) -> None:
        left = self._in_flight[name] - 1
        self._running -= 1
        if left:
            self._in_flight[name] = left
        else:
            del self._in_flight[name]
            self._idle.setdefault(name, asyncio.Event()).set()
        if not self._running:
            self._all_idle.set()


def _token_id(label: str, logprob: float) -> tuple[int, float]:
    """``("token_id:42", lp)`` -> ``(42, lp)``: alternatives are only usable as ids (vLLM's
    ``return_tokens_as_token_ids``); an upstream that names them by text cannot be mapped back."""
    head, _, tail = label.partition(":")
    if head != "token_id" or not tail.isdigit():
        raise UpstreamError(
            f"the upstream named a top_logprobs token {label!r}, not 'token_id:<id>'; top_logprobs through an "
            "upstream needs vLLM's return_tokens_as_token_ids (and request_token_ids=True)"
        )
    return int(tail), logprob


def _choice(
    text: str, ids: list[int] | None, logprobs: list[float | None] | None, finish: str | None, calls: list[ToolCall]
) -> Choice:
    # logprobs are kept only when they line up one-to-one with the ids (the Choice invariant)
    known = [lp for lp in logprobs or () if lp is not None]
    aligned = known if ids is not None and logprobs is not None and len(known) == len(logprobs) == len(ids) else None
    reason: FinishReason = "tool_calls" if calls else _FINISH.get(finish or "stop", "stop")
    return Choice(text=text, token_ids=ids, logprobs=aligned, finish_reason=reason, tool_calls=calls)
