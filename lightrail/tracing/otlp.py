"""OTLP/HTTP trace requests → lightrail spans: what the store server's ``POST /v1/traces`` runs.

Any OpenTelemetry exporter or collector (``OTLPSpanExporter``, the Collector's ``otlphttp`` exporter, another
language's SDK) can send the spans of an agent framework straight to the store. This module turns one request body
into `Span` objects; the server stores them with the store's ``add_spans`` (all or nothing) and answers with
`response_body`.

Data flow: ``body`` (protobuf ``application/x-protobuf`` or OTLP/JSON ``application/json``, optionally
``Content-Encoding: gzip`` or ``deflate``) → ``ExportTraceServiceRequest`` (opentelemetry-proto) → one `Span`
per OTLP span:

* ids as lowercase hex; ``parent_id`` None for a root span; times from Unix nanoseconds to float seconds;
* attributes from ``AnyValue`` (string, bool, int, double, array, kvlist; bytes as hex), then
  `semconv.normalize` adds lightrail's keys (kind, agent name, tool call, response id);
  ``otel.scope.name`` records the instrumentation that made the span;
* events as `SpanEvent`; status through `semconv.status_code`;
* ``seq`` from `next_seq`, handed out in start-time order within the request (a span's ``seq`` orders it among
  the spans this process writes, so spans of one request keep their real order);
* rollout and attempt from `semconv.attribution`: span attributes, then resource attributes, then the request's
  ``x-lightrail-rollout-id`` / ``x-lightrail-attempt-id`` headers. One span nobody attributes rejects the whole
  request (`UnattributedSpansError`): storing part of a request would silently drop the rest.

Pure functions, no I/O. opentelemetry-proto (and protobuf) is imported on the first request, so a store server
that never receives OTLP never loads it. Speed: the protobuf path reads message fields directly (no
``MessageToDict``); the OTLP/JSON path goes through ``json_format.ParseDict`` after turning the hex ids the OTLP
JSON encoding uses into the base64 protobuf's JSON mapping expects.

    spans = spans_from_body(body, "application/x-protobuf", headers=request.headers)
    await store.add_spans(spans)
"""

from __future__ import annotations

import base64
import functools
import zlib
from collections.abc import Mapping
from typing import Any

from lightrail.tracing.semconv import ATTEMPT_HEADER, ROLLOUT_HEADER, attribution, normalize, status_code
from lightrail.types import JSON, Attr, Span, SpanEvent, SpanStatus, next_seq

__all__ = [
    "CONTENT_TYPES",
    "JSON_MEDIA",
    "PROTOBUF",
    "BodyTooLargeError",
    "OTLPDecodeError",
    "OTLPError",
    "UnattributedSpansError",
    "UnsupportedMediaError",
    "decode_request",
    "media_type",
    "response_body",
    "spans_from_body",
    "spans_from_request",
]

PROTOBUF = "application/x-protobuf"
JSON_MEDIA = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON_MEDIA)
"""The request encodings OTLP/HTTP defines; the answer uses the request's."""
_ALIASES = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON_MEDIA: JSON_MEDIA}
_SCOPE_NAME = "otel.scope.name"
_EXAMPLE_NAMES = 5
_NS = 1_000_000_000  # int / int is correctly rounded; ns / 1e9 is not (1.7e18 ns is not exact in a double)


class OTLPError(ValueError):
    """A request the ingest refuses; ``http_status`` is the answer the server gives."""

    http_status = 400


class UnsupportedMediaError(OTLPError):
    """A content type or content encoding OTLP/HTTP does not define."""

    http_status = 415


class OTLPDecodeError(OTLPError):
    """The body is not a valid OTLP traces request in its declared encoding."""


class BodyTooLargeError(OTLPError):
    """A compressed body whose decompressed size is over the server's body limit."""

    http_status = 413


