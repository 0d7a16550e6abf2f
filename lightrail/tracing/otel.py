"""OpenTelemetry in runner processes: every framework span becomes a span of the attempt that made it.

Agent frameworks (the openai client, LangChain/LangGraph, the OpenAI Agents SDK, AutoGen, CrewAI) describe their
work as OpenTelemetry spans through OpenInference instrumentors. `setup` turns that on in a runner process:

* an OTel `SpanProcessor` stamps every span started inside an attempt (`lightrail.tracing.current_attempt`,
  contextvars) with `Attr.ROLLOUT_ID` / `Attr.ATTEMPT_ID`; spans started outside any attempt are counted
  (`OTel.unattributed`) and never exported;
* ``exporter="sink"`` (default): when such a span ends it is converted to a lightrail `Span` (attributes through
  `lightrail.tracing.semconv.normalize`) and handed to the attempt's sink — the runner's `SpanBatcher`, which the
  runner flushes before it reports the attempt finished, so framework spans are in the store by then;
  ``exporter="otlp"``: a standard ``BatchSpanProcessor(OTLPSpanExporter)`` posts them to the store server's
  ``/v1/traces`` (attributed there by the stamped attributes); the runner calls `OTel.force_flush` before it
  reports an attempt finished;
* the runner runs each attempt's agent inside `OTel.attempt_parent`: the current OTel span is a remote
  ``NonRecordingSpan`` with the attempt's trace id and the runner's rollout span id, so framework root spans hang
  under the rollout span in the attempt's trace;
* the OpenAI Agents SDK's own tracing switches (`set_tracing_disabled`, ``RunConfig(tracing_disabled=True)``,
  ``OPENAI_AGENTS_DISABLE_TRACING``), which the SDK advises for non-OpenAI backends because its default exporter
  uploads to OpenAI, do not apply inside attempts: there the SDK's only trace processor is OpenInference's (installed
  exclusively: OpenAI's exporter is removed), so its spans go to lightrail alone and calls keep their agent names.
  Outside attempts the switches work as the user set them. If another processor that uploads to OpenAI is
  registered, lightrail leaves the switches alone and warns once (`_AgentsSDKTracing`). ``OTEL_SDK_DISABLED=true``
  (CrewAI's advice to turn its telemetry off) would make lightrail's own provider a no-op: the provider lightrail
  creates stays on (it exports only to the store); a provider the user made under that variable gets a warning;
* outgoing ``httpx`` / ``httpx2`` requests (the openai client, LangChain, the Agents SDK, AutoGen and litellm all
  use one of them) carry the W3C ``traceparent`` of the current span, so the gateway makes its LLM-call span a child of the
  framework span that made the call, and the adapter's ancestor walk finds the agent that made it. They also carry
  ``x-lightrail-agent`` (`current_agent`: a `lightrail.as_agent` name, the LangGraph node, or the agent of the
  current span), which the gateway records and by which a gateway serving one policy per agent picks the call's
  policy. This is a minimal stamp in `lightrail.tracing.naming`'s wrapper of ``Client.send`` /
  ``AsyncClient.send`` (no extra client span per request, unlike opentelemetry-instrumentation-httpx, which also
  does not know httpx2).

This module imports OpenTelemetry at the top; nothing imports it unless OTel is turned on (``Runner(otel=True)``,
``lightrail runner --otel``), so ``import lightrail`` stays light.

Concurrency model: OTel's global `TracerProvider` can be set once per process, so there is one provider and one
`_AttemptProcessor` per process, created by the first `setup`; `OTel.shutdown` deactivates them (and removes the
instrumentation) and a later `setup` reactivates them with its own configuration. The processor's callbacks run
in whatever thread starts or ends a span; their shared state is a dict of open spans (single ``dict`` operations,
atomic under the GIL) and counters that are only approximate under free threading.

Example::

    from lightrail.tracing import otel

    handle = otel.setup()                  # in a runner process; Runner(otel=True) does this for you
    print(handle.instrumented)             # ['openai', 'langchain', ...]: the frameworks installed here
    ...
    handle.shutdown()
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from lightrail.adapters.episode import AGENT_NAME_KEYS
from lightrail.tracing import naming
from lightrail.tracing._context import AttemptContext, current_attempt
from lightrail.tracing.naming import named_agent
from lightrail.tracing.semconv import AGENT_OPERATIONS, names_its_agent, normalize, status_code
from lightrail.types import (
    AGENT_HEADER,
    Attr,
    Span,
    SpanEvent,
    SpanStatus,
    agent_header_value,
    next_seq,
    normalize_agent_name,
)

__all__ = ["FRAMEWORKS", "OTel", "current", "current_agent", "setup", "to_lightrail_span", "traceparent"]

log = logging.getLogger(__name__)

FRAMEWORKS: dict[str, tuple[str, str, str]] = {
    "openai": ("openai", "openinference.instrumentation.openai", "OpenAIInstrumentor"),
    "langchain": ("langchain_core", "openinference.instrumentation.langchain", "LangChainInstrumentor"),
    "openai_agents": ("agents", "openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    "autogen_agentchat": (
        "autogen_agentchat",
        "openinference.instrumentation.autogen_agentchat",
        "AutogenAgentChatInstrumentor",
    ),
    "crewai": ("crewai", "openinference.instrumentation.crewai", "CrewAIInstrumentor"),
}
"""Instrumentor names `setup` knows: name -> (the framework's module, the OpenInference instrumentor's module, its
class). ``instrument=True`` enables each one whose framework and instrumentor are both installed."""

_EXTRA = {"openai": "otel", "openai_agents": "openai-agents", "autogen_agentchat": "autogen"}


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a parent package may be imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package
        return False


def _json_attributes(attributes: Any) -> dict[str, Any]:
    """OTel attributes as a JSON-shaped dict (OTel keeps sequences as tuples)."""
    out = dict(attributes) if attributes else {}
    for key, value in out.items():
        if type(value) is tuple:
            out[key] = list(value)
    return out


def to_lightrail_span(span: ReadableSpan, ctx: AttemptContext) -> Span:
    """An ended OTel span as a lightrail `Span` of ``ctx``'s attempt (ids in hex, times in seconds, attributes
    normalized by `lightrail.tracing.semconv.normalize` and stamped with the attempt's ids)."""
    sc = span.context
    parent = span.parent
    attributes = _json_attributes(span.attributes)
    attributes[Attr.ROLLOUT_ID] = ctx.rollout_id
    attributes[Attr.ATTEMPT_ID] = ctx.attempt_id
    name = span.name
    normalize(name, attributes)
    status = span.status
    start = span.start_time or 0
    return Span(
        rollout_id=ctx.rollout_id,
        attempt_id=ctx.attempt_id,
        seq=next_seq(),
        name=name,
        span_id=f"{sc.span_id:016x}",
        trace_id=f"{sc.trace_id:032x}",
        parent_id=f"{parent.span_id:016x}" if parent is not None else None,
        start_time=start / 1e9,
        end_time=span.end_time / 1e9 if span.end_time is not None else None,
        attributes=attributes,
        events=[
            SpanEvent(
                name=e.name,
                time=e.timestamp / 1e9,
                attributes=_json_attributes(e.attributes),
            )
            for e in span.events
        ],
        status=SpanStatus(code=status_code(status.status_code.value), message=status.description or ""),
    )


