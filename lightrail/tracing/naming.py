"""Naming the agent behind each LLM call, with or without a tracer: `as_agent` and the headers of outgoing requests.

The gateway records on every call the agent that made it (`lightrail.types.Attr.CALLER_AGENT`), and training
selects calls by it (``grpo.policies``, agent filters). A call names its agent in one of three ways, most explicit
first: an ``/agents/<name>/`` segment in its URL (`lightrail.types.LLM.endpoint_for`, for any HTTP client in any
language), the `lightrail.types.AGENT_HEADER` set by the caller, or this module:

* ``with as_agent("writer"):`` names the agent of every call made inside the block (in this task or thread, and
  in tasks and threads that copy its context, as the runner does for sync agents): the block's outgoing
  ``httpx`` / ``httpx2`` requests (the openai client, LangChain, the OpenAI Agents SDK, AutoGen and litellm use
  one of them) carry the header. Clients on other HTTP libraries set the header themselves or use
  `LLM.endpoint_for`.
* `lightrail.tracing.otel` and `lightrail.tracing.langchain` add their own header stamps here (``traceparent``, and
  the agent they can tell from OpenTelemetry spans or LangChain runs). A stamp leaves a header already set alone, so
  the first to set it wins: stamps run in order of their priority (`AS_AGENT`, then `OTEL`, then `LANGCHAIN`),
  whatever order they were added in. A header the caller set wins over all of them.

The requests are stamped by a wrapper around ``Client.send`` / ``AsyncClient.send`` of both libraries, installed on
first use (the first `as_agent` block, or OpenTelemetry's setup) and kept for the life of the process (without a
name or a stamp it only reads a context variable). No OpenTelemetry import here: ``import lightrail`` stays light.

Concurrency model: the name is a `contextvars.ContextVar`, so concurrent attempts in tasks and threads never see
each other's; the wrapper is installed once under a lock; the tuple of stamps is replaced (under the lock, sorted by
priority), never mutated, so a request in any thread sees a whole tuple.

Example::

    from lightrail import as_agent

    async def debate(task, llm):
        client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none")
        with as_agent("proposer"):
            claim = await client.chat.completions.create(model=llm.model, messages=[...])
        with as_agent("critic"):
            review = await client.chat.completions.create(model=llm.model, messages=[...])
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, TypeVar, cast

from lightrail.types import AGENT_HEADER, agent_header_value, check_agent_name

__all__ = ["AS_AGENT", "LANGCHAIN", "OTEL", "AgentBlock", "add_stamp", "as_agent", "named_agent", "remove_stamp"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_agent: ContextVar[str | None] = ContextVar("lightrail_agent", default=None)
_agent_header: ContextVar[str | None] = ContextVar("lightrail_agent_header", default=None)
"""The header value of the name in `_agent` (percent-encoded once, when the block is entered)."""


def named_agent() -> str | None:
    """The agent named by the innermost `as_agent` block around the caller, or None."""
    return _agent.get()


def as_agent(name: str) -> AgentBlock:
    """Make the LLM calls inside the block calls of agent ``name``: their requests carry the agent header, the
    gateway records the name on each call's span, and training selects the calls by it (``grpo.policies``, agent
    filters) — no OpenTelemetry needed. Blocks nest (the innermost name wins); works in sync and async code, and
    as a decorator of sync and ``async def`` functions (the name holds while the coroutine runs, wherever it is
    awaited). An invalid name (`lightrail.types.check_agent_name`) is a ValueError here, before any call is made.

    Example::

        with lightrail.as_agent("writer"):
            draft = client.chat.completions.create(model=llm.model, messages=messages)

        @lightrail.as_agent("critic")
        async def review(draft):
            return await client.chat.completions.create(model=llm.model, messages=[...])
    """
    header = agent_header_value(check_agent_name(name))
    install()
    return AgentBlock(name, header)


class AgentBlock(contextlib.ContextDecorator):
    """What `as_agent` returns: a context manager (one ``with`` at a time: entering it again before it exits, nested
    or from another task, is a RuntimeError; call `as_agent` for each) and a decorator that enters a fresh one
    around every call of the function it decorates."""

    def __init__(self, name: str, header: str) -> None:
        self.name = name
        self._header = header
        self._tokens: tuple[Token[str | None], Token[str | None]] | None = None

    def __enter__(self) -> str:
        if self._tokens is not None:  # its tokens would be lost: the outer name could never be restored
            raise RuntimeError(f"this as_agent({self.name!r}) block is entered already; call as_agent again")
        self._tokens = (_agent.set(self.name), _agent_header.set(self._header))
        return self.name

    def __exit__(self, *exc: object) -> None:
        assert self._tokens is not None
        token, header_token = self._tokens
        self._tokens = None
        _agent_header.reset(header_token)
        _agent.reset(token)

    def _recreate_cm(self) -> AgentBlock:
        return AgentBlock(self.name, self._header)

    def __call__(self, func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            # a block around creating the generator ends before it runs; one inside would leak into its consumer
            raise TypeError(
                f"as_agent cannot decorate the generator function {func.__qualname__}: use "
                f"'with as_agent({self.name!r}):' around the calls inside it"
            )
        if inspect.iscoroutinefunction(func):
            # ContextDecorator's wrapper would leave the block when the coroutine is created, before it runs
            @functools.wraps(func)
            async def named(*args: Any, **kwargs: Any) -> Any:
                with self._recreate_cm():
                    return await func(*args, **kwargs)

            return cast("F", named)
        return super().__call__(func)


# -- stamping outgoing requests --------------------------------------------------------------------------------

Stamp = Callable[[Any], None]
"""Adds headers to an outgoing ``httpx`` (or ``httpx2``) request in place; must not raise (a stamp that does is
logged and skipped: tracing never breaks the agent's call)."""

_HTTP_CLIENTS = ("httpx", "httpx2")
"""Modules whose ``Client.send`` / ``AsyncClient.send`` are wrapped (openai 3 uses ``httpx2``, LangChain, litellm
and most others ``httpx``)."""


def _stamp_agent(request: Any) -> None:
    header = _agent_header.get()
    if header is not None and AGENT_HEADER not in request.headers:
        request.headers[AGENT_HEADER] = header


AS_AGENT = 0
"""Priority of `as_agent`'s stamp: a name given in the code wins over every guess."""
OTEL = 10
"""Priority of `lightrail.tracing.otel`'s stamp: the agent of the current OpenTelemetry span (or LangGraph node)."""
LANGCHAIN = 20
"""Priority of `lightrail.tracing.langchain`'s stamp: the agent of the LangChain run making the call."""

_priorities: dict[Stamp, int] = {_stamp_agent: AS_AGENT}
_stamps: tuple[Stamp, ...] = (_stamp_agent,)
"""The stamps of `_priorities`, lowest priority first (ties: the one added first)."""
_lock = threading.Lock()
_installed = False
_failed: set[str] = set()


def add_stamp(stamp: Stamp, priority: int) -> None:
    """Run ``stamp`` on every outgoing request, after the stamps of a lower ``priority`` (`AS_AGENT`, `OTEL`,
    `LANGCHAIN`; equal ones in the order added), installing the wrapper if needed. Stamps leave headers already
    set alone, so of two stamps that would set one, the one of lower priority wins, whichever was added first (an
    OpenTelemetry setup after LangChain's install, or again after a shutdown). Adding a stamp again keeps one, at
    the new priority."""
    global _stamps
    install()
    with _lock:
        _priorities.pop(stamp, None)
        _priorities[stamp] = priority
        _stamps = tuple(sorted(_priorities, key=_priorities.__getitem__))  # stable: ties keep the order added


def remove_stamp(stamp: Stamp) -> None:
    """Stop running ``stamp`` (a stamp not added is ignored)."""
    global _stamps
    with _lock:
        if _priorities.pop(stamp, None) is not None:
            _stamps = tuple(sorted(_priorities, key=_priorities.__getitem__))


def _apply(request: Any) -> None:
    for stamp in _stamps:
        try:
            stamp(request)
        except Exception:
            name = getattr(stamp, "__qualname__", repr(stamp))
            if name not in _failed:  # once per stamp: an agent's loop must not flood the log
                _failed.add(name)
                log.exception("the request header stamp %s failed; the request goes without it", name)


def install() -> None:
    """Wrap ``send`` of the installed HTTP client modules (once per process; idempotent)."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        for name in _HTTP_CLIENTS:
            try:
                if importlib.util.find_spec(name) is None:
                    continue
            except (ImportError, ValueError):
                continue
            module = importlib.import_module(name)
            module.Client.send = _wrapped(module.Client.send)
            module.AsyncClient.send = _wrapped_async(module.AsyncClient.send)
        _installed = True


def _wrapped(send: Any) -> Any:
    def send_stamped(self: Any, request: Any, **kwargs: Any) -> Any:
        _apply(request)
        return send(self, request, **kwargs)

    return send_stamped


def _wrapped_async(send: Any) -> Any:
    async def send_stamped(self: Any, request: Any, **kwargs: Any) -> Any:
        _apply(request)
        return await send(self, request, **kwargs)

    return send_stamped
