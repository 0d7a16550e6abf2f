"""OTLP/HTTP trace ingest (``POST /v1/traces``, lightrail/tracing/otlp.py) against a real store server.

Every test runs a store server on 127.0.0.1 (its own thread and loop, SQLite in tmp_path, a bearer token) and
sends it what real senders send: the OpenTelemetry SDK's ``OTLPSpanExporter`` (protobuf, plain, gzip or deflate), or
OTLP/JSON and protobuf bodies posted with httpx. Spans are read back through the store's own client.
"""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys

import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from lightrail.store import StoreClient
from lightrail.store.server import serve_in_thread
from lightrail.tracing.otlp import spans_from_body
from lightrail.types import Attr, RolloutSpec, Task
from lightrail.types import StatusCode as LightrailStatus

TOKEN = "test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PROTOBUF = {"content-type": "application/x-protobuf"}
NS = 1_000_000_000


@pytest.fixture
def server(tmp_path):
    handle = serve_in_thread(tmp_path / "store.db", token=TOKEN)
    yield handle
    handle.stop()


@pytest.fixture
async def store(server):
    client = StoreClient(server.url, token=TOKEN)
    yield client
    await client.close()


@pytest.fixture
async def attempts(store):
    """Two leased attempts (rollout_id, attempt_id): spans can only be stored for attempts the store knows."""
    await store.enqueue([RolloutSpec(task=Task(input={"q": i})) for i in range(2)])
    out = []
    for _ in range(2):
        lease = await store.lease("runner")
        out.append((lease.rollout.rollout_id, lease.attempt.attempt_id))
    return out


def exporter(server, *, token: str = TOKEN, **kwargs) -> OTLPSpanExporter:
    return OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", headers={"authorization": f"Bearer {token}"}, timeout=10, **kwargs
    )


def owner_attributes(rollout_id: str, attempt_id: str) -> dict[str, str]:
    return {Attr.ROLLOUT_ID: rollout_id, Attr.ATTEMPT_ID: attempt_id}


def agent_trace(provider: TracerProvider) -> None:
    """What a LangGraph agent instrumented with OpenInference records: agent → graph node → LLM call, tool call."""
    tracer = provider.get_tracer("openinference.instrumentation.langchain")
    with tracer.start_as_current_span("sql_agent", attributes={"openinference.span.kind": "AGENT"}):
        node_meta = json.dumps({"langgraph_node": "write_query", "langgraph_step": 1})
        with tracer.start_as_current_span(
            "write_query", attributes={"openinference.span.kind": "CHAIN", "metadata": node_meta}
        ):
            llm_output = json.dumps({"id": "chatcmpl-abc123", "choices": [{"message": {"content": "SELECT 1"}}]})
            with tracer.start_as_current_span(
                "ChatOpenAI",
                attributes={
                    "openinference.span.kind": "LLM",
                    "output.value": llm_output,
                    "llm.token_count.prompt": 61,
                    "llm.invocation_parameters.temperature": 0.7,
                    "llm.streaming": False,
                    "tags": ["graph:step:1", "seq:1"],
                },
            ):
                pass
            with tracer.start_as_current_span(
                "run_sql",
                attributes={"openinference.span.kind": "TOOL", "tool.name": "run_sql", "tool_call.id": "call_7"},
            ) as tool:
                tool.add_event("retry", {"attempt": 2, "reason": "locked"})
                tool.set_status(Status(StatusCode.ERROR, "database is locked"))


def hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