class _AttemptProcessor(SpanProcessor):
    """Stamps spans started inside an attempt and routes them to that attempt (sink) or to an OTLP exporter.

    ``_open`` maps the span id of every started, not yet ended span of an attempt to its `AttemptContext` (the
    span that ends is a fresh `ReadableSpan`, and it may end in another thread or task than it started in).
    When an attempt ends (`end_attempt`, at the end of `OTel.attempt_parent`) its spans that never ended (abandoned
    by their code: a stream never read to the end) are forgotten, so a long-running process keeps nothing of ended
    attempts; such a span ending later is not exported (its attempt's spans were complete in the store when the
    attempt finished).
    """

    def __init__(self) -> None:
        self.active = False
        self.exporter: Literal["sink", "otlp"] = "sink"
        self.batch: SpanProcessor | None = None
        self.exported = 0
        self.unattributed = 0
        self._open: dict[int, AttemptContext] = {}
        self._by_trace: dict[int, AttemptContext] = {}
        self.live: dict[int, SDKSpan] = {}
        """Open span id -> the span itself, still being written: `current_agent` reads the agent from its
        attributes and its ancestors' as they are when the LLM call is made (instrumentations set the agent's name
        after starting its span: CrewAI's ``graph.node.id``)."""
        self._of_attempt: dict[str, set[int]] = {}
        """Attempt id -> the ids of its open spans (dropped from `_open` and `live` by `end_attempt`)."""

    def on_start(self, span: SDKSpan, parent_context: Any = None) -> None:
        if not self.active:
            return
        ctx = current_attempt()
        if ctx is None:
            # a thread the framework started without copying the context still carries the attempt's OTel
            # context when the framework propagates it: the trace id names the attempt
            ctx = self._by_trace.get(span.context.trace_id) if self._by_trace else None
            if ctx is None:
                self.unattributed += 1
                return
        if self.batch is not None:  # OTLP: the store attributes the span by these (the sink path adds them itself)
            span.set_attributes({Attr.ROLLOUT_ID: ctx.rollout_id, Attr.ATTEMPT_ID: ctx.attempt_id})
        span_id = span.context.span_id
        self._open[span_id] = ctx
        self.live[span_id] = span
        self._of_attempt.setdefault(ctx.attempt_id, set()).add(span_id)

    def end_attempt(self, attempt_id: str) -> None:
        """Forget the spans of attempt ``attempt_id`` that are still open: it has ended."""
        for span_id in self._of_attempt.pop(attempt_id, ()):
            self._open.pop(span_id, None)
            self.live.pop(span_id, None)

    def agent_of(self, span_id: int) -> str | None:
        """The agent open span ``span_id`` runs in, from its attributes and its open ancestors' as they are now:
        the nearest that names the agent it is, else the nearest that names one at all
        (`semconv.names_its_agent`), as `lightrail.adapters.agent_name_of` reads the ended spans."""
        fallback = None
        span = self.live.get(span_id)
        for _ in range(256):  # bounded: spans nest far less deep
            if span is None:
                break
            agent, its_own = _agent_named(span)
            if agent is not None:
                if its_own:
                    return agent
                fallback = fallback or agent
            parent = span.parent
            span = self.live.get(parent.span_id) if parent is not None else None
        return fallback

    def on_end(self, span: ReadableSpan) -> None:
        span_id = span.context.span_id
        self.live.pop(span_id, None)
        ctx = self._open.pop(span_id, None)
        if ctx is None:
            return
        if (open_ids := self._of_attempt.get(ctx.attempt_id)) is not None:
            open_ids.discard(span_id)
        if not self.active:
            return
        self.exported += 1
        if self.batch is not None:
            self.batch.on_end(span)
            return
        try:
            ctx.sink.submit(to_lightrail_span(span, ctx))
        except Exception:  # tracing must never break the agent
            log.exception("could not record OTel span %r", span.name)

    def shutdown(self) -> None:
        if self.batch is not None:
            self.batch.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.batch.force_flush(timeout_millis) if self.batch is not None else True


