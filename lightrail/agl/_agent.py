"""Agent Lightning's agent API (`LitAgent[T]`, ``@rollout``, `AttemptedRollout`, ``self.tracer``) on lightrail's
`lightrail.agent.LitAgent`: the runner calls `LitAgent.invoke`, which hands the agent Agent Lightning's types and
calls the method Agent Lightning would (``training_rollout[_async]`` in mode ``train``, else
``validation_rollout[_async]``; both default to ``rollout[_async]``).

Face agents are sent to runner processes by value (cloudpickle, `SEND_BY_VALUE`): an instance built in ``main()``
or at the top of a script without a ``__main__`` guard reaches the runners without the script being run again.
"""

from __future__ import annotations

import contextvars
import inspect
import numbers
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from lightrail.agent.agent import LitAgent as _LitAgent
from lightrail.agl._resources import LLM, Engine, PromptTemplate, from_lightrail
from lightrail.types import LLM as _LLM
from lightrail.types import Attempt as _Attempt
from lightrail.types import Rollout as _Rollout

__all__ = ["Attempt", "AttemptedRollout", "FunctionalLitAgent", "LitAgent", "Rollout", "rollout"]

T = TypeVar("T")


class Attempt:
    """Agent Lightning's ``Attempt`` fields, read from lightrail's `lightrail.types.Attempt`."""

    def __init__(self, attempt: _Attempt) -> None:
        self.rollout_id = attempt.rollout_id
        self.attempt_id = attempt.attempt_id
        self.sequence_id = attempt.index + 1  # Agent Lightning counts attempts from 1, lightrail from 0
        self.start_time = attempt.started_at
        self.end_time = attempt.ended_at
        self.status = str(attempt.status)
        self.worker_id = attempt.worker_id
        self.metadata: dict[str, Any] = {}


class Rollout:
    """Agent Lightning's ``Rollout`` fields, read from lightrail's `lightrail.types.Rollout` (``input`` is the
    task's input, ``resources_id`` the resources version)."""

    def __init__(self, rollout: _Rollout) -> None:
        self.rollout_id = rollout.rollout_id
        self.input = rollout.task.input
        self.start_time = rollout.created_at
        self.end_time = rollout.ended_at
        self.mode = rollout.mode
        self.resources_id = None if rollout.resources_version is None else str(rollout.resources_version)
        self.status = str(rollout.status)
        self.metadata = dict(rollout.metadata)


class AttemptedRollout(Rollout):
    """A rollout with the attempt running it (``rollout.attempt.attempt_id``), as an agent receives it."""

    def __init__(self, rollout: _Rollout, attempt: _Attempt) -> None:
        super().__init__(rollout)
        self.attempt = Attempt(attempt)


