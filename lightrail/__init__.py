"""lightrail: make any LLM agent learn from its own runs.

``import lightrail`` stays light: names are loaded on first use, so a runner process that only needs the store
client never imports the model plane (torch, transformers) or OpenTelemetry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail._lazy import lazy_face


def _version() -> str:
    """The installed distribution's version: pyproject.toml's ``version`` is its one source."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lightrail")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "0+unknown"


if TYPE_CHECKING:  # the export list (read by `lazy_face`; names load on first use)
    from lightrail.agent import LitAgent, Runner, rollout
    from lightrail.algorithms.grpo import GRPO
    from lightrail.store import MemoryStore, SQLiteStore, Store, StoreClient, open_store
    from lightrail.store.client import feedback
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

    __version__: str

_EXPORTS, __all__, __getattr__, __dir__ = lazy_face(__name__, __file__, computed={"__version__": _version})
