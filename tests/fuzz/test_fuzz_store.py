"""The store server fuzzed from its own OpenAPI document (``tests/_fuzz.py``): valid and schema-breaking requests
to every route of a real server on SQLite; no answer is a 5xx and every 4xx names its reason. More cases:
``LIGHTRAIL_FUZZ_EXAMPLES=50`` (per operation and mode), or ``bench/fuzz.py``."""

from __future__ import annotations

import os

import httpx
import pytest

pytest.importorskip("schemathesis", reason="fuzzing needs schemathesis (the dev extra)")

from lightrail.store.server import serve_in_thread  # noqa: E402
from tests._fuzz import fuzz  # noqa: E402

EXAMPLES = int(os.environ.get("LIGHTRAIL_FUZZ_EXAMPLES", "8"))


def test_no_request_makes_the_store_server_fail(tmp_path):
    server = serve_in_thread(tmp_path / "store.db", token="fuzz")
    try:
        result = fuzz(f"{server.url}/openapi.json", {"authorization": "Bearer fuzz"}, examples=EXAMPLES)
    finally:
        server.stop()
    assert result.failures == [], "\n".join(result.failures[:10])
    assert result.server_errors == 0
    assert result.cases >= 20 * EXAMPLES  # every operation was reached, with and without valid input
    assert result.by_status.get(200, 0) > 0 and result.by_status.get(400, 0) > 0
    assert result.id_refusals >= 10  # valid requests with their ids blanked, each refused with a reason


def test_the_fuzzer_reads_past_every_long_poll_cap_and_asks_for_no_wait():
    """The soak bench failed when a fuzz case waited (``POST /v1/rollouts/wait`` without ``timeout_s``: the 60 s
    cap) longer than the fuzzer's 30 s read timeout. Its reads now outlast the cap, and its cases ask for no wait."""
    from lightrail.store._wire import MAX_WAIT_S, ROUTES
    from tests._fuzz import _LONG_POLLS, READ_TIMEOUT_S, _no_long_poll

    assert READ_TIMEOUT_S > MAX_WAIT_S
    waits = {r.path: key for r in ROUTES for key in ("timeout_s", "wait_s")
             if key in getattr(r.request, "__struct_fields__", ())}  # fmt: skip
    assert waits == _LONG_POLLS  # every long poll of the route table, so none is fuzzed at its cap

    class Case:  # the two attributes `_no_long_poll` reads of a schemathesis case
        path, body = "/v1/rollouts/wait", {"rollout_ids": ["ro-1"]}

    assert _no_long_poll(Case()).body == {"rollout_ids": ["ro-1"], "timeout_s": 0}


def test_numbers_beyond_64_bits_are_refused_with_the_field(tmp_path):
    """Found by the fuzzer: a resources version or a sample index too large for a database column was a 500."""
    server = serve_in_thread(tmp_path / "store.db", token="fuzz")
    try:
        with httpx.Client(base_url=server.url, headers={"authorization": "Bearer fuzz"}) as http:
            assert http.get(f"/v1/resources/{2**70}").status_code == 404
            reply = http.post("/v1/rollouts", json={"specs": [{"task": {"input": 1}, "sample_index": 2**70}]})
            assert reply.status_code == 400 and "sample_index" in reply.json()["error"]["message"]
    finally:
        server.stop()