async def test_exporter_with_resource_attribution_stores_nested_openinference_spans(server, store, attempts):
    rollout_id, attempt_id = attempts[0]
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(owner_attributes(rollout_id, attempt_id)))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent_trace(provider)
    finished = memory.get_finished_spans()
    assert exporter(server).export(finished) is SpanExportResult.SUCCESS

    stored = await store.query_spans(rollout_id, attempt_id)
    by_name = {s.name: s for s in stored}
    assert set(by_name) == {"sql_agent", "write_query", "ChatOpenAI", "run_sql"}
    assert await store.query_spans(attempts[1][0]) == []
    for sdk_span in finished:
        got = by_name[sdk_span.name]
        assert (got.rollout_id, got.attempt_id) == (rollout_id, attempt_id)
        assert got.span_id == hex_id(sdk_span.context.span_id, 16)
        assert got.trace_id == hex_id(sdk_span.context.trace_id, 32)
        expected_parent = hex_id(sdk_span.parent.span_id, 16) if sdk_span.parent else None
        assert got.parent_id == expected_parent
        assert got.start_time == sdk_span.start_time / NS
        assert got.end_time == sdk_span.end_time / NS
        assert got.attributes["otel.scope.name"] == "openinference.instrumentation.langchain"
    # seq follows start time: the store orders an attempt's spans by seq.
    assert [s.name for s in stored] == ["sql_agent", "write_query", "ChatOpenAI", "run_sql"]

    agent, node, llm, tool = (by_name[n] for n in ("sql_agent", "write_query", "ChatOpenAI", "run_sql"))
    assert agent.parent_id is None
    assert agent.attributes[Attr.KIND] == "agent" and agent.attributes[Attr.AGENT_NAME] == "sql_agent"
    assert node.parent_id == agent.span_id and llm.parent_id == node.span_id and tool.parent_id == node.span_id
    assert node.attributes[Attr.KIND] == "chain" and node.attributes["langgraph.node"] == "write_query"
    assert llm.attributes[Attr.KIND] == "llm"
    assert llm.attributes[Attr.GENAI_RESPONSE_ID] == "chatcmpl-abc123"
    assert llm.attributes["llm.token_count.prompt"] == 61
    assert llm.attributes["llm.invocation_parameters.temperature"] == 0.7
    assert llm.attributes["llm.streaming"] is False
    assert llm.attributes["tags"] == ["graph:step:1", "seq:1"]
    assert llm.status.code is LightrailStatus.UNSET
    assert tool.attributes[Attr.TOOL_NAME] == "run_sql" and tool.attributes[Attr.TOOL_CALL_ID] == "call_7"
    assert (tool.status.code, tool.status.message) == (LightrailStatus.ERROR, "database is locked")
    [event] = tool.events
    sdk_event = next(s for s in finished if s.name == "run_sql").events[0]
    assert (event.name, event.time, event.attributes) == ("retry", sdk_event.timestamp / NS, sdk_event.attributes)


