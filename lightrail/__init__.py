"""lightrail: make any LLM agent learn from its own runs.

``import lightrail`` stays light: names are loaded on first use, so a runner process that only needs the store
client never imports the model plane (torch, transformers) or OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # data contract
    "Task": "lightrail.types",
    "Rollout": "lightrail.types",
    "RolloutSpec": "lightrail.types",
    "RolloutStatus": "lightrail.types",
    "Attempt": "lightrail.types",
    "AttemptStatus": "lightrail.types",
    "RetryPolicy": "lightrail.types",
    "Span": "lightrail.types",
    "Resources": "lightrail.types",
    "LLM": "lightrail.types",
    "PromptTemplate": "lightrail.types",
    "Transition": "lightrail.types",
    # store
    "Store": "lightrail.store",
    "MemoryStore": "lightrail.store",
    "SQLiteStore": "lightrail.store",
    "StoreClient": "lightrail.store",
    "open_store": "lightrail.store",
    "feedback": "lightrail.store.client",
    # tracing
    "emit_reward": "lightrail.tracing",
    "emit_event": "lightrail.tracing",
    "as_agent": "lightrail.tracing",
    "emit_message": "lightrail.tracing",
    "emit_exception": "lightrail.tracing",
    "span": "lightrail.tracing",
    # agents and running them
    "LitAgent": "lightrail.agent",
    "rollout": "lightrail.agent",
    "Runner": "lightrail.agent",
    "Trainer": "lightrail.trainer",
    "Algorithm": "lightrail.trainer",
    # algorithms (their heavy dependencies load when one runs, not on import)
    "GRPO": "lightrail.algorithms.grpo",
    "VERL": "lightrail.trainer.config",
}

__all__ = [
    "Algorithm",
    "Attempt",
    "AttemptStatus",
    "GRPO",
    "LLM",
    "LitAgent",
    "MemoryStore",
    "PromptTemplate",
    "Resources",
    "RetryPolicy",
    "Rollout",
    "RolloutSpec",
    "RolloutStatus",
    "Runner",
    "SQLiteStore",
    "Span",
    "Store",
    "StoreClient",
    "Task",
    "Trainer",
    "Transition",
    "VERL",
    "__version__",
    "as_agent",
    "emit_event",
    "emit_exception",
    "emit_message",
    "emit_reward",
    "feedback",
    "open_store",
    "rollout",
    "span",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightrail' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from lightrail.agent import LitAgent, Runner, rollout
    from lightrail.algorithms.grpo import GRPO
    from lightrail.store import MemoryStore, SQLiteStore, Store, StoreClient, open_store
    from lightrail.tracing import as_agent, emit_event, emit_exception, emit_message, emit_reward, span
    from lightrail.trainer import Algorithm, Trainer
    from lightrail.trainer.config import VERL
    from lightrail.types import (
        LLM,
        Attempt,
        AttemptStatus,
        PromptTemplate,
        Resources,
        RetryPolicy,
        Rollout,
        RolloutSpec,
        RolloutStatus,
        Span,
        Task,
        Transition,
    )
