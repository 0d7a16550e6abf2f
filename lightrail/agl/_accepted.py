"""Agent Lightning names that are accepted and do nothing here, because lightrail does their work itself: its
tracers (lightrail records LLM calls at its gateway and spans through its runner), its in-memory store (lightrail
keeps a durable store of its own) and its execution strategies (lightrail starts runner processes)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentOpsTracer", "ClientServerExecutionStrategy", "DummyTracer", "FastAlgorithm", "InMemoryLightningStore",
    "OtelTracer", "SharedMemoryExecutionStrategy", "Tracer",
]  # fmt: skip


class _Accepted:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


class Tracer(_Accepted):
    """Accepted by ``Trainer(tracer=...)``; lightrail traces every attempt itself."""

    def get_langchain_handler(self, tags: Any = None) -> Any:
        from lightrail.agl._agent import Tracer as _Tracer

        return _Tracer().get_langchain_handler(tags)


class AgentOpsTracer(Tracer):
    pass


class OtelTracer(Tracer):
    pass


class DummyTracer(Tracer):
    pass


class InMemoryLightningStore(_Accepted):
    """Accepted by ``Trainer(store=...)``: the run goes to lightrail's own (durable) store."""


class ClientServerExecutionStrategy(_Accepted):
    pass


class SharedMemoryExecutionStrategy(_Accepted):
    pass


class FastAlgorithm(_Accepted):
    """Agent Lightning's marker for algorithms ``dev`` may run; lightrail's ``dev`` runs each task once."""