@pytest.mark.parametrize("compression", [Compression.Gzip, Compression.Deflate], ids=["gzip", "deflate"])
async def test_batch_processor_with_span_attribution_splits_one_request_over_attempts(
    server, store, attempts, compression
):
    """Spans of two attempts (one process running two rollouts) arrive in one compressed request, each stored
    under its own attempt."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter(server, compression=compression)))
    tracer = provider.get_tracer("agent")
    for rollout_id, attempt_id in attempts:
        with tracer.start_as_current_span("turn", attributes=owner_attributes(rollout_id, attempt_id)):
            for i in range(3):
                with tracer.start_as_current_span(f"step{i}", attributes=owner_attributes(rollout_id, attempt_id)):
                    pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    for rollout_id, attempt_id in attempts:
        stored = await store.query_spans(rollout_id, attempt_id)
        assert [s.name for s in stored] == ["turn", "step0", "step1", "step2"]
        assert all(s.parent_id == stored[0].span_id for s in stored[1:])
        assert stored[0].attributes[Attr.KIND] == "other"


def otlp_json(trace_hex: str, spans: list[dict], resource: list[dict] | None = None) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": resource or []},
                "scopeSpans": [{"scope": {"name": "custom"}, "spans": spans}],
                "schemaUrl": "https://opentelemetry.io/schemas/1.26.0",  # fields the receiver does not use
            }
        ]
    }


async def test_otlp_json_with_hex_ids_and_header_attribution(server, store, attempts):
    rollout_id, attempt_id = attempts[0]
    trace_hex = "5b8efff798038103d269b633813fc60c"
    root, child = "eee19b7ec3c1b174", "eee19b7ec3c1b173"
    body = otlp_json(
        trace_hex,
        [
            {
                "traceId": trace_hex,
                "spanId": child,
                "parentSpanId": root,
                "name": "lookup",
                "kind": 3,  # enums may be numbers in OTLP/JSON
                "startTimeUnixNano": "1700000000250000000",
                "endTimeUnixNano": 1700000000500000000,
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
                    {"key": "rows", "value": {"intValue": "42"}},
                    {"key": "payload", "value": {"bytesValue": base64.b64encode(b"\x01\xff").decode()}},
                    {
                        "key": "filter",
                        "value": {
                            "kvlistValue": {
                                "values": [
                                    {"key": "year", "value": {"intValue": 2013}},
                                    {"key": "carriers", "value": {"arrayValue": {"values": [{"stringValue": "UA"}]}}},
                                ]
                            }
                        },
                    },
                ],
                "events": [{"timeUnixNano": "1700000000300000000", "name": "cache_miss"}],
                "status": {"code": "STATUS_CODE_OK"},
            },
            {
                "traceId": trace_hex,
                "spanId": root,
                "parentSpanId": "",
                "name": "agent",
                "kind": "SPAN_KIND_INTERNAL",
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000",
                "attributes": [{"key": "agent.name", "value": {"stringValue": "researcher"}}],
                "status": {},
                "futureField": {"ignored": True},
            },
        ],
    )
    headers = {**AUTH, "x-lightrail-rollout-id": rollout_id, "x-lightrail-attempt-id": attempt_id}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as http:
        r = await http.post("/v1/traces", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("application/json") and r.json() == {}
        again = await http.post("/v1/traces", json=body)  # an exporter's retry of the same request
        assert again.status_code == 200

    stored = await store.query_spans(rollout_id, attempt_id)
    assert [s.name for s in stored] == ["agent", "lookup"]  # start-time order, not the body's
    agent, lookup = stored
    assert (agent.span_id, agent.trace_id, agent.parent_id) == (root, trace_hex, None)
    assert lookup.parent_id == root
    assert (lookup.start_time, lookup.end_time) == (1700000000.25, 1700000000.5)
    assert lookup.attributes["rows"] == 42
    assert lookup.attributes["payload"] == "01ff"
    assert lookup.attributes["filter"] == {"year": 2013, "carriers": ["UA"]}
    assert lookup.attributes[Attr.KIND] == "tool"
    assert [(e.name, e.time) for e in lookup.events] == [("cache_miss", 1700000000.3)]
    assert lookup.status.code is LightrailStatus.OK
    assert agent.attributes[Attr.AGENT_NAME] == "researcher"


def sdk_spans(n: int, attributes: dict | None = None, resource: dict | None = None):
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource or {}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agent")
    for i in range(n):
        with tracer.start_as_current_span(f"span{i}", attributes=attributes):
            pass
    return memory.get_finished_spans()


async def test_gzip_protobuf_answers_an_export_response_in_protobuf(server, store, attempts):
    rollout_id, attempt_id = attempts[1]
    body = encode_spans(sdk_spans(3)).SerializeToString()
    headers = {
        **AUTH,
        **PROTOBUF,
        "content-encoding": "gzip",
        "x-lightrail-rollout-id": rollout_id,
        "x-lightrail-attempt-id": attempt_id,
    }
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/traces", content=gzip.compress(body), headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-protobuf"
    response = ExportTraceServiceResponse()
    response.ParseFromString(r.content)
    assert not response.HasField("partial_success")
    assert [s.name for s in await store.query_spans(rollout_id, attempt_id)] == ["span0", "span1", "span2"]


async def test_unattributed_spans_reject_the_whole_request(server, store, attempts):
    rollout_id, attempt_id = attempts[0]
    owned = sdk_spans(2, attributes=owner_attributes(rollout_id, attempt_id))
    stray = sdk_spans(7)
    body = encode_spans([*owned, *stray]).SerializeToString()
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/traces", content=body, headers={**AUTH, **PROTOBUF})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "UnattributedSpansError"
    message = error["message"]
    assert message.startswith("7 of 9 spans name no rollout and attempt ('span0', 'span1', 'span2', 'span3'")
    assert "and 2 more" in message
    assert "lightrail.rollout_id" in message and "x-lightrail-attempt-id" in message
    assert await store.query_spans(rollout_id) == []  # the attributed two were not stored either
    assert exporter(server).export(stray) is SpanExportResult.FAILURE


async def test_spans_of_an_unknown_attempt_are_refused_like_the_spans_route(server, store, attempts):
    rollout_id, _ = attempts[0]
    spans = sdk_spans(2, resource=owner_attributes(rollout_id, "at-nope"))
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/traces", content=encode_spans(spans).SerializeToString(), headers={**AUTH, **PROTOBUF})
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "NotFoundError" and "at-nope" in r.json()["error"]["message"]
        wrong_rollout = sdk_spans(1, resource=owner_attributes(attempts[1][0], attempts[0][1]))
        body = encode_spans(wrong_rollout).SerializeToString()
        r = await http.post("/v1/traces", content=body, headers={**AUTH, **PROTOBUF})
        assert r.status_code == 409 and r.json()["error"]["type"] == "ConflictError"
    assert await store.query_spans(rollout_id) == []


async def test_wrong_token_is_refused(server, store, attempts):
    spans = sdk_spans(1, resource=owner_attributes(*attempts[0]))
    async with httpx.AsyncClient(base_url=server.url) as http:
        body = encode_spans(spans).SerializeToString()
        r = await http.post("/v1/traces", content=body, headers=PROTOBUF)
        assert r.status_code == 401 and r.json()["error"]["message"] == "missing bearer token"
        r = await http.post("/v1/traces", content=body, headers={**PROTOBUF, "authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid, expired or revoked bearer token"
    assert exporter(server, token="wrong").export(spans) is SpanExportResult.FAILURE
    assert await store.query_spans(attempts[0][0]) == []


async def test_unsupported_content_type_or_encoding_is_415(server):
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
        r = await http.post("/v1/traces", content=b"x", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        message = r.json()["error"]["message"]
        assert "'text/plain'" in message and "'application/x-protobuf'" in message and "'application/json'" in message
        r = await http.post("/v1/traces", content=b"x", headers={**PROTOBUF, "content-encoding": "br"})
        assert r.status_code == 415 and "'br'" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("content_type", "encoding", "body", "says"),
    [
        ("application/x-protobuf", None, b"not a protobuf", "not an OTLP protobuf traces request"),
        ("application/json", None, b"{not json", "not JSON"),
        ("application/json", None, b'{"resourceSpans": 3}', "not an OTLP/JSON traces request"),
        ("application/json", None, b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "zz"}]}]}]}', "hex"),
        ("application/x-protobuf", "gzip", b"\x1f\x8b not really gzip", "not valid gzip"),
        ("application/x-protobuf", "gzip", gzip.compress(b"\x0a\x00")[:-6], "truncated"),
    ],
    ids=["protobuf", "json", "json-shape", "json-id", "gzip", "gzip-truncated"],
)
async def test_undecodable_bodies_are_400(server, content_type, encoding, body, says):
    headers = {**AUTH, "content-type": content_type}
    if encoding:
        headers["content-encoding"] = encoding
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.post("/v1/traces", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "OTLPDecodeError" and says in r.json()["error"]["message"]


async def test_body_limit_holds_for_plain_and_compressed_bodies(tmp_path):
    handle = serve_in_thread(tmp_path / "store.db", token=TOKEN, max_body_bytes=1 << 16)
    try:
        bomb = gzip.compress(b"\0" * (1 << 20))  # 1 KB on the wire, 1 MB inflated
        async with httpx.AsyncClient(base_url=handle.url) as http:
            r = await http.post("/v1/traces", content=bomb, headers={**AUTH, **PROTOBUF, "content-encoding": "gzip"})
            assert r.status_code == 413 and "decompressed" in r.json()["error"]["message"]
            r = await http.post("/v1/traces", content=b"\0" * (1 << 17), headers={**AUTH, **PROTOBUF})
            assert r.status_code == 413 and r.json()["error"]["type"] == "PayloadTooLarge"
    finally:
        handle.stop()


def test_store_server_does_not_load_opentelemetry_until_the_first_otlp_request(tmp_path):
    script = f"""
