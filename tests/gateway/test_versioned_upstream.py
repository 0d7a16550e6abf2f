"""`VersionedUpstream`: requests go to the current adapter, in-flight ones keep theirs, an old adapter drains before
it may be unloaded, a full-weight reload happens with nothing in flight, and every generation carries the version
that answered it.

The upstream is a real lightrail gateway on 127.0.0.1 serving `ScriptedBackend` (a named fake that echoes the
request's ``model`` as vLLM does, with a delay standing in for generation time): the default suite has no vLLM.
The same behaviour against real vLLM is in tests/model/test_vllm_rollouts.py (slow).
"""

from __future__ import annotations

import asyncio

import pytest

from lightrail.gateway import ScriptedBackend
from lightrail.gateway.backends import VersionedUpstream
from lightrail.types import BackendError, ChatRequest, SamplingParams

DELAY_S = 0.3


def _request(text: str = "hi") -> ChatRequest:
    return ChatRequest(model="policy", messages=[{"role": "user", "content": text}], sampling=SamplingParams())


@pytest.fixture
def upstream(make_gateway):
    """A slow scripted OpenAI server; returns (its backend, a factory of VersionedUpstreams in front of it)."""
    backend = ScriptedBackend(delay_s=DELAY_S)
    server = make_gateway(backend)
    return backend, lambda: VersionedUpstream(server.url, served_name="policy")


def test_new_requests_follow_the_route_while_in_flight_ones_finish_on_their_adapter(upstream):
    backend, make = upstream

    async def go():
        vu = make()
        events: list[str] = []

        async def call(tag: str):
            generation = await vu.chat(_request(tag))
            events.append(f"done {tag}")
            return generation

        old = [asyncio.create_task(call(f"old{i}")) for i in range(3)]
        await asyncio.sleep(DELAY_S / 3)  # all three sent with the base name
        assert vu.in_flight("policy") == 3
        previous = vu.route("policy-v1", 1)
        assert previous == "policy" and vu.current == "policy-v1" and vu.policy_version == 1
        new = [asyncio.create_task(call(f"new{i}")) for i in range(2)]
        await vu.drain("policy")
        events.append("drained")
        results = await asyncio.gather(*old, *new)
        await vu.aclose()
        return events, results

    events, results = asyncio.run(go())
    # the old name drained only after every request sent with it was answered
    assert events.index("drained") > max(events.index(f"done old{i}") for i in range(3))
    assert [(g.model, g.policy_version) for g in results] == [("policy", 0)] * 3 + [("policy-v1", 1)] * 2
    assert [r.model for r in backend.requests] == ["policy"] * 3 + ["policy-v1"] * 2


def test_drain_of_the_current_name_is_refused(upstream):
    _, make = upstream
    vu = make()
    with pytest.raises(ValueError, match="still receives new requests"):
        asyncio.run(vu.drain("policy"))
    with pytest.raises(ValueError, match="must not go back"):
        vu.route("policy-v1", 1) and vu.route("policy-v0", 0)


def test_paused_reloads_with_nothing_in_flight_and_held_requests_get_the_new_version(upstream):
    backend, make = upstream

    async def go():
        vu = make()
        before = [asyncio.create_task(vu.chat(_request(f"a{i}"))) for i in range(2)]
        await asyncio.sleep(DELAY_S / 3)
        held = None
        async with vu.paused():
            # in-flight requests finished before the pause was granted
            assert all(t.done() for t in before) and vu.in_flight() == 0
            held = asyncio.create_task(vu.chat(_request("held")))
            await asyncio.sleep(DELAY_S)
            assert not held.done() and len(backend.requests) == 2  # held at the door, not sent
            vu.set_version(1)  # "the reload finished"
        after = await held
        await vu.aclose()
        return [t.result() for t in before], after

    before, after = asyncio.run(go())
    assert [g.policy_version for g in before] == [0, 0]
    assert after.policy_version == 1 and after.model == "policy"


def test_a_request_whose_adapter_vanished_is_retried_on_the_current_one(make_gateway):
    def script(request):
        if request.model == "policy-v1":  # vLLM's answer for an unknown (unloaded) adapter
            return BackendError("The model `policy-v1` does not exist.", status=404)
        return "ok"

    backend = ScriptedBackend(script, delay_s=DELAY_S)
    server = make_gateway(backend)

    async def go():
        vu = VersionedUpstream(server.url, served_name="policy")
        vu.route("policy-v1", 1)
        task = asyncio.create_task(vu.chat(_request()))
        await asyncio.sleep(DELAY_S / 3)
        vu.route("policy-v2", 2)
        generation = await task
        await vu.aclose()
        return generation

    generation = asyncio.run(go())
    assert (generation.model, generation.policy_version) == ("policy-v2", 2)
    assert [r.model for r in backend.requests] == ["policy-v1", "policy-v2"]
