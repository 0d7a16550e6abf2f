"""Agent Lightning's emitters on lightrail's (`lightrail.tracing`): every one writes a span of the running attempt
through the runner's batcher; outside a rollout they write nothing and return None (Agent Lightning raises without
an active tracer).

Rewards: ``emit_reward(0.8)`` is a final reward (the last one wins, as Agent Lightning's ``find_final_reward``);
``emit_reward({"acc": 1.0, "len": 0.2}, primary_key="acc")`` trains on ``acc`` and keeps every dimension as the
span's ``agl.reward.<name>`` attributes.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightrail import tracing
from lightrail.types import Attr, Span

__all__ = [
    "emit_annotation", "emit_exception", "emit_message", "emit_object", "emit_reward", "find_final_reward",
    "find_reward_spans", "get_reward_value", "is_reward_span", "operation", "reward",
]  # fmt: skip


def emit_reward(
    reward: float | Mapping[str, float],
    *,
    primary_key: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    propagate: bool = True,
) -> Span | None:
    """A final reward: a number, or a dict of named rewards with ``primary_key`` naming the one trained on
    (ValueError without it, as Agent Lightning). ``propagate=False`` records nothing (Agent Lightning then only
    builds the span) and returns None."""
    attrs: dict[str, Any] = dict(attributes or {})
    if isinstance(reward, Mapping):
        if primary_key is None or primary_key not in reward:
            raise ValueError(f"emit_reward with a dict needs primary_key, one of {sorted(reward)}")
        attrs.update({f"agl.reward.{k}": float(v) for k, v in reward.items()})
        value, name = reward[primary_key], primary_key
    else:
        value, name = reward, "reward"
    if not propagate:
        return None
    return tracing.emit_reward(value, name=name, attributes=attrs or None)


def emit_annotation(annotation: Mapping[str, Any], propagate: bool = True) -> Span | None:
    """An annotation (a dict, nested keys flattened with dots) as an event span named ``annotation``."""
    return tracing.emit_event("annotation", **_flat(annotation)) if propagate else None


def emit_message(message: str, attributes: Mapping[str, Any] | None = None, propagate: bool = True) -> Span | None:
    return tracing.emit_message(message, **dict(attributes or {})) if propagate else None


def emit_object(object: Any, attributes: Mapping[str, Any] | None = None, propagate: bool = True) -> Span | None:  # noqa: A002
    """Any JSON-serialisable object (bytes base64-encoded) as an event span named ``object``."""
    if not propagate:
        return None
    obj = object
    body: dict[str, Any]
    if isinstance(obj, (bytes, bytearray)):
        body = {"agl.object.type": "bytes", "agl.object.bytes": base64.b64encode(obj).decode()}
    elif isinstance(obj, (str, int, float, bool)) or obj is None:
        body = {"agl.object.type": type(obj).__name__, "agl.object.literal": obj}
    else:
        body = {"agl.object.type": type(obj).__name__, "agl.object.json": json.dumps(obj, default=str)}
    return tracing.emit_event("object", **body, **dict(attributes or {}))


def emit_exception(
    exception: BaseException, attributes: Mapping[str, Any] | None = None, propagate: bool = True
) -> Any:
    return tracing.emit_exception(exception, **dict(attributes or {})) if propagate else None


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        elif isinstance(value, (str, int, float, bool)) or value is None:
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = json.dumps(value, default=str)
    return out


def operation(
    fn: Callable[..., Any] | str | None = None, *, propagate: bool = True, name: str | None = None, **attrs: Any
) -> Any:
    """A span around a function call (``@operation``, ``@operation(name=...)``: its bound arguments as
    ``agl.operation.input.*``, its return value as ``agl.operation.output``) or a block (``with operation("x"):``).
    Methods work too (the decorator returns a plain function)."""
    if callable(fn):
        return _traced(fn, name or fn.__name__)
    return _Operation(name or (fn if isinstance(fn, str) else None), attrs)


class _Operation:
    def __init__(self, name: str | None, attrs: dict[str, Any]) -> None:
        self.name, self.attrs = name, attrs
        self._span: Any = None

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return _traced(fn, self.name or fn.__name__)

    def __enter__(self) -> Any:
        self._span = tracing.span("operation", **{"agl.operation.name": self.name or "operation"}, **self.attrs)
        return self._span.__enter__()

    def __exit__(self, *exc: Any) -> None:
        assert self._span is not None
        self._span.__exit__(*exc)

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)


def _traced(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with tracing.span("operation", **{"agl.operation.name": name}, **_inputs(fn, args, kwargs)) as s:
                out = await fn(*args, **kwargs)
                s.set_attribute("agl.operation.output", _jsonish(out))
                return out

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with tracing.span("operation", **{"agl.operation.name": name}, **_inputs(fn, args, kwargs)) as s:
            out = fn(*args, **kwargs)
            s.set_attribute("agl.operation.output", _jsonish(out))
            return out

    return run


def _inputs(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    with contextlib.suppress(TypeError, ValueError):
        bound = inspect.signature(fn).bind(*args, **kwargs)
        return {f"agl.operation.input.{k}": _jsonish(v) for k, v in bound.arguments.items() if k != "self"}
    return {}


def _jsonish(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value, default=str)


def reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Agent Lightning's (deprecated) ``@reward``: the function's return value (a number) is emitted as the final
    reward and returned. A return value that is not a number is a TypeError naming the function."""

    def check(value: Any) -> Any:
        if value is not None and not isinstance(value, (int, float)):
            raise TypeError(f"@reward {fn.__qualname__} returned {type(value).__name__}, not a number")
        if value is not None:
            emit_reward(float(value))
        return value

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return check(await fn(*args, **kwargs))

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return check(fn(*args, **kwargs))

    return wrapper


