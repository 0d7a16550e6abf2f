"""Agents as the runner sees them: `LitAgent` (subclass it) and `rollout` (decorate a plain function).

Both end up as a `LitAgent` whose `LitAgent.invoke` the runner calls once per attempt. `load_agent` and
`agent_reference` turn agents into import references (``"module:object"``) and back, which is how an agent
reaches runner processes started with ``spawn`` (nothing is inherited from the parent process).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from lightrail._imports import FILE_MODULE_PREFIX, MissingReference, check_file_reference, import_object
from lightrail.types import LLM, Attempt, PromptTemplate, Rollout

__all__ = [
    "FunctionAgent",
    "LitAgent",
    "Resolved",
    "ResourceNotPublished",
    "RoutedResources",
    "agent_reference",
    "load_agent",
    "rollout",
    "route_resources",
]

Resolved = Mapping[str, LLM | PromptTemplate]
"""The resources an agent receives: name -> resource, every LLM routed to the running attempt."""


class LitAgent:
    """Base class of agents: implement `rollout` (sync or async) and return a reward, or None.

    ``task`` is the task's ``input``; ``resources`` maps names to the `LLM` and `PromptTemplate` resources of the
    rollout's resources version, with every LLM's ``endpoint`` already routed to this attempt (hand it to an
    OpenAI client as ``base_url``); ``rollout`` is the `Rollout` record (mode, sample index, ids).

    Return a float reward, or None to report the last final reward emitted with `emit_reward` (None if there
    was none). Raise to fail the attempt; connection errors to the model or store end it as an infrastructure
    error (retried, never trained on).

    Example::

        class Calculator(LitAgent):
            async def rollout(self, task, resources, rollout):
                llm = resources["llm"]
                client = AsyncOpenAI(base_url=llm.endpoint, api_key="none")
                ...
                return 1.0 if answer == task["answer"] else 0.0

    Sync agents run in worker threads, async agents as tasks of the runner's event loop; either way many
    attempts run at once in one process, so keep per-attempt state in locals, not on ``self``.
    """

    def rollout(self, task: Any, resources: Resolved, rollout: Rollout) -> float | None:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout(self, task, resources, rollout)")

    @property
    def is_async(self) -> bool:
        """True when `invoke` returns a coroutine (the runner awaits it instead of using a worker thread)."""
        return inspect.iscoroutinefunction(self.rollout)

    def invoke(self, task: Any, resources: Resolved, rollout: Rollout, attempt: Attempt) -> Any:
        """What the runner calls: the agent's result, or a coroutine of it when `is_async`."""
        return self.rollout(task, resources, rollout)


_INJECTABLE = ("task", "llm", "prompt_template", "resources", "rollout", "attempt")


class FunctionAgent(LitAgent):
    """A plain function made into an agent by `rollout`; its parameters are filled by name.

    Calling the agent calls the function unchanged, so it stays usable (and testable) as a function.
    """

    def __init__(self, fn: Callable[..., Any]):
        params = inspect.signature(fn).parameters
        names = []
        for name, param in params.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"@rollout function {fn.__qualname__}: *args/**kwargs cannot be injected")
            if name not in _INJECTABLE:
                raise TypeError(
                    f"@rollout function {fn.__qualname__}: unknown parameter {name!r}; "
                    f"parameters are injected by name and must be among {', '.join(_INJECTABLE)}"
                )
            names.append(name)
        self.fn = fn
        self.params: tuple[str, ...] = tuple(names)
        self.__qualname__: str = fn.__qualname__
        functools.update_wrapper(self, fn)  # __module__/__qualname__ name the decorated object: importable

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by reference: the module attribute is this agent, not the raw function, so pickling the
        # function itself would fail ("not the same object"). Spawned runners re-import it.
        return (load_agent, (agent_reference(self),))

    def invoke(self, task: Any, resources: Resolved, rollout: Rollout, attempt: Attempt) -> Any:
        values: dict[str, Any] = {}
        for name in self.params:
            if name == "task":
                values[name] = task
            elif name == "llm":
                values[name] = _pick(resources, LLM, "llm")
            elif name == "prompt_template":
                values[name] = _pick(resources, PromptTemplate, "prompt_template")
            elif name == "resources":
                values[name] = resources
            elif name == "rollout":
                values[name] = rollout
            else:
                values[name] = attempt
        return self.fn(**values)

    def __repr__(self) -> str:
        return f"<rollout agent {self.__module__}.{self.__qualname__}>"


