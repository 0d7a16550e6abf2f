"""Agent Lightning's plain data types and aliases that agents and training scripts name (type hints, hooks,
datasets), defined once here for the face."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, Union

from lightrail.agl._resources import LLM, PromptTemplate, ProxyLLM, Resource

__all__ = [
    "AttemptStatus", "Dataset", "Hook", "Resource", "ResourceUnion", "ResourcesUpdate", "RolloutConfig",
    "RolloutMode", "RolloutRawResult", "RolloutStatus", "TaskInput", "Triplet", "configure_logger", "setup_logging",
    "setup_module_logging", "build_component",
]  # fmt: skip

T_co = TypeVar("T_co", covariant=True)

TaskInput = Any
RolloutMode = Literal["train", "val", "test"]
RolloutStatus = Literal["queuing", "preparing", "running", "failed", "succeeded", "cancelled", "requeuing"]
AttemptStatus = Literal["preparing", "running", "failed", "succeeded", "unresponsive", "timeout"]
RolloutRawResult = Union[None, float, list[Any]]  # noqa: UP007 - an alias, as Agent Lightning's
ResourceUnion = Union[LLM, ProxyLLM, PromptTemplate]  # noqa: UP007


class Dataset(Protocol[T_co]):
    """What ``fit``/``dev`` take as a dataset: anything with ``__len__`` and ``__getitem__`` (a list will do)."""

    def __getitem__(self, index: int) -> T_co: ...

    def __len__(self) -> int: ...


@dataclass
class ResourcesUpdate:
    resources_id: str
    resources: dict[str, Any]
    version: int = 0
    create_time: float = 0.0
    update_time: float = 0.0


@dataclass
class RolloutConfig:
    """Agent Lightning's per-rollout retry settings; lightrail's counterpart is `lightrail.types.RetryPolicy`
    (`to_retry_policy`), given to lightrail's ``Trainer(retry=...)``."""

    timeout_seconds: float | None = None
    unresponsive_seconds: float | None = None
    max_attempts: int = 1
    retry_condition: list[str] = field(default_factory=list)

    def to_retry_policy(self) -> Any:
        from lightrail.types import RetryPolicy

        return RetryPolicy(max_attempts=self.max_attempts, timeout_s=self.timeout_seconds)


@dataclass
class Triplet:
    """One LLM call as training data (Agent Lightning's); lightrail's counterpart is `lightrail.types.Transition`."""

    prompt: Any
    response: Any
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class Hook:
    """Callbacks around each rollout (all async, keyword arguments); the face's `Trainer(hooks=...)` calls them in
    the runner processes (``runner`` is None, ``spans`` an empty list: the spans are in lightrail's store)."""

    async def on_rollout_start(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        pass

    async def on_trace_start(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
        pass

    async def on_trace_end(self, *, agent: Any, runner: Any, tracer: Any, rollout: Any) -> None:
        pass

    async def on_rollout_end(self, *, agent: Any, runner: Any, rollout: Any, spans: Any) -> None:
        pass


def setup_logging(level: int | str = "INFO", *args: Any, **kwargs: Any) -> None:
    """Agent Lightning's ``setup_logging``: the ``agentlightning`` and ``lightrail`` loggers at ``level`` on stderr."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("lightrail", "agentlightning"):
        logging.getLogger(name).setLevel(level)


def setup_module_logging(level: int | str = "INFO", name: str = "agentlightning", *args: Any, **kwargs: Any) -> None:
    logging.getLogger(name).setLevel(level)


configure_logger = setup_logging


def build_component(spec: Any, *args: Any, **kwargs: Any) -> Any:
    """Agent Lightning's component spec made an object: an instance is returned as it is, a class or a zero-argument
    factory is called, a ``"module.Name"`` string is imported and called, a dict's ``"type"`` (a class or string) is
    called with the dict's other keys; None stays None. The other arguments (expected type, defaults) are accepted."""
    import importlib
    import inspect

    if spec is None:
        default = kwargs.get("default_factory")
        return default() if default is not None else None
    if isinstance(spec, dict):
        options = dict(spec)
        kind = options.pop("type")
        return build_component(kind)(**options) if not isinstance(kind, type) else kind(**options)
    if isinstance(spec, str):
        module, _, name = spec.rpartition(".")
        spec = getattr(importlib.import_module(module), name)
    if inspect.isclass(spec) or inspect.isfunction(spec):
        return spec()
    return spec
