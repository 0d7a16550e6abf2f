"""The gateway fuzzed from its own OpenAPI document (``tests/_fuzz.py``): valid and schema-breaking requests to
every API it serves (chat completions, completions, Responses, Anthropic Messages; served and routed to an
attempt) over HTTP; no answer is a 5xx and every 4xx says why in the API's own error envelope. More cases:
``LIGHTRAIL_FUZZ_EXAMPLES=50``, or ``bench/fuzz.py``."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("schemathesis", reason="fuzzing needs schemathesis (the dev extra)")

from lightrail.gateway import ScriptedBackend  # noqa: E402
from lightrail.store import MemoryStore  # noqa: E402
from tests._fuzz import fuzz  # noqa: E402

EXAMPLES = int(os.environ.get("LIGHTRAIL_FUZZ_EXAMPLES", "8"))


def test_no_request_makes_the_gateway_fail(make_gateway):
    gateway = make_gateway(ScriptedBackend(), store=MemoryStore(), token="fuzz")
    root = gateway.url.removesuffix("/").removesuffix("/v1")
    result = fuzz(f"{root}/openapi.json", {"authorization": "Bearer fuzz"}, examples=EXAMPLES)
    assert result.failures == [], "\n".join(result.failures[:10])
    assert result.server_errors == 0 and result.cases >= 10 * EXAMPLES
    assert result.by_status.get(200, 0) > 0 and result.by_status.get(400, 0) > 0  # answered, and refused
    assert result.id_refusals > 0  # routed calls naming a blank rollout or attempt: a 4xx saying why, never a 503
