"""What the gateway forwards to: the `Backend` protocol and `OpenAIUpstream`, a backend that is any
OpenAI-compatible server (vLLM, or another lightrail gateway).

A backend gets validated `ChatRequest` / `CompletionRequest`s and answers with a `Generation` carrying its own
token ids and logprobs (the training data). It raises `lightrail.types.BackendError` for problems the caller
can fix (the agent sees an OpenAI-style 4xx) and `UpstreamError` when the model server itself failed (502).
The embedded engine (`lightrail.engine.Engine`) implements the protocol structurally; this package never
imports it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import httpx
import msgspec

from lightrail.types import (
    BackendError,
    ChatRequest,
    Choice,
    CompletionRequest,
    Generation,
    SamplingParams,
    ToolCall,
)

__all__ = ["Backend", "OpenAIUpstream", "UpstreamError"]


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


class UpstreamError(Exception):
    """The upstream model server failed (unreachable, 5xx, unreadable answer): not the caller's fault."""

    status = 502


_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}


class OpenAIUpstream:
    """Forward to an OpenAI-compatible server over HTTP, asking it for token ids and logprobs.

    The ids are requested with vLLM's documented extension ``"return_token_ids": true`` (vLLM >= 0.10.2:
    ``prompt_token_ids`` in the response, ``token_ids`` per choice) and sampled-token logprobs with
    ``"logprobs": true`` (chat) / ``"logprobs": 1`` (completions). A server that returns no ids yields a
    `Generation` with ``prompt_ids``/``token_ids`` None: the call is recorded with ``token_ids_available=False``
    and excluded from training, never re-tokenized. Against servers that reject unknown fields (OpenAI's
    own API) pass ``request_token_ids=False``.

    ``model`` overrides the model name of every request (agents often hard-code one); ``policy_version`` is
    stamped on every generation (set it when you load new weights into the server).

    Concurrency model: one `httpx.AsyncClient` with a keep-alive pool, created on first use in the running
    event loop; call `aclose` from that loop when done.
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
        self.model = model
        self.policy_version = policy_version
        self.request_token_ids = request_token_ids
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None
        self._models: list[str] = [model] if model else []

    # -- Backend protocol -----------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """The ``model`` override if given, else the names the upstream listed at the last `refresh_models`."""
        return list(self._models)

    async def chat(self, request: ChatRequest) -> Generation:
        body: dict[str, Any] = {"model": self.model or request.model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        self._sampling(body, request.sampling)
        body["logprobs"] = True
        data = await self._post("/chat/completions", body)
        choices = []
        for c in _list(data, "choices"):
            message = c.get("message") or {}
            calls = [
                ToolCall(id=t["id"], name=t["function"]["name"], arguments=t["function"].get("arguments") or "")
                for t in message.get("tool_calls") or ()
            ]
            lp = c.get("logprobs") or {}
            content = lp.get("content") if isinstance(lp, dict) else None
            logprobs = [e["logprob"] for e in content] if content else None
            choices.append(_choice(c, message.get("content") or "", logprobs, calls))
        return self._generation(data, data.get("prompt_token_ids"), choices)

    async def complete(self, request: CompletionRequest) -> Generation:
        body: dict[str, Any] = {"model": self.model or request.model, "prompt": request.prompt}
        self._sampling(body, request.sampling)
        body["logprobs"] = 1
        data = await self._post("/completions", body)
        choices, prompt_ids = [], None
        for c in _list(data, "choices"):
            lp = c.get("logprobs") or {}
            logprobs = lp.get("token_logprobs") if isinstance(lp, dict) else None
            choices.append(_choice(c, c.get("text") or "", logprobs, []))
            prompt_ids = prompt_ids or c.get("prompt_token_ids")
        return self._generation(data, prompt_ids, choices)

    # -- helpers --------------------------------------------------------------------------------------------

    async def refresh_models(self) -> list[str]:
        """Ask the upstream for its models (``GET /v1/models``) unless a ``model`` override is set."""
        if not self.model:
            response = await self._http().get(self.base_url + "/models", headers=self._headers)
            if response.status_code == 200:
                self._models = [m["id"] for m in msgspec.json.decode(response.content).get("data", [])]
        return self.model_names()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._timeout, limits=self._limits)
        return self._client

    def _sampling(self, body: dict[str, Any], s: SamplingParams) -> None:
        body["n"] = s.n
        body["temperature"] = s.temperature
        body["top_p"] = s.top_p
        if s.max_tokens is not None:
            body["max_tokens"] = s.max_tokens
        if s.stop:
            body["stop"] = s.stop
        if s.seed is not None:
            body["seed"] = s.seed
        if self.request_token_ids:
            body["return_token_ids"] = True

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"content-type": "application/json", **self._headers}
        try:
            response = await self._http().post(self.base_url + path, content=msgspec.json.encode(body), headers=headers)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {self.base_url} unreachable: {exc!r}") from exc
        status = response.status_code
        try:
            data = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            data = None
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
            raise BackendError(str(message or response.text[:500] or f"upstream returned {status}"), status=status)
        if status != 200 or not isinstance(data, dict):
            raise UpstreamError(f"upstream {self.base_url}{path} returned {status}: {response.text[:500]}")
        return data

    def _generation(self, data: dict[str, Any], prompt_ids: Any, choices: list[Choice]) -> Generation:
        if any(c.token_ids is None for c in choices):
            prompt_ids = None  # ids are all-or-nothing: a call is trainable only with every id
        return Generation(
            model=str(data.get("model") or self.model or ""),
            prompt_ids=prompt_ids if _is_ids(prompt_ids) else None,
            choices=choices,
            policy_version=self.policy_version,
        )


def _list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    if not isinstance(value, list):
        raise UpstreamError(f"upstream answer has no {key!r} list")
    return value


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def _choice(c: dict[str, Any], text: str, logprobs: Any, calls: list[ToolCall]) -> Choice:
    ids = c.get("token_ids")
    ids = ids if _is_ids(ids) else None
    # logprobs are kept only when they line up one-to-one with the ids (the Choice invariant)
    if ids is None or not isinstance(logprobs, list) or len(logprobs) != len(ids) or None in logprobs:
        logprobs = None
    finish = _FINISH.get(c.get("finish_reason") or "stop", "stop")
    if calls:
        finish = "tool_calls"
    return Choice(text=text, token_ids=ids, logprobs=logprobs, finish_reason=finish, tool_calls=calls)