import sys, httpx
from lightrail.store.server import serve_in_thread
from lightrail.tracing.otlp import spans_from_body
handle = serve_in_thread({str(tmp_path / "store.db")!r})
loaded = lambda: sorted(m for m in sys.modules if m.startswith(("opentelemetry", "google.protobuf")))
assert httpx.get(handle.url + "/v1/counts").status_code == 200
assert loaded() == [], loaded()
r = httpx.post(handle.url + "/v1/traces", content=b"", headers={{"content-type": "application/x-protobuf"}})
assert r.status_code == 200, r.text
assert "opentelemetry.proto.collector.trace.v1.trace_service_pb2" in loaded()
handle.stop()
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_protobuf_and_otlp_json_encodings_give_the_same_spans():
    """The two encodings of one request (OTLP/JSON made from the protobuf as the spec says: hex ids, base64
    bytes) convert to identical spans, so the JSON path covers every value type the protobuf path does."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(owner_attributes("ro-1", "at-1")))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    agent_trace(provider)
    with provider.get_tracer("other").start_as_current_span("typed", attributes={"flags": [True, False]}) as span:
        span.set_attribute("ratios", [0.5, 1.5])
        span.add_event("done", {"count": 3, "ids": ["a", "b"]})
    request = encode_spans(memory.get_finished_spans())
    as_dict = json_format.MessageToDict(request)
    for resource_spans in as_dict["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for s in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64decode(s[key]).hex()

    from_protobuf, _ = spans_from_body(request.SerializeToString(), "application/x-protobuf")
    from_json, _ = spans_from_body(json.dumps(as_dict).encode(), "application/json; charset=utf-8")

    def comparable(spans):
        return [
            (
                s.rollout_id,
                s.attempt_id,
                s.span_id,
                s.parent_id,
                s.trace_id,
                s.name,
                s.start_time,
                s.end_time,
                s.attributes,
                s.events,
                s.status,
            )
            for s in spans
        ]

    assert len(from_protobuf) == 5
    assert comparable(from_json) == comparable(from_protobuf)
    typed = next(s for s in from_json if s.name == "typed")
    assert typed.attributes["flags"] == [True, False] and typed.attributes["ratios"] == [0.5, 1.5]
    assert typed.events[0].attributes == {"count": 3, "ids": ["a", "b"]}