class Tracer:
    """``self.tracer`` of an agent. lightrail records the attempt's LLM calls at its gateway and names LangChain
    calls by their runnables without a callback (`lightrail.tracing.langchain`), so the handler this returns
    records nothing more; it exists so that ``callbacks=[self.tracer.get_langchain_handler()]`` keeps working."""

    def get_langchain_handler(self, tags: Sequence[str] | None = None) -> Any:
        from langchain_core.callbacks import BaseCallbackHandler

        return BaseCallbackHandler()

    def trace_context(self, *args: Any, **kwargs: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def get_last_trace(self) -> list[Any]:
        return []


_TRACER = Tracer()

_gateway_keys: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("agl_keys", default=())
"""(routed endpoint prefix, gateway key) of the running attempt's LLMs."""
_stamp_added = False


def _stamp_gateway_key(request: Any) -> None:
    """Agent Lightning's proxy takes any API key, so its agents pass a dummy one (``"dummy"``, ``OPENAI_API_KEY``);
    lightrail's gateway wants its own. A request to the attempt's routed endpoint carries the attempt's gateway key
    whatever key the agent set (the agent was handed that key anyway, as ``llm.api_key``)."""
    keys = _gateway_keys.get()
    if keys:
        url = str(request.url)
        for prefix, key in keys:
            if url.startswith(prefix):
                request.headers["authorization"] = f"Bearer {key}"
                return


def _use_gateway_keys(resources: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    global _stamp_added
    keys = tuple((r.endpoint.rstrip("/") + "/", r.api_key) for r in resources.values()
                 if isinstance(r, _LLM) and r.routed and r.api_key)  # fmt: skip
    if keys and not _stamp_added:
        from lightrail.tracing import naming

        naming.add_stamp(_stamp_gateway_key, naming.AS_AGENT)
        _stamp_added = True
    _gateway_keys.set(keys)
    return keys


_METHODS = ("rollout", "training_rollout", "validation_rollout")


class _Flag:
    """A truth value that is also callable (returns itself as a bool)."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return self.value

    def __call__(self) -> bool:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)


class LitAgent(_LitAgent, Generic[T]):
    """Agent Lightning's ``LitAgent[T]``: override ``rollout(task, resources, rollout)`` (or ``rollout_async``, or
    ``training_rollout[_async]`` / ``validation_rollout[_async]``) and return a float reward or None (the last
    reward emitted). ``resources`` are Agent Lightning's types (`LLM` routed to the attempt, `PromptTemplate`);
    ``rollout`` is an `AttemptedRollout`. ``trained_agents``: a regex searched in agent names (Agent Lightning's
    deprecated form of the adapter's ``agent_match``; the trainer applies it)."""

    send_by_value = True
    """Runner processes get this agent pickled by value (cloudpickle), not by import reference (`Trainer`)."""

    trained_agents: str | None = None
    resource_engines: Mapping[str, Engine] = {}
    """Template engine per resource name: set by the face's `Trainer` from ``initial_resources``."""
    resource_aliases: Mapping[str, str] = {}
    """Resource name -> the published name it stands for: set by the face's `Trainer` (under GRPO, Agent
    Lightning's ``main_llm`` is the policy LLM GRPO publishes as ``llm``)."""
    fixed_resources: Mapping[str, Any] = {}
    """Resources handed to every rollout when the published ones lack them: set by the face's `Trainer` under GRPO
    (which publishes the policy LLM only) from ``initial_resources``' prompt templates, which GRPO never changes."""
    hooks: Sequence[Any] = ()
    """Agent Lightning ``Hook`` objects: set by the face's `Trainer` from ``hooks``."""

    def __init__(self, *, trained_agents: str | None = None) -> None:
        self.trained_agents = trained_agents

    @property
    def tracer(self) -> Tracer:
        return _TRACER

    def get_tracer(self) -> Tracer:
        return _TRACER

    @property
    def trainer(self) -> None:
        return None

    @property
    def runner(self) -> None:
        return None

    # -- what an agent overrides (Agent Lightning's defaults) -------------------------------------------------

    def rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout or rollout_async")

    async def rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout or rollout_async")

    def training_rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        return self.rollout(task, resources, rollout)

    async def training_rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        return await self.rollout_async(task, resources, rollout)

    def validation_rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        return self.rollout(task, resources, rollout)

    async def validation_rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        return await self.rollout_async(task, resources, rollout)

    # -- what the runner calls --------------------------------------------------------------------------------

    def is_async_agent(self) -> bool:
        """Agent Lightning's ``is_async()``: whether any async method is overridden (then the async ones run)."""
        cls = type(self)
        return any(getattr(cls, f"{m}_async") is not getattr(LitAgent, f"{m}_async") for m in _METHODS)

    @property
    def is_async(self) -> _Flag:  # type: ignore[override]
        """lightrail's runner reads ``agent.is_async`` as a flag, Agent Lightning's code calls ``agent.is_async()``:
        both work."""
        return _Flag(self.is_async_agent())

    def set_trainer(self, trainer: Any) -> None:
        pass

    def get_trainer(self) -> None:
        return None

    def set_runner(self, runner: Any) -> None:
        pass

    def get_runner(self) -> None:
        return None

    def on_rollout_start(self, task: Any, runner: Any, store: Any) -> None:
        """Agent Lightning's deprecated agent hook: not called here (use ``Trainer(hooks=[...])``)."""

    def on_rollout_end(self, task: Any, rollout: Any, runner: Any, store: Any) -> None:
        """Agent Lightning's deprecated agent hook: not called here (use ``Trainer(hooks=[...])``)."""

    def _method(self, mode: str | None) -> Callable[..., Any]:
        prefix = "training" if mode == "train" else "validation"
        return getattr(self, f"{prefix}_rollout_async" if self.is_async_agent() else f"{prefix}_rollout")

    def invoke(self, task: Any, resources: Any, rollout: _Rollout, attempt: _Attempt) -> Any:
        keys = _use_gateway_keys(resources)
        named = from_lightrail(resources, self.resource_engines)
        for fixed, item in self.fixed_resources.items():
            named.setdefault(fixed, item)
        for alias, name in self.resource_aliases.items():
            if alias not in named and name in named:
                named[alias] = named[name]
        view = AttemptedRollout(rollout, attempt)
        method = self._method(rollout.mode)
        if self.hooks:  # the runner awaits the coroutine in its loop, in the attempt's context
            return _with_hooks(self, method, task, named, view, keys)
        result = method(task, named, view)
        return _awaited(result, keys) if inspect.isawaitable(result) else _result(result)


async def _awaited(result: Awaitable[Any], keys: tuple[tuple[str, str], ...]) -> float | None:
    _gateway_keys.set(keys)  # a coroutine made in a worker thread runs in the runner's task: its own context
    return _result(await result)


async def _with_hooks(
    agent: LitAgent[Any],
    method: Callable[..., Any],
    task: Any,
    named: Any,
    view: Any,
    keys: tuple[tuple[str, str], ...],
) -> Any:
    """Agent Lightning's hooks around one rollout (``runner`` is None: lightrail's runner is not theirs; the
    attempt's spans are in the store, not handed to ``on_rollout_end``, which gets an empty list)."""
    import asyncio

    _gateway_keys.set(keys)
    for hook in agent.hooks:
        await hook.on_rollout_start(agent=agent, runner=None, rollout=view)
        await hook.on_trace_start(agent=agent, runner=None, tracer=_TRACER, rollout=view)
    try:
        if inspect.iscoroutinefunction(method):
            result = await method(task, named, view)
        else:
            result = await asyncio.to_thread(method, task, named, view)  # copies the attempt's context
    finally:
        for hook in agent.hooks:
            await hook.on_trace_end(agent=agent, runner=None, tracer=_TRACER, rollout=view)
            await hook.on_rollout_end(agent=agent, runner=None, rollout=view, spans=[])
    return _result(result)


def _result(result: Any) -> float | None:
    """Agent Lightning's return values: None (the rewards emitted) or a number (the final reward; int and bool
    taken as float). A list of spans is Agent Lightning's tracer output, which lightrail does not take back."""
    if result is None or isinstance(result, numbers.Real):
        return None if result is None else float(result)
    if isinstance(result, list):
        raise TypeError("the agent returned a list of spans: lightrail records spans itself; return a float or None")
    raise TypeError(f"the agent returned {type(result).__name__}; expected a float reward or None")


class FunctionalLitAgent(LitAgent[Any]):
    """A function made an agent by `rollout`: ``task`` first, then ``llm`` (the first LLM resource) or
    ``prompt_template`` (the first PromptTemplate), optionally ``rollout`` (the `AttemptedRollout`). Calling it
    calls the function."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] != "task":
            raise TypeError(f"@rollout function {fn.__qualname__}: its first parameter must be named 'task'")
        self.fn = fn
        self.params = params
        self.__name__ = getattr(fn, "__name__", "agent")
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def is_async_agent(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def _call(self, task: Any, resources: Mapping[str, Any], rollout: Any) -> Any:
        kwargs: dict[str, Any] = {}
        for name in self.params[1:]:
            if name == "llm":
                kwargs[name] = _first(resources, LLM, name)
            elif name == "prompt_template":
                kwargs[name] = _first(resources, PromptTemplate, name)
            elif name == "rollout":
                kwargs[name] = rollout
            elif name == "resources":
                kwargs[name] = resources
            else:
                raise TypeError(f"@rollout function {self.__name__}: cannot inject parameter {name!r} "
                                "(llm, prompt_template, rollout)")  # fmt: skip
        return self.fn(task, **kwargs)

    def rollout(self, task: Any, resources: Any, rollout: Any) -> Any:
        return self._call(task, resources, rollout)

    async def rollout_async(self, task: Any, resources: Any, rollout: Any) -> Any:
        result: Awaitable[Any] = self._call(task, resources, rollout)
        return await result


def _first(resources: Mapping[str, Any], kind: type, name: str) -> Any:
    """Agent Lightning's injection: the first resource of ``kind`` (lightrail prefers the one named ``name``)."""
    found = resources.get(name)
    if isinstance(found, kind):
        return found
    for item in resources.values():
        if isinstance(item, kind):
            return item
    raise LookupError(f"the agent asks for `{name}` but the rollout's resources have no {kind.__name__}")


def rollout(func: Callable[..., Any]) -> FunctionalLitAgent:
    """Agent Lightning's ``@rollout``: a function ``(task, llm | prompt_template[, rollout])``, sync or async,
    made an agent (see `FunctionalLitAgent`)."""
    return FunctionalLitAgent(func)


def llm_rollout(func: Callable[..., Any] | None = None, *, strip_proxy: bool = True) -> Any:
    """Agent Lightning's ``@llm_rollout``: `rollout` for a function ``(task, llm[, rollout])`` (the LLM is always
    routed to the attempt here: ``strip_proxy`` changes nothing)."""
    return rollout(func) if func is not None else rollout


def prompt_rollout(func: Callable[..., Any] | None = None) -> Any:
    """Agent Lightning's ``@prompt_rollout``: `rollout` for a function ``(task, prompt_template[, rollout])``."""
    return rollout(func) if func is not None else rollout