class OTel:
    """The handle `setup` returns: what was enabled, counters, and `shutdown`."""

    def __init__(self, processor: _AttemptProcessor, provider: TracerProvider, instrumented: list[str]) -> None:
        self.processor = processor
        self.provider = provider
        self.instrumented = instrumented
        """The OpenInference instrumentors enabled (`FRAMEWORKS` names)."""
        self._instrumentors: list[Any] = []
        self._undo: list[Any] = []  # callables restoring what setup changed in frameworks

    @property
    def exporter(self) -> str:
        return self.processor.exporter

    @property
    def exported(self) -> int:
        """Spans of attempts handed to the sink or the OTLP exporter so far."""
        return self.processor.exported

    @property
    def unattributed(self) -> int:
        """Spans started outside any attempt (not exported) so far."""
        return self.processor.unattributed

    @contextlib.contextmanager
    def attempt_parent(self, ctx: AttemptContext, span_id: str) -> Iterator[None]:
        """Run the enclosed code (an attempt's agent) with a current OTel span that stands for the runner's span
        ``span_id`` in ``ctx``'s trace: spans started inside are in the attempt's trace, roots under that span.

        On exit the attempt has ended: its spans still open are forgotten (`_AttemptProcessor.end_attempt`). Must be
        entered and exited in the same task or thread (it attaches an OTel context)."""
        trace_id = int(ctx.trace_id, 16)
        parent = SpanContext(trace_id, int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
        self.processor._by_trace[trace_id] = ctx
        try:
            yield
        finally:
            self.processor._by_trace.pop(trace_id, None)
            self.processor.end_attempt(ctx.attempt_id)
            otel_context.detach(token)

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now (OTLP mode; a no-op for the sink, which the runner flushes itself). Blocks:
        call it from a thread in async code."""
        return self.processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush, stop exporting, remove the instrumentation and the ``traceparent`` injection. The provider stays
        (OTel allows one per process); a later `setup` reuses it."""
        global _handle
        with _lock:
            if _handle is not self:
                return
            self.force_flush()
            self.processor.active = False
            self.processor._open.clear()  # spans never ended (abandoned by their code): nothing will pop them
            self.processor.live.clear()
            self.processor._of_attempt.clear()
            if self.processor.batch is not None:
                self.processor.batch.shutdown()
                self.processor.batch = None
            for instrumentor in self._instrumentors:
                with contextlib.suppress(Exception):
                    instrumentor.uninstrument()
            self._instrumentors = []
            for undo in reversed(self._undo):
                with contextlib.suppress(Exception):
                    undo()
            self._undo = []
            _uninject()
            _handle = None


_lock = threading.Lock()
_handle: OTel | None = None
_provider: TracerProvider | None = None
_processor: _AttemptProcessor | None = None


def current() -> OTel | None:
    """The active handle (after `setup`, before its `OTel.shutdown`), or None."""
    return _handle


def setup(
    *,
    instrument: bool | Iterable[str] = True,
    exporter: Literal["sink", "otlp"] = "sink",
    store_url: str | None = None,
    token: str | None = None,
) -> OTel:
    """Turn OpenTelemetry on in this process: spans started inside attempts become spans of those attempts.

    ``instrument``: True enables the OpenInference instrumentor of every installed framework in `FRAMEWORKS`; a
    list of names enables those (an unknown name is a ValueError, a missing package an ImportError naming the
    extra to install); False none. ``exporter``: ``"sink"`` hands spans to the attempt's sink (the runner's
    batcher); ``"otlp"`` exports them to ``store_url + "/v1/traces"`` with ``token`` as bearer token.

    Idempotent: while a setup is active, calling it again returns the same handle (and enables instrumentors
    it was not asked for before); asking for another exporter then is a ValueError.
    """
    global _handle, _provider, _processor
    if exporter not in ("sink", "otlp"):
        raise ValueError(f"exporter must be 'sink' or 'otlp', not {exporter!r}")
    if exporter == "otlp" and not store_url:
        raise ValueError("exporter='otlp' needs store_url (the store server's URL)")
    names = _instrumentor_names(instrument)
    with _lock:
        if _handle is not None:
            if exporter != _handle.exporter:
                raise ValueError(
                    f"OpenTelemetry is already set up with exporter={_handle.exporter!r}; shut it down first"
                )
            _instrument(_handle, names)
            return _handle
        if _provider is None:
            _provider, _processor = _install_provider()
        assert _processor is not None
        _processor.exporter = exporter
        _processor.exported = _processor.unattributed = 0  # the counters are this handle's
        if exporter == "otlp":
            _processor.batch = _otlp_processor(str(store_url), token)
        handle = OTel(_processor, _provider, [])
        _instrument(handle, names)
        _inject()
        _processor.active = True
        _handle = handle
        return handle


def _install_provider() -> tuple[TracerProvider, _AttemptProcessor]:
    """The process's SDK provider with our processor: the global one if the user set an SDK provider, else a new
    one made global."""
    processor = _AttemptProcessor()
    current = trace.get_tracer_provider()
    created = not isinstance(current, TracerProvider)
    if isinstance(current, TracerProvider):
        provider = current
    else:
        from opentelemetry.sdk.resources import Resource

        provider = TracerProvider(resource=Resource.create({"service.name": "lightrail-runner"}))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:
            raise RuntimeError(
                "another OpenTelemetry TracerProvider (not the SDK's) is already global in this process; "
                "lightrail needs an opentelemetry.sdk.trace.TracerProvider"
            )
    if getattr(provider, "_disabled", False):  # OTEL_SDK_DISABLED=true when the provider was made
        if created:
            # lightrail was asked for OTel (otel=True): its own provider stays on, and exports only to the store.
            # The variable keeps its meaning for everything else (CrewAI reads it to turn its telemetry off).
            provider._disabled = False
            log.info("OTEL_SDK_DISABLED is set: lightrail's runner keeps its own tracer provider on (store only)")
        else:
            log.warning(
                "the global OpenTelemetry TracerProvider was created with OTEL_SDK_DISABLED=true, so it makes no "
                "spans: LLM calls are not attributed to agents. Unset OTEL_SDK_DISABLED (CrewAI's telemetry has its "
                "own switch, CREWAI_DISABLE_TELEMETRY) or let lightrail create the provider."
            )
    provider.add_span_processor(processor)
    return provider, processor


def _otlp_processor(store_url: str, token: str | None) -> SpanProcessor:
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    headers = {"authorization": f"Bearer {token}"} if token else None
    session = requests.Session()
    session.trust_env = False  # never send the token and the spans through a proxy from the environment
    exporter = OTLPSpanExporter(endpoint=store_url.rstrip("/") + "/v1/traces", headers=headers, session=session)
    # The default queue (2048 spans) overflows, dropping spans, with many concurrent framework attempts.
    return BatchSpanProcessor(exporter, schedule_delay_millis=200, max_queue_size=65536)


def _instrumentor_names(instrument: bool | Iterable[str]) -> list[str]:
    if instrument is True:
        return [n for n, (framework, module, _) in FRAMEWORKS.items() if _installed(framework) and _installed(module)]
    if instrument is False:
        return []
    if isinstance(instrument, str):
        raise TypeError("instrument must be True, False or a list of names, not a string")
    names = list(instrument)
    for name in names:
        if name not in FRAMEWORKS:
            raise ValueError(f"unknown instrumentor {name!r}; known: {', '.join(FRAMEWORKS)}")
        framework, module, _ = FRAMEWORKS[name]
        if not (_installed(framework) and _installed(module)):
            raise ImportError(
                f"instrumenting {name} needs {framework} and {module.replace('.', '-').replace('_', '-')}: "
                f"pip install 'lightrail[{_EXTRA.get(name, name)}]'"
            )
    return names


def _instrument(handle: OTel, names: list[str]) -> None:
    for name in names:
        if name in handle.instrumented:
            continue
        _, module, cls = FRAMEWORKS[name]
        instrumentor = getattr(importlib.import_module(module), cls)()
        if not instrumentor.is_instrumented_by_opentelemetry:  # else someone else did: theirs to remove
            instrumentor.instrument(tracer_provider=handle.provider)
            handle._instrumentors.append(instrumentor)
            if name == "openai_agents":
                handle._undo.append(_AgentsSDKTracing().install())
        handle.instrumented.append(name)


class _AgentsSDKTracing:
    """Keeps the OpenAI Agents SDK's spans flowing inside attempts when the user switched its tracing off.

    The SDK's switches are a global flag (`set_tracing_disabled`, or ``OPENAI_AGENTS_DISABLE_TRACING`` read once)
    and a per-run ``disabled`` argument (``RunConfig.tracing_disabled``); a disabled trace is a no-op, so no agent
    span reaches OpenInference's processor and no call can be attributed. Installed, this wraps the provider's
    ``set_disabled`` (the user's wish is remembered, the provider stays enabled) and ``create_trace`` /
    ``create_span``: inside an attempt they are created enabled, outside they follow the user's wish. Only while the
    provider's processors cannot upload (none is the SDK's OpenAI exporter); otherwise the switches apply as set and
    one warning per process says why attribution is off.
    """

    warned = False

    def __init__(self) -> None:
        from agents.tracing import get_trace_provider

        self.provider = get_trace_provider()
        provider = self.provider
        self.originals = {n: getattr(provider, n) for n in ("set_disabled", "create_trace", "create_span")}
        refresh = getattr(provider, "_refresh_disabled_flag", None)
        if refresh is not None:
            refresh()  # reads OPENAI_AGENTS_DISABLE_TRACING unless set_tracing_disabled was called
        self.user_disabled = bool(getattr(provider, "_disabled", False))

    def install(self) -> Any:
        provider, originals = self.provider, self.originals
        if not hasattr(provider, "_multi_processor"):  # not the SDK's DefaultTraceProvider: leave it alone
            return lambda: None

        def set_disabled(disabled: bool) -> None:
            self.user_disabled = bool(disabled)
            if not self._safe():
                originals["set_disabled"](disabled)

        def create_trace(*args: Any, **kwargs: Any) -> Any:
            kwargs["disabled"] = self._disabled(kwargs.get("disabled", False))
            return originals["create_trace"](*args, **kwargs)

        def create_span(*args: Any, **kwargs: Any) -> Any:
            kwargs["disabled"] = self._disabled(kwargs.get("disabled", False))
            return originals["create_span"](*args, **kwargs)

        for name, patched in (
            ("set_disabled", set_disabled),
            ("create_trace", create_trace),
            ("create_span", create_span),
        ):
            setattr(provider, name, patched)  # this provider object only: the class stays as the SDK made it
        originals["set_disabled"](False)  # the flag is ours now; the user's wish is applied per trace

        def undo() -> None:
            for name in originals:
                with contextlib.suppress(AttributeError):
                    delattr(provider, name)  # the class's methods again
            provider.set_disabled(self.user_disabled)

        return undo

    def _disabled(self, asked: bool) -> bool:
        off = asked or self.user_disabled
        if current_attempt() is None:
            return off
        return off and not self._safe()

    def _safe(self) -> bool:
        """Whether no registered processor uploads to OpenAI (the SDK's default exporter)."""
        from agents.tracing.processors import BackendSpanExporter

        processors = getattr(getattr(self.provider, "_multi_processor", None), "_processors", None)
        safe = processors is not None and not any(
            isinstance(getattr(p, "_exporter", None), BackendSpanExporter) for p in processors
        )
        if not safe and not _AgentsSDKTracing.warned:
            _AgentsSDKTracing.warned = True
            log.warning(
                "the OpenAI Agents SDK's tracing is switched off here (set_tracing_disabled / "
                "RunConfig(tracing_disabled=True) / OPENAI_AGENTS_DISABLE_TRACING) and a trace processor that "
                "uploads to OpenAI is registered, so lightrail leaves tracing off: LLM calls of these agents are not "
                "attributed to agents. Remove that processor (agents.set_trace_processors) to get attribution."
            )
        return safe


# -- traceparent and the agent on outgoing httpx requests ------------------------------------------------------


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current OTel span, or None when there is none."""
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def current_agent() -> str | None:
    """The agent making the current call, as far as the runner can tell while it is made: the name of the
    enclosing `lightrail.as_agent` block, else the LangGraph node the code runs in (LangGraph's runnable config),
    else the agent of the current OTel span (its own name attribute, `lightrail.adapters.AGENT_NAME_KEYS`, or its
    nearest ancestor's, tracked by the span processor), each read through `lightrail.types.normalize_agent_name`.
    None when none knows. Sent with every LLM request as `lightrail.types.AGENT_HEADER`."""
    named = named_agent()
    if named is not None:
        return named
    node = _langgraph_node()
    if node is not None:
        return node
    if _processor is None:
        return None
    sc = trace.get_current_span().get_span_context()
    return _processor.agent_of(sc.span_id) if sc.is_valid else None


def _langgraph_node() -> str | None:
    if "langgraph.config" not in sys.modules:  # a process that never ran a graph
        return None
    try:
        config = sys.modules["langgraph.config"].get_config()
    except Exception:  # outside a runnable: no config
        return None
    return normalize_agent_name((config.get("metadata") or {}).get("langgraph_node"))


def _agent_named(span: SDKSpan) -> tuple[str | None, bool]:
    """The agent an open span names in its attributes so far, and whether it is the agent the span is
    (`semconv.names_its_agent`; else the name is used only when no ancestor names one). Names are read through
    `normalize_agent_name`, as the adapters read the ended spans."""
    a = span.attributes or {}
    op = a.get("gen_ai.operation.name")
    if op in AGENT_OPERATIONS and span.name.startswith(f"{op} ") and "openinference.span.kind" not in a:
        # GenAI names the span ``invoke_agent <gen_ai.agent.name>``; instrumentations that fill the attribute at
        # the end start it with a default (the OpenAI Agents one: ``OpenAI Agent``): the span name is right early
        name = normalize_agent_name(span.name.removeprefix(f"{op} "))
        if name is not None:
            return name, True
    for key in AGENT_NAME_KEYS:
        name = normalize_agent_name(a.get(key))
        if name is not None:
            return name, names_its_agent(a)
    if a.get("openinference.span.kind") == "AGENT":
        name = normalize_agent_name(span.name)
        return name, name is not None
    return None, False


def _stamp(request: Any) -> None:
    """``traceparent`` and `AGENT_HEADER` on an outgoing request, unless the caller (or `lightrail.as_agent`) set
    them, with `current_agent`'s name."""
    headers = request.headers
    if "traceparent" not in headers and (value := traceparent()) is not None:
        headers["traceparent"] = value
    if AGENT_HEADER not in headers and (agent := current_agent()) is not None:
        headers[AGENT_HEADER] = agent_header_value(agent)


def _inject() -> None:
    naming.add_stamp(_stamp, naming.OTEL)


def _uninject() -> None:
    naming.remove_stamp(_stamp)