def _pick(resources: Resolved, kind: type, name: str) -> Any:
    """The resource called ``name`` if it is of ``kind``, else the only resource of that kind (one resource published
    under several names, as `GRPO` publishes its policy as ``llm`` and ``main_llm``, counts once)."""
    found = resources.get(name)
    if isinstance(found, kind):
        return found
    of_kind: list[Any] = []
    for r in resources.values():
        if isinstance(r, kind) and r not in of_kind:
            of_kind.append(r)
    if len(of_kind) == 1:
        return of_kind[0]
    label = kind.__name__
    if not of_kind:
        raise LookupError(f"the agent asks for `{name}` but the rollout's resources have no {label}")
    raise LookupError(
        f"the agent asks for `{name}` but the resources have {len(of_kind)} of type {label} and none is "
        f"named {name!r}: name one {name!r}, or take `resources` and pick"
    )


def rollout(fn: Callable[..., Any]) -> FunctionAgent:
    """Make a function (sync or async) an agent. Its parameters are injected by name:

    ``task`` the task input; ``llm`` the `LLM` resource (the one named "llm", else the only one), routed to the
    attempt: use ``llm.endpoint`` (or ``llm.base_url()``) as the OpenAI ``base_url``; ``prompt_template`` the
    `PromptTemplate` (same rule); ``resources`` all resources by name; ``rollout`` the `Rollout`; ``attempt`` the
    `Attempt`. Any other name is a `TypeError` right here, not at the first rollout.

    Example::

        @rollout
        def solve(task, llm):
            client = OpenAI(base_url=llm.endpoint, api_key="none")
            reply = client.chat.completions.create(model=llm.model, messages=[...])
            return 1.0 if task["answer"] in reply.choices[0].message.content else 0.0
    """
    if not callable(fn):
        raise TypeError("@rollout decorates a function")
    return FunctionAgent(fn)


class ResourceNotPublished(KeyError):
    """An agent asked for a resource its rollout's resources version does not have; the message names the ones it
    has (a `KeyError`, so ``resources.get(name)`` and ``name in resources`` behave as on a dict)."""

    def __str__(self) -> str:  # KeyError's own str() is the repr of its argument
        return str(self.args[0])


class RoutedResources(dict[str, Any]):
    """The resources an attempt receives (a plain dict, but asking for a name that was not published raises
    `ResourceNotPublished` naming the published ones instead of a bare ``KeyError: 'main_llm'``)."""

    def __missing__(self, name: str) -> Any:
        published = ", ".join(repr(k) for k in self) or "none"
        raise ResourceNotPublished(
            f"resource {name!r} was not published; the resources of this rollout are {published} (a trainer publishes "
            "its policy as 'llm', 'main_llm' and the name its llm_name setting gives)"
        )


def route_resources(
    items: Mapping[str, LLM | PromptTemplate], rollout_id: str, attempt_id: str, *, api_key: str | None = None
) -> RoutedResources:
    """The resources as an attempt sees them: each LLM's ``endpoint`` replaced by its base URL routed to the
    attempt (``.../rollouts/{rid}/attempts/{aid}/v1``), so every call the agent makes is attributed to it.
    ``api_key``: the key gateway (routed) endpoints get instead of theirs (a runner's scoped token, which the
    gateway accepts for the attempts that runner leased)."""
    out = RoutedResources()
    for name, item in items.items():
        if isinstance(item, LLM):
            key = api_key if api_key is not None and item.routed else item.api_key
            item = msgspec.structs.replace(item, endpoint=item.base_url(rollout_id, attempt_id), api_key=key)
        out[name] = item
    return out