class UnattributedSpansError(OTLPError):
    """Spans that name no rollout and attempt; the request is refused as a whole."""

    def __init__(self, names: list[str], total: int):
        self.names = names
        self.total = total
        shown = ", ".join(repr(n) for n in names[:_EXAMPLE_NAMES])
        more = f" and {len(names) - _EXAMPLE_NAMES} more" if len(names) > _EXAMPLE_NAMES else ""
        super().__init__(
            f"{len(names)} of {total} spans name no rollout and attempt ({shown}{more}); nothing was stored. "
            f"Attribute them with the resource or span attributes {Attr.ROLLOUT_ID!r} and {Attr.ATTEMPT_ID!r}, "
            f"or send the request with the headers {ROLLOUT_HEADER!r} and {ATTEMPT_HEADER!r}."
        )


@functools.cache
def _messages() -> tuple[type, type]:
    """The request and response message classes (imported on first use: opentelemetry-proto loads protobuf)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    return ExportTraceServiceRequest, ExportTraceServiceResponse


def media_type(content_type: str | None) -> str:
    """The OTLP encoding a ``Content-Type`` header names (parameters such as ``charset`` ignored)."""
    base = (content_type or "").split(";", 1)[0].strip().lower()
    found = _ALIASES.get(base)
    if found is None:
        raise UnsupportedMediaError(
            f"unsupported content type {content_type!r}: OTLP/HTTP traces are sent as "
            f"{' or '.join(repr(t) for t in CONTENT_TYPES)}"
        )
    return found


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib window bits per content encoding: gzip (OTLP's), deflate (zlib format, as HTTP defines it; the Python
OTLP exporter offers it)."""


def _decompress(body: bytes, content_encoding: str | None, max_bytes: int | None) -> bytes:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise UnsupportedMediaError(
            f"unsupported content encoding {content_encoding!r}: send 'gzip', 'deflate' or no encoding"
        )
    inflate = zlib.decompressobj(wbits=wbits)
    try:
        # Bounded: a few KB of gzip can inflate to gigabytes, and the body limit exists to protect memory.
        out = inflate.decompress(body, max_bytes + 1 if max_bytes else 0)
        if not inflate.eof:
            if max_bytes and len(out) > max_bytes:
                raise BodyTooLargeError(f"request body over {max_bytes} bytes once decompressed")
            raise OTLPDecodeError(f"the {encoding} body is truncated")
        if inflate.unused_data:  # a second gzip member: storing only the first would break all-or-nothing
            raise OTLPDecodeError(f"the {encoding} body has data after its end (several members are not supported)")
    except zlib.error as exc:
        raise OTLPDecodeError(f"the body is not valid {encoding}: {exc}") from None
    return out


_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _hex_ids_to_base64(obj: dict, where: str) -> None:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping reads bytes as base64."""
    for key in _ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise OTLPDecodeError(f"{where}.{key} must be a hex string, got {value!r}") from None


def _parse_json(body: bytes, request: Any) -> None:
    import json

    from google.protobuf import json_format

    try:
        data = json.loads(body)
    except ValueError as exc:
        raise OTLPDecodeError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OTLPDecodeError("an OTLP/JSON body is an object with 'resourceSpans'")
    for i, rs in enumerate(_list(data, "resourceSpans", "resource_spans")):
        for j, ss in enumerate(_list(rs, "scopeSpans", "scope_spans")):
            for k, span in enumerate(_list(ss, "spans")):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                _hex_ids_to_base64(span, where)
                for n, link in enumerate(_list(span, "links")):
                    _hex_ids_to_base64(link, f"{where}.links[{n}]")
    try:
        # Unknown fields are ignored, as the OTLP spec asks of receivers (newer senders may add fields).
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OTLPDecodeError(f"not an OTLP/JSON traces request: {exc}") from None


def _list(obj: Any, *keys: str) -> list:
    if not isinstance(obj, dict):
        return []
    for key in keys:
        value = obj.get(key)
        if isinstance(value, list):
            return [v for v in value if isinstance(v, dict)]
    return []


def decode_request(
    body: bytes, content_type: str | None, content_encoding: str | None = None, *, max_bytes: int | None = None
) -> tuple[Any, str]:
    """The ``ExportTraceServiceRequest`` in ``body`` and its media type (`PROTOBUF` or `JSON_MEDIA`).

    ``max_bytes`` bounds a compressed body's decompressed size. Raises `UnsupportedMediaError` (415) for another
    content type or encoding, `OTLPDecodeError` (400) for a body that does not decode.
    """
    media = media_type(content_type)
    raw = _decompress(body, content_encoding, max_bytes)
    request_type, _ = _messages()
    request = request_type()
    if media == PROTOBUF:
        from google.protobuf.message import DecodeError

        try:
            request.ParseFromString(raw)
        except DecodeError as exc:
            raise OTLPDecodeError(f"not an OTLP protobuf traces request: {exc}") from None
    else:
        _parse_json(raw, request)
    return request, media


def _value(v: Any) -> JSON:
    """An ``AnyValue`` as JSON (bytes as hex: span attributes are stored as JSON)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return None  # an empty AnyValue: OTLP's null


