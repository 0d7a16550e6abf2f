"""The gateway's per-attempt routes with scoped store tokens: a runner holding only a runner token trains through
the gateway (it calls the model with its own token, never seeing the gateway's), and its token opens no other
attempt's route and no unrouted one. Real store server, real gateway, real runner and ``openai`` client."""

from __future__ import annotations

import httpx
from openai import AsyncOpenAI

from lightrail.agent import Runner
from lightrail.gateway.fake import ScriptedBackend
from lightrail.store import StoreClient, SyncStoreClient
from lightrail.store.server import serve_in_thread
from lightrail.store.tokens import mint
from lightrail.types import LLM, Attr, Resources, RolloutSpec, Task

ADMIN, GATEWAY = "store-admin", "gateway-token"


async def ask(task, llm):
    """An agent that calls its model with the key it was handed (the runner's token, for a scoped runner)."""
    client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0)
    reply = await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    await client.close()
    return 1.0 if reply.choices[0].message.content == task["q"] else 0.0  # the fake backend echoes


def test_a_runner_token_trains_through_the_gateway_on_its_own_attempts_only(make_gateway, tmp_path):
    store_server = serve_in_thread(tmp_path / "store.db", token=ADMIN)
    try:
        gateway = make_gateway(ScriptedBackend(), store=StoreClient(store_server.url, token=ADMIN), token=GATEWAY)
        with SyncStoreClient(store_server.url, token=ADMIN) as admin:
            tokens = {}
            for name in ("runner", "other"):
                tokens[name], record = mint("runner")
                admin.put_token(record)
            admin.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key=GATEWAY)}))
            admin.enqueue([RolloutSpec(rollout_id=f"r{i}", task=Task(input={"q": f"question {i}"})) for i in range(3)])

            runner_store = StoreClient(store_server.url, token=tokens["runner"])
            stats = Runner(runner_store, ask, concurrency=3, handle_signals=False).run_sync(max_rollouts=3)
            assert stats.leased == 3
            rollouts = admin.query_rollouts()
            assert [r.reward for r in rollouts] == [1.0, 1.0, 1.0], rollouts
            token_id = tokens["runner"].split("_")[1]
            for r in rollouts:
                (attempt,) = admin.query_attempts(r.rollout_id)
                assert attempt.attempt_id.startswith(token_id + ".")
                calls = [s for s in admin.query_spans(r.rollout_id) if Attr.PROMPT_IDS in s.attributes]
                assert len(calls) == 1 and calls[0].attempt_id == attempt.attempt_id  # recorded by the gateway

        root = gateway.url.removesuffix("/").removesuffix("/v1")
        route, unrouted = (
            f"{root}/rollouts/{r.rollout_id}/attempts/{attempt.attempt_id}/v1/chat/completions",
            f"{root}/v1/chat/completions",
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        def post(url: str, key: str) -> httpx.Response:
            return httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=30)

        refused = post(route, tokens["other"])
        assert (
            refused.status_code == 403 and "runner token that leased the attempt" in refused.json()["error"]["message"]
        )
        assert post(route, tokens["runner"]).status_code == 200
        assert post(unrouted, tokens["runner"]).status_code == 403  # unrouted calls: the gateway's or an admin token
        assert post(route, "lrt_0123456789ab_" + "x" * 32).status_code == 401
        assert post(unrouted, GATEWAY).status_code == 200
        named_route = route.replace("/v1/", "/agents/writer/v1/")  # an agent's route is its attempt's route
        assert post(named_route, tokens["runner"]).status_code == 200
        assert post(named_route, tokens["other"]).status_code == 403
        assert post(f"{root}/agents/writer/v1/chat/completions", tokens["runner"]).status_code == 403
    finally:
        store_server.stop()
