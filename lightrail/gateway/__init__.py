"""The gateway: an OpenAI-compatible endpoint in front of a model backend that records every call an agent
makes as a span with the backend's token ids, logprobs and policy version.

Agents stay unmodified: they get a ``base_url`` of the form
``http://gateway/rollouts/{rollout_id}/attempts/{attempt_id}/v1`` (see `lightrail.types.LLM.base_url`), and the
path attributes each call to its attempt.

* `create_gateway_app` -- the ASGI app (Starlette), served by uvicorn (`lightrail gateway serve`, or
  `GatewayServer` inside a running event loop).
* `Backend` -- what the gateway forwards to; `OpenAIUpstream` (vLLM or any OpenAI-compatible server),
  `ScriptedBackend` (a fake for tests and benchmarks), or the embedded engine (`lightrail.engine.Engine`).
* Spans go through a `lightrail.tracing.SpanBatcher` (batched, retried, never dropped); a routed call is answered
  once its span is stored.
"""

from __future__ import annotations

from lightrail.gateway.app import create_gateway_app
from lightrail.gateway.backends import Backend, OpenAIUpstream, UpstreamError, VersionedUpstream
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply
from lightrail.gateway.server import GatewayServer, GatewaySettings

__all__ = [
    "Backend",
    "GatewayServer",
    "GatewaySettings",
    "OpenAIUpstream",
    "ScriptedBackend",
    "ScriptedReply",
    "UpstreamError",
    "VersionedUpstream",
    "create_gateway_app",
]
