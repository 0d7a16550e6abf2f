"""Plain LangChain (chains, runnables, chat models; LangGraph too): each LLM call named by the runnable that made it.

A LangChain agent written as runnables names its parts as LangChain does: a run name
(``chain.with_config(run_name="writer")``, ``invoke(..., config={"run_name": "writer"})``), a function's name
(``RunnableLambda(write)``, ``@chain def write(...)``), a chat model's ``name=``, or a tag ``agent:<name>``
(``with_config(tags=["agent:writer"])``). `install` makes every LLM call name the agent it runs in, with no tracer:

* a LangChain callback handler, added to every run in the process through LangChain's configure hook (a
  `ContextVar` whose default is the handler, so no code has to pass it), keeps each open run's agent: an
  ``agent:`` tag the run brought itself (not inherited from its parent), else its own name unless that is a
  LangChain class name (``RunnableSequence``, ``ChatPromptTemplate``, ``ChatOpenAI``: a name nobody chose), else
  its parent's agent;
* a header stamp (`lightrail.tracing.naming.add_stamp`) sends, with each HTTP request made while a chat model or
  LLM runs, the agent of that model's run as `lightrail.types.AGENT_HEADER` — or, inside a LangGraph node, the
  node (LangGraph's ``langgraph_node`` metadata, as a runner with OpenTelemetry on names it).

A name set by the caller, with `lightrail.as_agent` or guessed by a runner with OpenTelemetry on wins over this one
(the stamp's priority is `lightrail.tracing.naming.LANGCHAIN`, after theirs). The handler runs inline (LangChain calls
it in the model's own task or thread, before the request), so it marks the model run the request belongs to in a
`ContextVar`; a request LangChain makes outside any model run (a raw client inside a named chain) gets the agent of
the innermost run of LangChain's runnable config.

Imports LangChain; `lightrail.agent.Runner` calls `install` when ``langchain_core`` is imported by the agent.

Concurrency model: run records live in an `OrderedDict` keyed by run id, bounded by evicting the oldest (single
operations, atomic under the GIL; callbacks come from any thread); the model run of the current code is a
`ContextVar`, so concurrent runs in tasks and threads never see each other's.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers.context import register_configure_hook

from lightrail.tracing import naming
from lightrail.types import AGENT_HEADER, agent_header_value, normalize_agent_name

__all__ = ["current_agent", "install"]

AGENT_TAG = "agent:"
"""A LangChain tag ``agent:<name>`` names the agent of the run it is given to (and of that run's children)."""


_MAX_OPEN_RUNS = 100_000
_MAX_CLASS_NAMES = 4096


@dataclass(slots=True)
class _Run:
    agent: str | None
    tags: frozenset[str]
    outer_model_run: UUID | None
    """The model run marked in the context before this model run started (restored at its end)."""


class _RunAgents(BaseCallbackHandler):
    """Keeps the agent of every open LangChain run and marks the model run the current code is in."""

    run_inline = True  # called in the run's own task or thread: the context variable set here is the request's
    raise_error = False

    def __init__(self, max_open_runs: int = _MAX_OPEN_RUNS) -> None:
        self.runs: OrderedDict[UUID, _Run] = OrderedDict()
        """Open runs, oldest first."""
        self.max_open_runs = max_open_runs
        """Runs never ended (an abandoned stream) cannot grow `runs` past this: the oldest open run is forgotten
        (its calls go unnamed), never the runs of the other rollouts running now."""

    def _start(self, run_id: UUID, parent_run_id: UUID | None, tags: list[str] | None, name: str | None) -> _Run:
        parent = self.runs.get(parent_run_id) if parent_run_id is not None else None
        own = frozenset(tags or ())
        agent = None
        for tag in own - (parent.tags if parent is not None else frozenset()):
            if tag.startswith(AGENT_TAG):
                agent = normalize_agent_name(tag[len(AGENT_TAG) :]) or agent
        if agent is None and name and not _is_class_name(name):
            agent = normalize_agent_name(name)
        if agent is None and parent is not None:
            agent = parent.agent
        run = self.runs[run_id] = _Run(agent, own, None)
        while len(self.runs) > self.max_open_runs:
            with contextlib.suppress(KeyError):  # another thread emptied it meanwhile
                self.runs.popitem(last=False)
        return run

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                       tags: list[str] | None = None, **kwargs: Any) -> None:  # fmt: skip
        self._start(run_id, parent_run_id, tags, kwargs.get("name"))

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None,
                      tags: list[str] | None = None, **kwargs: Any) -> None:  # fmt: skip
        self._start(run_id, parent_run_id, tags, None)  # a tool's name is not an agent's

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                            tags: list[str] | None = None, **kwargs: Any) -> None:  # fmt: skip
        self._model_start(serialized, run_id, parent_run_id, tags, kwargs.get("name"))

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                     tags: list[str] | None = None, **kwargs: Any) -> None:  # fmt: skip
        self._model_start(serialized, run_id, parent_run_id, tags, kwargs.get("name"))

    def _model_start(self, serialized: Any, run_id: UUID, parent_run_id: UUID | None, tags: Any, name: Any) -> None:
        if name is None and isinstance(serialized, dict):
            name = serialized.get("name")  # ChatOpenAI(name="judge"); the class name otherwise
        run = self._start(run_id, parent_run_id, tags, name)
        run.outer_model_run = _model_run.get()
        _model_run.set(run_id)

    def _end(self, *args: Any, run_id: UUID, **kwargs: Any) -> None:
        run = self.runs.pop(run_id, None)
        if run is not None and _model_run.get() == run_id:
            _model_run.set(run.outer_model_run)

    on_chain_end = on_chain_error = on_tool_end = on_tool_error = on_llm_end = on_llm_error = _end