# -- reading rewards back from spans (lightrail's `Span`, e.g. from `Store.query_spans`) ---------------------------


def is_reward_span(span: Span) -> bool:
    return span.name == Attr.SPAN_REWARD


def get_reward_value(span: Span) -> float | None:
    value = span.attributes.get(Attr.REWARD) if is_reward_span(span) else None
    return float(value) if isinstance(value, (int, float)) else None


def find_reward_spans(spans: Sequence[Span]) -> list[Span]:
    return [s for s in spans if is_reward_span(s)]


def find_final_reward(spans: Sequence[Span]) -> float | None:
    """The last final reward in ``spans`` order (Agent Lightning's rule), None if there is none."""
    finals = [s for s in find_reward_spans(spans) if s.attributes.get(Attr.REWARD_FINAL, True)]
    return get_reward_value(finals[-1]) if finals else None


def get_rewards_from_span(span: Span) -> list[dict[str, Any]]:
    """Every named reward of a reward span (``{"name", "value"}``), the trained one first."""
    value = get_reward_value(span)
    if value is None:
        return []
    primary = {"name": str(span.attributes.get(Attr.REWARD_NAME, "reward")), "value": value}
    others = [{"name": k.removeprefix("agl.reward."), "value": v} for k, v in span.attributes.items()
              if k.startswith("agl.reward.") and k.removeprefix("agl.reward.") != primary["name"]]  # fmt: skip
    return [primary, *others]


def get_message_value(span: Span) -> str | None:
    body = span.attributes.get(Attr.MESSAGE_BODY) if span.name == Attr.SPAN_MESSAGE else None
    return body if isinstance(body, str) else None


def get_object_value(span: Span) -> Any:
    """The object an `emit_object` span holds (None for other spans)."""
    attrs = span.attributes
    if span.name != Attr.SPAN_EVENT or attrs.get(Attr.EVENT_NAME) != "object":
        return None
    if "agl.object.bytes" in attrs:
        return base64.b64decode(str(attrs["agl.object.bytes"]))
    if "agl.object.json" in attrs:
        return json.loads(str(attrs["agl.object.json"]))
    return attrs.get("agl.object.literal")
