"""A serving gateway swaps promoted policies under concurrent load: no request fails, and every recorded call names
the version whose weights answered it.

Two sets of weights that answer differently: the "yes" model (greedy reply "yes") as v0 and v2, the random tiny
model (never "yes") as v1, so each reply shows which weights produced it, whatever the recorded version says.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from openai import AsyncOpenAI

from lightrail.engine.promotions import PolicyRegistry, PolicyWatcher
from lightrail.store import SQLiteStore
from lightrail.types import Attr

GREEDY = {"temperature": 0.0, "max_tokens": 4}

YES_WEIGHTS = {0, 2}


def test_promotions_swap_in_under_load_without_a_failed_or_misversioned_call(tmp_path, yes_model):
    from lightrail.engine import Engine
    from lightrail.engine.models import build_tiny_model
    from lightrail.gateway.recording import SessionRecorder
    from lightrail.gateway.server import GatewayServer

    other = build_tiny_model(tmp_path / "other", size="tiny", seed=1)
    registry = PolicyRegistry(tmp_path / "policies")
    registry.init(yes_model)

    async def main() -> tuple[list[tuple[float, float, str, str]], list, dict[int, tuple[float, float]]]:
        engine = Engine.from_pretrained(yes_model, policy_version=registry.current().version)
        store = SQLiteStore(tmp_path / "served.db")
        watcher = PolicyWatcher(registry, engine, poll_s=0.02)
        calls: list[tuple[float, float, str, str]] = []  # (sent, answered, response id, reply)
        swaps: dict[int, tuple[float, float]] = {}  # version -> (promoted, serving)
        stop = asyncio.Event()
        try:
            async with GatewayServer(engine, store, sessions=SessionRecorder(store)) as server:
                watcher.start()
                client = AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0)

                async def user(i: int) -> None:
                    while not stop.is_set():
                        sent = time.monotonic()
                        reply = await client.chat.completions.create(
                            model="policy", messages=[{"role": "user", "content": f"Is {i} small?"}], **GREEDY
                        )
                        calls.append((sent, time.monotonic(), reply.id, reply.choices[0].message.content or ""))

                users = [asyncio.create_task(user(i)) for i in range(6)]
                for version, path in ((1, other), (2, yes_model)):
                    await asyncio.sleep(0.6)
                    promoted = time.monotonic()
                    registry.promote(version, path, val_success=None)
                    while engine.policy_version < version:
                        await asyncio.sleep(0.005)
                    swaps[version] = (promoted, time.monotonic())
                await asyncio.sleep(0.6)
                stop.set()
                await asyncio.gather(*users)  # a failed request raises here
                await watcher.close()
                await asyncio.sleep(0.1)
            # the gateway's shutdown flushed every span to the store
            spans = [s for r in await store.query_rollouts() for s in await store.query_spans(r.rollout_id)]
        finally:
            await watcher.close()
            await engine.close()
            await store.close()
        return calls, spans, swaps

    calls, spans, swaps = asyncio.run(main())
    assert len(calls) >= 30 and watcher_swaps(spans) == {0, 1, 2}
    version_of = {
        s.attributes[Attr.RESPONSE_ID]: s.attributes[Attr.POLICY_VERSION] for s in spans if s.name == Attr.SPAN_LLM_CALL
    }
    assert len(version_of) == len(calls)  # every served call was recorded
    for sent, answered, response_id, reply in calls:
        version = version_of[response_id]
        assert (reply == "yes") == (version in YES_WEIGHTS), (version, reply)  # the named version answered
        for v, (promoted, serving) in swaps.items():
            if sent > serving:
                assert version >= v  # sent after the swap: the new policy
            if answered < promoted:
                assert version < v  # answered before the promotion: an older one


def watcher_swaps(spans: list) -> set[int]:
    return {s.attributes[Attr.POLICY_VERSION] for s in spans if s.name == Attr.SPAN_LLM_CALL}


def test_gateway_serve_policies_swaps_a_promotion_in(tmp_path, yes_model):
    """The command line users run: ``gateway serve --policies DIR --record`` serves the current policy, picks up a
    promotion, and records which version answered each call."""
    import subprocess
    import sys

    from openai import OpenAI

    from lightrail.engine.models import build_tiny_model
    from tests._served import free_port, served

    registry = PolicyRegistry(tmp_path / "policies")
    cmd = [sys.executable, "-m", "lightrail.cli", "gateway", "serve", "--store", str(tmp_path / "served.db")]
    refused = subprocess.run([*cmd, "--policies", str(registry.root)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give --model" in refused.stderr

    port = free_port()  # a new policies folder starts from --model as version 0
    cmd += ["--policies", str(registry.root), "--model", str(yes_model), "--record", "--poll-s", "0.1"]
    cmd += ["--port", str(port)]
    with served(cmd, port, tmp_path / "gateway.log", timeout_s=120) as server:
        client = OpenAI(base_url=server.url, api_key="none", max_retries=0)

        def ask() -> str:
            messages = [{"role": "user", "content": "Is 3 small?"}]
            reply = client.chat.completions.create(model="policy", messages=messages, **GREEDY)
            return reply.choices[0].message.content or ""

        assert ask() == "yes" and registry.current().version == 0
        registry.promote(1, build_tiny_model(tmp_path / "other", size="tiny", seed=1), val_success=None)
        deadline = time.monotonic() + 30
        while ask() == "yes":
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.1)

    async def versions() -> list[int]:
        store = SQLiteStore(tmp_path / "served.db")
        try:
            spans = [s for r in await store.query_rollouts() for s in await store.query_spans(r.rollout_id)]
        finally:
            await store.close()
        return sorted({s.attributes[Attr.POLICY_VERSION] for s in spans if s.name == Attr.SPAN_LLM_CALL})

    assert asyncio.run(versions()) == [0, 1]


def test_a_promotion_that_does_not_load_leaves_the_served_policy_alone(tmp_path, yes_model):
    from lightrail.engine import Engine

    registry = PolicyRegistry(tmp_path / "policies")
    registry.init(yes_model)
    (tmp_path / "broken").mkdir()
    registry.promote(1, tmp_path / "broken", val_success=None)

    async def main() -> tuple[int, bool]:
        engine = Engine.from_pretrained(yes_model)
        watcher = PolicyWatcher(registry, engine)
        try:
            with pytest.raises(ValueError, match="model_type"):  # what transformers says of an empty folder
                await watcher.check()
            return engine.policy_version, await watcher.check()  # not retried every poll
        finally:
            await engine.close()

    assert asyncio.run(main()) == (0, False)
