"""`PolicyRouter` behind a real gateway, called by the real openai client: the agent named in the request's
``x-lightrail-agent`` header picks its policy's engine, a model name picks that engine directly, anything else goes
to the start model; an oversized header is refused with a 400 that says why. (The three engines are scripted
backends that answer with their own name; the embedded engines are exercised end to end in
``tests/examples/test_sql_agent.py``.)"""

from __future__ import annotations

import re

import openai
import pytest

from lightrail.algorithms.policies import PolicyMap, PolicyRouter
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import MemoryStore
from lightrail.types import AGENT_HEADER


def _named(model: str) -> ScriptedBackend:
    return ScriptedBackend(lambda request: f"served by {model}", model=model)


async def test_each_call_goes_to_the_policy_of_the_agent_that_makes_it():
    policies = PolicyMap({"write": ["write_query"], "rewrite": ["rewrite_query"]})
    engines = {name: _named(f"policy-{name}") for name in policies.names}
    router = PolicyRouter(engines, policies.by_agent, _named("policy-base"))
    async with GatewayServer(router, MemoryStore(), token="t") as gateway:
        client = openai.AsyncOpenAI(base_url=gateway.url, api_key="t", max_retries=0)

        async def ask(agent: str | None = None, model: str = "policy") -> str:
            headers = {AGENT_HEADER: agent} if agent is not None else {}
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], extra_headers=headers
            )
            return (reply.choices[0].message.content or "").removeprefix("served by ")

        assert await ask("write_query") == "policy-write"
        assert await ask("rewrite_query") == "policy-rewrite"
        assert await ask("check_query") == "policy-base"  # an agent in no policy: the start model
        assert await ask() == "policy-base"  # nobody named
        assert await ask("write_query", model="policy-rewrite") == "policy-rewrite"  # a policy asked for by name
        with pytest.raises(openai.BadRequestError, match=AGENT_HEADER):
            await ask("x" * 201)
        models = {m.id async for m in client.models.list()}
        assert models == {"policy-base", "policy-write", "policy-rewrite"}
        await client.close()


def test_policy_map_names_every_agent_once():
    policies = PolicyMap({"write": ["write_query"], "rewrite": ["rewrite_query", "fix_query"]})
    assert policies.by_agent == {"write_query": "write", "rewrite_query": "rewrite", "fix_query": "rewrite"}
    assert policies.filter("rewrite")("fix_query") and not policies.filter("rewrite")("write_query")
    assert policies.filter()("write_query") and not policies.filter()("check_query")
    for bad, message in [
        ({}, "expected a mapping"),
        ({"w": "write_query"}, "non-empty list"),
        ({"w": ["a"], "r": ["a"]}, "in both 'w' and 'r'"),
        ({"w/x": ["a"]}, "not a policy name"),
        ({"w": [""]}, "w: '' cannot name an agent"),
        (
            {"w": ["Researcher\n"]},
            re.escape(repr("Researcher\n")) + " cannot name an agent: .*whitespace",
        ),  # no call carries it
        ({"w": [" a"]}, "' a' cannot name an agent"),
        ({"w": ["a\tb"]}, "control characters"),
        ({"w": ["x" * 201]}, "1 to 200 characters"),
        ({"w": [7]}, "7 cannot name an agent: .*a string"),
    ]:
        with pytest.raises(ValueError, match=message):
            PolicyMap(bad)