# -- import references -------------------------------------------------------------------------------------------


def load_agent(ref: str | LitAgent | Callable[..., Any]) -> LitAgent:
    """Resolve an agent: ``"module:object"`` (``object`` may be dotted, e.g. ``Class.attr``; the working folder is
    on the import path, so ``my_agents:solve`` finds ``./my_agents.py``), or ``"path/to/script.py:object"`` (the
    script is loaded under a private module name, so its ``if __name__ == "__main__":`` block does not run). A
    `LitAgent` subclass is instantiated without arguments; a plain function is wrapped with `rollout`. A missing
    module, file or attribute is an `ImportError` saying which and where it looked (`lightrail._imports`)."""
    obj: Any = ref
    if isinstance(ref, str):
        try:
            obj = import_object(ref)
        except (MissingReference, ValueError) as exc:
            raise type(exc)(f"agent {exc}") from None
    if isinstance(obj, type) and issubclass(obj, LitAgent):
        obj = obj()
    if isinstance(obj, LitAgent):
        return obj
    if callable(obj):
        return rollout(obj)
    raise TypeError(f"{ref!r} is not an agent (a LitAgent, a LitAgent subclass or a function)")


def check_agent_file(ref: str) -> None:
    """That an agent reference is well formed and, for a ``script.py:object``, that the script exists (without
    running it: it may be the script running us); the `ImportError`/`ValueError` of `load_agent` otherwise."""
    try:
        check_file_reference(ref)
    except (MissingReference, ValueError) as exc:
        raise type(exc)(f"agent {exc}") from None


def agent_reference(agent: str | LitAgent | Callable[..., Any]) -> str:
    """An import reference another process can give to `load_agent` to get this agent.

    Strings are returned as they are. Objects are found by ``__module__`` and ``__qualname__`` (a decorated
    function, a class) or, for `LitAgent` instances, by the module-level name bound to them. Objects of a
    script run as ``__main__`` are referenced by the script's path (the script must guard its entry point
    with ``if __name__ == "__main__":``). Lambdas, nested functions and objects defined interactively cannot be
    re-imported: a `ValueError` says so.
    """
    if isinstance(agent, str):
        return agent
    target: Any = agent
    if isinstance(agent, LitAgent) and not isinstance(agent, FunctionAgent):
        module = sys.modules.get(type(agent).__module__)
        name = next((k for k, v in vars(module).items() if v is agent), None) if module else None
        if name is None:
            raise ValueError(
                f"cannot find the {type(agent).__name__} instance at module level of {type(agent).__module__}; "
                f"pass the class, a 'module:object' string, or bind the instance to a module-level name"
            )
        module_name, qualname = type(agent).__module__, name
    else:
        module_name, qualname = getattr(target, "__module__", ""), getattr(target, "__qualname__", "")
        if not module_name or not qualname:
            raise ValueError(f"{agent!r} has no __module__/__qualname__; pass a 'module:object' string")
        if "<lambda>" in qualname or "<locals>" in qualname:
            raise ValueError(
                f"{qualname} is a lambda or is defined inside a function: runner processes cannot import it; "
                f"define the agent at module level"
            )
    if module_name == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if not main_file:
            raise ValueError(
                "the agent is defined in an interactive session (__main__ has no file): runner processes cannot "
                "import it; move it to a module and pass 'module:object'"
            )
        return f"{os.path.abspath(main_file)}:{qualname}"
    if module_name.startswith(FILE_MODULE_PREFIX):  # loaded from a script by load_agent: keep the path
        return f"{sys.modules[module_name].__file__}:{qualname}"
    return f"{module_name}:{qualname}"
