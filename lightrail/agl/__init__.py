"""Agent Lightning 0.3's public API on lightrail: the one-line move is ``import lightrail.agl as agl``.

Agents and training scripts written against ``import agentlightning as agl`` run with that import line changed
(docs/from-agent-lightning.md). Every name maps onto lightrail's own store, runners, gateway and algorithms: there is
no second store, runner or tracer. A name with no meaning here is either accepted and harmless (Agent Lightning's
tracers, its in-memory store, its execution strategies: lightrail does that work itself) or refused on first use
with one line saying what lightrail does instead (`REFUSED`). This package is the only place the compatibility
lives: delete it and nothing else in lightrail changes.

Names load lazily (`import lightrail.agl` stays as light as `import lightrail`).
"""

from __future__ import annotations

import importlib
from typing import Any

# Agent Lightning name -> module of this package that defines it
MAPPED: dict[str, str] = {
    **dict.fromkeys(
        [
            "LitAgent",
            "rollout",
            "llm_rollout",
            "prompt_rollout",
            "Rollout",
            "AttemptedRollout",
            "Attempt",
            "FunctionalLitAgent",
        ],
        "lightrail.agl._agent",
    ),  # fmt: skip
    **dict.fromkeys(["LLM", "ProxyLLM", "PromptTemplate", "NamedResources"], "lightrail.agl._resources"),
    **dict.fromkeys(
        [
            "Resource",
            "ResourceUnion",
            "ResourcesUpdate",
            "Dataset",
            "Hook",
            "RolloutMode",
            "RolloutStatus",
            "AttemptStatus",
            "RolloutRawResult",
            "TaskInput",
            "RolloutConfig",
            "Triplet",
            "setup_logging",
            "setup_module_logging",
            "configure_logger",
            "build_component",
        ],
        "lightrail.agl._types",
    ),  # fmt: skip
    **dict.fromkeys(
        [
            "emit_reward",
            "emit_annotation",
            "emit_message",
            "emit_object",
            "emit_exception",
            "operation",
            "reward",
            "get_reward_value",
            "get_rewards_from_span",
            "is_reward_span",
            "find_reward_spans",
            "find_final_reward",
            "get_message_value",
            "get_object_value",
        ],
        "lightrail.agl._emitters",
    ),  # fmt: skip
    **dict.fromkeys(["Trainer", "VERL", "APO", "Baseline", "TracerTraceToTriplet"], "lightrail.agl._trainer"),
    **dict.fromkeys(
        [
            "AgentOpsTracer",
            "OtelTracer",
            "DummyTracer",
            "Tracer",
            "InMemoryLightningStore",
            "ClientServerExecutionStrategy",
            "SharedMemoryExecutionStrategy",
            "FastAlgorithm",
        ],
        "lightrail.agl._accepted",
    ),  # fmt: skip
}
"""The names the face gives, each with Agent Lightning's meaning (the accepted ones do nothing here, harmlessly)."""

_STORE = "lightrail's durable store is not Agent Lightning's: use lightrail.open_store / lightrail.StoreClient"
_RUNNER = "lightrail's runner processes run the agent: agl.Trainer(n_runners=...) starts them"
_SPANS = "lightrail records spans itself (lightrail.types.Span; read them with `lightrail show` or Store.query_spans)"
_ALGO = "write a lightrail Algorithm (setup/run/close over a TrainerContext) and pass it to lightrail.Trainer"
_LEGACY = "Agent Lightning's v0 API: lightrail has one (LitAgent, Trainer.fit)"
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        [
            "LightningStore",
            "LightningStoreClient",
            "LightningStoreServer",
            "LightningStoreThreaded",
            "CollectionBasedLightningStore",
            "LightningStoreCapabilities",
            "LightningStoreStatistics",
            "PaginatedResult",
            "FilterOptions",
            "SortOptions",
            "FilterField",
            "EnqueueRolloutRequest",
            "Worker",
            "WorkerStatus",
        ],
        _STORE,
    ),  # fmt: skip
    **dict.fromkeys(
        [
            "Runner",
            "LitAgentRunner",
            "LegacyAgentRunner",
            "ParallelWorkerBase",
            "ExecutionStrategy",
            "ExecutionEvent",
            "ThreadingEvent",
            "MultiprocessingEvent",
        ],
        _RUNNER,
    ),  # fmt: skip
    **dict.fromkeys(
        [
            "Span",
            "SpanCoreFields",
            "SpanContext",
            "SpanNames",
            "SpanAttributeNames",
            "SpanLike",
            "SpanRecordingContext",
            "StatusCode",
            "TraceStatus",
            "TraceState",
            "Event",
            "Link",
            "OtelResource",
            "Attributes",
            "AttributeValue",
            "get_active_tracer",
            "set_active_tracer",
            "clear_active_tracer",
        ],
        _SPANS,
    ),  # fmt: skip
    **dict.fromkeys(
        [
            "Adapter",
            "TraceAdapter",
            "OtelTraceAdapter",
            "TraceToTripletBase",
            "LlmProxyTraceToTriplet",
            "TraceToMessages",
        ],
        "lightrail builds training rows from the gateway's records; select agents with adapter={'agent_match': ...}",
    ),  # fmt: skip
    **dict.fromkeys(["Algorithm", "algo"], _ALGO),
    **dict.fromkeys(
        [
            "AgentLightningClient",
            "AgentLightningServer",
            "DevTaskLoader",
            "RolloutLegacy",
            "RolloutRawResultLegacy",
            "TaskIfAny",
            "Task",
            "GenericResponse",
        ],
        _LEGACY,
    ),  # fmt: skip
    "LLMProxy": "lightrail's gateway serves and records the model (GRPO starts it; Trainer.dev serves an LLM)",
    "LightningEnvVar": "lightrail is configured by arguments and its config file (docs/config.md)",
    "resolve_bool_env_var": "lightrail is configured by arguments and its config file (docs/config.md)",
    "resolve_int_env_var": "lightrail is configured by arguments and its config file (docs/config.md)",
    "resolve_str_env_var": "lightrail is configured by arguments and its config file (docs/config.md)",
    "lightning_cli": "lightrail's command line is `lightrail train CONFIG.yaml`",
}
"""Agent Lightning names with no meaning here: using one raises an AttributeError of one line saying what
lightrail does instead."""

__all__ = sorted(MAPPED)


def __getattr__(name: str) -> Any:
    module = MAPPED.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in REFUSED:
        raise AttributeError(f"agl.{name} is not in lightrail: {REFUSED[name]}")
    raise AttributeError(f"module 'lightrail.agl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
