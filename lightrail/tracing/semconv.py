"""OpenTelemetry spans of agent frameworks → lightrail span attributes (pure: no OpenTelemetry import, no I/O).

Frameworks describe their work in one of two attribute conventions: OpenInference (``openinference.span.kind``,
``agent.name``, ``tool.name``, ``input.value``...) or the OpenTelemetry GenAI conventions
(``gen_ai.operation.name``, ``gen_ai.agent.name``, ``gen_ai.tool.call.id``...). Both the OTLP ingest on the store
server and the in-process span processor of `lightrail.tracing.otel` pass every span through `normalize`, which
keeps the original attributes and adds the few lightrail reads, in one spelling:

* ``lightrail.kind`` (`Attr.KIND`): ``llm``, ``tool``, ``agent``, ``chain``, ``retriever``, ``embedding`` or
  ``other`` — what the span did;
* ``gen_ai.agent.name``: the agent or graph node the span is (``agent.name``, ``graph.node.name``; an OpenInference
  ``AGENT`` span's ``graph.node.id``, else its span name: CrewAI, AutoGen and the OpenAI Agents SDK put the bare
  agent name in ``graph.node.id`` and name the span ``<agent>._execute_core`` / ``<agent>.on_messages_stream``; a
  GenAI ``invoke_agent`` / ``create_agent`` span's name without the operation, ``invoke_agent <agent>``), as
  `lightrail.types.normalize_agent_name` spells it (no surrounding whitespace: the name the runner's header
  stamps send), and ``langgraph.node`` from LangChain's ``metadata`` (the node a LangGraph span ran in);
* ``gen_ai.tool.name`` and ``gen_ai.tool.call.id`` on tool spans (tool outcomes become intermediate rewards,
  linked to the LLM call that asked for the tool through the call id);
* ``gen_ai.response.id`` on LLM spans when the framework recorded the response (so a framework's LLM span and the
  gateway's span of the same call can be matched by response id).

A span that carries both conventions is read once: its kind from OpenInference, the keys above set only where
absent. The GenAI conventions allow ``gen_ai.agent.name`` on spans of any operation, and instrumentations copy it
there (the OpenTelemetry OpenAI Agents instrumentation puts its configured default, ``OpenAI Agent``, on every chat,
tool and handoff span): only a span that *is* an agent (`names_its_agent`: not a GenAI span of another operation)
names the agent of the spans under it; another's name is used only when no span above names one.

Attribution — which rollout and attempt a span belongs to — comes from span attributes, then resource attributes,
then request headers (`attribution`).

Framework LLM spans never become lightrail LLM-call spans (their name is kept): the gateway's span of the same call
carries the engine's token ids and is the one training reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from lightrail.types import Attr, StatusCode, normalize_agent_name

__all__ = [
    "AGENT_OPERATIONS",
    "ATTEMPT_HEADER",
    "ROLLOUT_HEADER",
    "attribution",
    "kind_of",
    "names_its_agent",
    "normalize",
    "status_code",
]

ROLLOUT_HEADER = "x-lightrail-rollout-id"
"""HTTP header naming the rollout of every span in an OTLP request (when neither span nor resource says)."""
ATTEMPT_HEADER = "x-lightrail-attempt-id"

_OI_KIND = "openinference.span.kind"
_GENAI_OP = "gen_ai.operation.name"
_OI_KINDS = {
    "LLM": "llm",
    "TOOL": "tool",
    "AGENT": "agent",
    "CHAIN": "chain",
    "RETRIEVER": "retriever",
    "EMBEDDING": "embedding",
    "RERANKER": "retriever",
}
_GENAI_KINDS = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    "embeddings": "embedding",
}
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent"})
"""GenAI operations that are an agent: their ``gen_ai.agent.name`` names the agent they are."""
_decode = msgspec.json.decode
_OTEL_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}


def kind_of(attributes: Mapping[str, Any]) -> str:
    """What a framework span did, from either convention (``other`` when neither says)."""
    oi = attributes.get(_OI_KIND)
    if oi is not None:
        return _OI_KINDS.get(str(oi).upper(), "other")
    op = attributes.get(_GENAI_OP)
    if op is not None:
        return _GENAI_KINDS.get(str(op), "other")
    return "other"


def names_its_agent(attributes: Mapping[str, Any]) -> bool:
    """Whether a span's agent name attributes name the agent it is: False only for a GenAI span of an operation
    that is not an agent (``chat``, ``execute_tool``...) that is not also an OpenInference span, whose
    ``gen_ai.agent.name`` is context an instrumentation copied or defaulted."""
    op = attributes.get(_GENAI_OP)
    return op is None or op in AGENT_OPERATIONS or _OI_KIND in attributes


def _json_object(value: Any, key: str) -> dict | None:
    """``value`` as a dict when it is one or the JSON text of one that mentions ``key`` (frameworks store dicts as
    JSON strings; the substring test skips the parse for the many values that cannot hold ``key``)."""
    if isinstance(value, str):
        if not value.startswith("{") or f'"{key}"' not in value:
            return None
        try:
            value = _decode(value)
        except msgspec.DecodeError:
            return None
    return value if isinstance(value, dict) else None


def _json_field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a JSON object or its text."""
    obj = _json_object(value, key)
    return None if obj is None else obj.get(key)