def _attributes(key_values: Any) -> dict[str, JSON]:
    out = {}
    for kv in key_values:
        value = kv.value
        # Most attributes are non-empty strings: read one directly (this loop is ingest's hot path); anything
        # else, including "", takes the general path.
        text = value.string_value
        out[kv.key] = text if text else _value(value)
    return out


def spans_from_request(request: Any, headers: Mapping[str, str] | None = None) -> list[Span]:
    """Every span of an ``ExportTraceServiceRequest`` as a lightrail `Span` (see the module docstring).

    ``headers`` are the HTTP request's (any mapping with lowercase keys, e.g. Starlette's ``Headers``); they
    attribute spans whose span and resource attributes do not. Raises `UnattributedSpansError` if any span stays
    unattributed, `OTLPDecodeError` for a span without ids.
    """
    found: list[tuple[int, Any, dict, str | None]] = []  # (start ns, span, resource attributes, scope name)
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = ss.scope.name or None
            found.extend((s.start_time_unix_nano, s, resource, scope) for s in ss.spans)
    found.sort(key=lambda item: item[0])  # stable: spans starting together keep the sender's order
    out: list[Span] = []
    unattributed: list[str] = []
    for start_ns, s, resource, scope in found:
        name = s.name
        attributes = _attributes(s.attributes)
        owner = attribution(attributes, resource, headers)
        if owner is None:
            unattributed.append(name)
            continue
        if not s.span_id or not s.trace_id:
            raise OTLPDecodeError(f"span {name!r} has no {'span_id' if not s.span_id else 'trace_id'}")
        if scope is not None:
            attributes.setdefault(_SCOPE_NAME, scope)
        normalize(name, attributes)
        parent = s.parent_span_id
        end_ns = s.end_time_unix_nano
        status = s.status
        out.append(
            Span(
                rollout_id=owner[0],
                attempt_id=owner[1],
                seq=next_seq(),
                name=name,
                span_id=s.span_id.hex(),
                trace_id=s.trace_id.hex(),
                parent_id=parent.hex() if parent else None,
                start_time=start_ns / _NS,
                end_time=end_ns / _NS if end_ns else None,
                attributes=attributes,
                events=[
                    SpanEvent(name=e.name, time=e.time_unix_nano / _NS, attributes=_attributes(e.attributes))
                    for e in s.events
                ],
                status=SpanStatus(code=status_code(status.code), message=status.message),
            )
        )
    if unattributed:
        raise UnattributedSpansError(unattributed, len(found))
    return out


def spans_from_body(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    max_bytes: int | None = None,
) -> tuple[list[Span], str]:
    """`decode_request` then `spans_from_request`: the spans of one OTLP/HTTP request body and its media type."""
    request, media = decode_request(body, content_type, content_encoding, max_bytes=max_bytes)
    return spans_from_request(request, headers), media


def response_body(media: str) -> bytes:
    """The success answer, an empty ``ExportTraceServiceResponse``, in the request's encoding (all spans were
    accepted, so there is no ``partial_success`` to report)."""
    if media == JSON_MEDIA:
        return b"{}"
    _, response_type = _messages()
    return response_type().SerializeToString()