_model_run: ContextVar[UUID | None] = ContextVar("lightrail_langchain_model_run", default=None)


def _is_class_name(name: str) -> bool:
    """Whether ``name`` (``RunnableParallel<a,b>`` read as ``RunnableParallel``) is the name of a `Runnable`
    class: the name LangChain gives a run nobody named."""
    return _is_runnable_class(name.split("<", 1)[0])


@functools.lru_cache(maxsize=_MAX_CLASS_NAMES)
def _is_runnable_class(name: str) -> bool:
    # cached: an attempt has few distinct run names; bounded: run names may be made per task (f"writer-{i}")
    return any(cls.__name__ == name for cls in _subclasses(Runnable))


def _subclasses(cls: type) -> set[type]:
    seen: set[type] = set()
    todo: list[type] = [cls]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


_handler = _RunAgents()
_hook: ContextVar[_RunAgents | None] = ContextVar("lightrail_langchain_runs", default=_handler)
_lock = threading.Lock()
_installed = False


def current_agent() -> str | None:
    """The agent of the LangChain code running now: the LangGraph node, else the agent of the model run the code is
    in, else of the innermost run of LangChain's runnable config; None outside LangChain or when no run names one.
    Names are read through `lightrail.types.normalize_agent_name`, as the adapters read spans."""
    config = var_child_runnable_config.get()
    if config:
        node = normalize_agent_name((config.get("metadata") or {}).get("langgraph_node"))
        if node is not None:
            return node
    runs = _handler.runs
    model_run = _model_run.get()
    if model_run is not None and (run := runs.get(model_run)) is not None:
        return run.agent
    parent = getattr(config.get("callbacks"), "parent_run_id", None) if config else None
    run = runs.get(parent) if parent is not None else None
    return run.agent if run is not None else None


def _stamp(request: Any) -> None:
    if AGENT_HEADER not in request.headers and (agent := current_agent()) is not None:
        request.headers[AGENT_HEADER] = agent_header_value(agent)


def install() -> None:
    """Name every LangChain LLM call in this process by its agent (idempotent)."""
    global _installed
    if _installed:  # the runner asks before every attempt
        return
    with _lock:
        if _installed:
            return
        register_configure_hook(_hook, inheritable=True)
        _installed = True
    naming.add_stamp(_stamp, naming.LANGCHAIN)