def normalize(name: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """Add lightrail's spelling of kind, agent name, tool call and response id to ``attributes`` (in place; also
    returned). Attributes already present are never overwritten, so a span that says ``gen_ai.agent.name`` itself
    keeps it."""
    a = attributes
    kind = kind_of(a)
    a.setdefault(Attr.KIND, kind)
    if Attr.AGENT_NAME not in a:
        # each candidate as `normalize_agent_name` reads it: the name the header stamps send for the same span
        agent = normalize_agent_name(a.get("agent.name")) or normalize_agent_name(a.get("graph.node.name"))
        if agent is None and kind == "agent":
            agent = normalize_agent_name(a.get("graph.node.id"))
            if agent is None:
                op = a.get(_GENAI_OP)
                own = name.removeprefix(f"{op} ") if op in AGENT_OPERATIONS and _OI_KIND not in a else name
                agent = normalize_agent_name(own)
        if agent is not None:
            a[Attr.AGENT_NAME] = agent
    node = _json_field(a.get("metadata"), "langgraph_node")
    if node is not None:
        a.setdefault("langgraph.node", str(node))
    if kind == "tool":
        tool = a.get("tool.name")
        if tool is not None:
            a.setdefault(Attr.TOOL_NAME, str(tool))
        call_id = a.get("tool_call.id") or a.get("tool.id")
        if call_id is not None:
            a.setdefault(Attr.TOOL_CALL_ID, str(call_id))
    elif kind == "llm" and Attr.GENAI_RESPONSE_ID not in a:
        response_id = _response_id(a.get("output.value"))
        if isinstance(response_id, str):
            a[Attr.GENAI_RESPONSE_ID] = response_id
    return a


def _response_id(output: Any) -> Any:
    """The provider's response id in an LLM span's output (JSON parsed once): the OpenAI response's top-level
    ``id``, or ``llm_output.id`` of LangChain's ``LLMResult``. LangChain's spans are never the current OTel
    context during the HTTP call, so this id is the only link from the gateway's call span to the LangGraph node
    that made it."""
    output = _json_object(output, "id")
    if output is None:
        return None
    response_id = output.get("id")
    llm_output = output.get("llm_output")
    if response_id is None and isinstance(llm_output, dict):
        response_id = llm_output.get("id")
    return response_id


def attribution(
    span_attributes: Mapping[str, Any],
    resource_attributes: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, str] | None:
    """The ``(rollout_id, attempt_id)`` a span belongs to: from its own attributes, else its resource's, else the
    request's headers; None when no source names both (such a span cannot be stored)."""
    for source, rollout_key, attempt_key in (
        (span_attributes, Attr.ROLLOUT_ID, Attr.ATTEMPT_ID),
        (resource_attributes, Attr.ROLLOUT_ID, Attr.ATTEMPT_ID),
        (headers, ROLLOUT_HEADER, ATTEMPT_HEADER),
    ):
        if not source:
            continue
        rollout_id, attempt_id = source.get(rollout_key), source.get(attempt_key)
        if rollout_id and attempt_id:
            return str(rollout_id), str(attempt_id)
    return None


def status_code(otel_code: int) -> StatusCode:
    """OpenTelemetry's numeric status code (0 unset, 1 ok, 2 error) as a `StatusCode`."""
    return _OTEL_STATUS.get(otel_code, StatusCode.UNSET)
