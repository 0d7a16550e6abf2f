"""Network faults between runners and the store, injected by a TCP proxy (``tests/_proxy.py``) in front of a real
store server: connections reset mid-request, every packet delayed, and half-open connections that never answer.
The runners ride it out on their retries and timeouts: every rollout succeeds once, with all its spans."""

from __future__ import annotations

import asyncio
import contextlib

from lightrail.agent import Runner
from lightrail.store import StoreClient, SyncStoreClient
from lightrail.store.server import serve_in_thread
from lightrail.types import Attr, RetryPolicy, RolloutSpec, Task
from tests._proxy import FaultyProxy

N = 40


async def test_runners_survive_resets_delays_and_half_open_connections(tmp_path):
    server = serve_in_thread(tmp_path / "store.db", token="t")
    proxy = await FaultyProxy(server.port).start()
    admin = SyncStoreClient(server.url, token="t")
    specs = [RolloutSpec(task=Task(input={"sleep": 0.3, "emit": 1.0, "return": 1.0}), policy=RetryPolicy(lease_s=5))
             for _ in range(N)]  # fmt: skip
    ids = [r.rollout_id for r in await asyncio.to_thread(admin.enqueue, specs)]
    # through the proxy: a short timeout so a half-open connection is given up and the request retried
    store = StoreClient(proxy.url, token="t", timeout=1.0, retries=30, max_backoff_s=0.2)
    runner = Runner(store, "sample_agents:behave", concurrency=4, handle_signals=False)
    run = asyncio.ensure_future(runner.run(max_rollouts=N))

    async def faults() -> None:
        while True:
            await asyncio.sleep(0.3)
            proxy.drop_all()  # resets mid-request
            proxy.delay_s = 0.05  # slow links
            await asyncio.sleep(0.3)
            proxy.delay_s, proxy.blackhole = 0.0, True  # half-open: requests go out, answers never come back
            await asyncio.sleep(1.5)
            proxy.blackhole = False
            proxy.drop_all()

    chaos = asyncio.ensure_future(faults())
    try:
        stats = await asyncio.wait_for(run, 240)
    finally:
        chaos.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await chaos
        await store.close()
        await proxy.close()
    try:
        # the faults happened (resets, answers held on half-open connections) and connections were made again
        assert proxy.dropped > 0 and proxy.held > 0 and proxy.connections > 4
        rollouts = await asyncio.to_thread(admin.query_rollouts, rollout_ids=ids)
        assert [r.status.value for r in rollouts] == ["succeeded"] * N, stats
        for rollout_id in ids:
            attempts = await asyncio.to_thread(admin.query_attempts, rollout_id)
            assert [a.status.value for a in attempts].count("succeeded") == 1
            spans = await asyncio.to_thread(admin.query_spans, rollout_id, attempts[-1].attempt_id)
            assert any(s.attributes.get(Attr.REWARD) == 1.0 for s in spans)  # the reward span made it through
    finally:
        admin.close()
        server.stop()
