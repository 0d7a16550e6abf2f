"""The gateway's OpenAPI document (``GET /openapi.json``): every route, unrouted (``/v1/...``, served) and routed to
an attempt (``/rollouts/{rollout_id}/attempts/{attempt_id}/v1/...``, recorded), each also made by a named agent
(``.../agents/{agent}/v1/...``), with the main fields of each API's
request body as agents send them. The request validators (`lightrail.gateway.openai_api` and the other dialects)
stay the authority: this document describes what they accept for clients, schema tools and fuzzers; it does not
replace them (OpenAI's and Anthropic's full schemas are far larger, and every field is checked there by name).
"""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_TEXT_OR_PARTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}, {"type": "null"}]}
_SAMPLING = {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "stream": {"type": "boolean"},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    "seed": {"type": "integer"},
}
_TOOLS = {"type": "array", "items": {"type": "object"}}

_BODIES: dict[str, dict[str, Any]] = {
    "/chat/completions": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "model": {"type": "string"},
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["role"],
                    "properties": {
                        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                        "content": _TEXT_OR_PARTS,
                        "tool_calls": {"type": "array", "items": {"type": "object"}},
                        "tool_call_id": {"type": "string"},
                    },
                },
            },
            "max_tokens": {"type": "integer", "minimum": 1},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "n": {"type": "integer", "minimum": 1},
            "tools": _TOOLS,
            "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
            "response_format": {"type": "object"},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
            "user": {"type": "string"},
            **_SAMPLING,
        },
    },
    "/completions": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "model": {"type": "string"},
            "prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "max_tokens": {"type": "integer", "minimum": 1},
            "n": {"type": "integer", "minimum": 1},
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
            **_SAMPLING,
        },
    },
    "/responses": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": {"type": "string"},
            "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
            "instructions": {"type": "string"},
            "max_output_tokens": {"type": "integer", "minimum": 1},
            "previous_response_id": {"type": "string"},
            "tools": _TOOLS,
            "text": {"type": "object"},
            **_SAMPLING,
        },
    },
    "/messages": {
        "type": "object",
        "required": ["model", "max_tokens", "messages"],
        "properties": {
            "model": {"type": "string"},
            "max_tokens": {"type": "integer", "minimum": 1},
            "system": _TEXT_OR_PARTS,
            "messages": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["role", "content"],
                    "properties": {"role": {"enum": ["user", "assistant"]}, "content": _TEXT_OR_PARTS},
                },
            },
            "stop_sequences": {"type": "array", "items": {"type": "string"}},
            "tools": _TOOLS,
            "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "stream": {"type": "boolean"},
        },
    },
    "/messages/count_tokens": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string"},
            "system": _TEXT_OR_PARTS,
            "messages": {"type": "array"},
            "tools": _TOOLS,
        },
    },  # fmt: skip
}

_ROUTED = "/rollouts/{rollout_id}/attempts/{attempt_id}"
_IDS = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in ("rollout_id", "attempt_id")]  # fmt: skip
_AGENT = {"name": "agent", "in": "path", "required": True, "description": "the agent that makes the call",
          "schema": {"type": "string", "minLength": 1, "maxLength": 200}}  # fmt: skip
_ERROR = {"description": "An error, in the API's own envelope (OpenAI's or Anthropic's) with a message"}


def openapi_document() -> dict[str, Any]:
    """The document, built once per app."""
    paths: dict[str, Any] = {
        "/health": {"get": {"operationId": "health", "security": [], "responses": {"200": {"description": "ok"}}}},
        "/v1/models": {"get": {"operationId": "models", "responses": {"200": {"description": "the served models"}}}},
        f"{_ROUTED}/v1/models": {
            "get": {"operationId": "routed_models", "parameters": _IDS, "responses": {"200": {"description": "ok"}}}
        },
    }
    for path, body in _BODIES.items():
        name = path.strip("/").replace("/", "_")
        for prefix, routed in (("", False), (_ROUTED, True)):
            for agent in ("", "/agents/{agent}"):
                counting = path.endswith("count_tokens")
                if agent and counting:
                    continue  # counting is not a call: no agent to name
                summary = f"{path} ({'recorded into the attempt' if routed else 'served'}"
                summary += f"{', made by the agent' if agent else ''})"
                if counting:
                    summary = (
                        'the input tokens of the prompt the model would see ({"input_tokens": N}); nothing recorded'
                    )
                op: dict[str, Any] = {
                    "operationId": f"{'routed_' if routed else ''}{name}{'_by_agent' if agent else ''}",
                    "summary": summary,
                    "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                    "responses": {"200": {"description": "the answer (JSON, or server-sent events with stream)"},
                                  "default": _ERROR},
                }  # fmt: skip
                parameters = (_IDS if routed else []) + ([_AGENT] if agent else [])
                if parameters:
                    op["parameters"] = parameters
                paths[f"{prefix}{agent}/v1{path}"] = {"post": op}
    return {
        "openapi": "3.1.0",
        "info": {"title": "lightrail gateway", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
    }
