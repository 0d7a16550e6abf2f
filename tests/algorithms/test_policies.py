"""`PolicyRouter` behind a real gateway, called by the real openai client: the agent named in the request's
``x-lightrail-agent`` header picks its policy's engine, a model name picks that engine directly, anything else goes
to the start model, with a warning at its first call per agent that says why no policy trains it; an oversized
header is refused with a 400 that says why. (The three engines are scripted backends that answer with their own name;
the embedded engines are exercised end to end in ``tests/examples/test_sql_agent.py`` and the other showcases' tests.)

Through `GRPO` on the tiny model, a run whose agent makes calls no policy can train surfaces each at its first
occurrence: a call of a policy's agent served by another engine is counted as misrouted, left out of that policy's
update, and warned about with its cause."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter

import openai
import pytest

from lightrail.algorithms.policies import PolicyMap, PolicyRouter
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import MemoryStore
from lightrail.types import AGENT_HEADER


def _named(model: str) -> ScriptedBackend:
    return ScriptedBackend(lambda request: f"served by {model}", model=model)


async def test_each_call_goes_to_the_policy_of_the_agent_that_makes_it(caplog):
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

        caplog.set_level(logging.WARNING, logger="lightrail.algorithms.policies")
        assert await ask("write_query") == "policy-write"
        assert await ask("rewrite_query") == "policy-rewrite"
        assert await ask("write_query", model="policy-rewrite") == "policy-rewrite"  # a policy asked for by name
        assert not caplog.records  # every call so far was routed as meant
        for _ in range(2):  # warned at the first call, not again
            assert await ask("check_query") == "policy-base"  # an agent in no policy: the start model
            assert await ask() == "policy-base"  # nobody named
        first, second = (r.getMessage() for r in caplog.records)
        assert "agent 'check_query' is in no policy" in first and "'write_query', 'rewrite_query'" in first
        assert "no policy trains them" in first and "'policy-base'" in first
        assert f"a call named no agent (no {AGENT_HEADER} header" in second and "no policy trains it" in second
        assert await ask("rewrite_querry") == "policy-base"  # each agent at its first call
        assert "agent 'rewrite_querry' is in no policy" in caplog.records[-1].getMessage()
        with pytest.raises(openai.BadRequestError, match=AGENT_HEADER):
            await ask("x" * 201)
        models = {m.id async for m in client.models.list()}
        assert models == {"policy-base", "policy-write", "policy-rewrite"}
        await client.close()


async def test_a_client_naming_many_unknown_agents_gets_a_bounded_number_of_warnings(caplog):
    """Agent names come from clients: each unknown one is warned about once, up to `MAX_WARNED_AGENTS`, then one
    warning says no more will be, and the router remembers no more names (its memory and the log stay bounded)."""
    from lightrail.algorithms.policies import MAX_WARNED_AGENTS

    router = PolicyRouter({"write": _named("policy-write")}, {"writer": "write"}, _named("policy-base"))
    async with (
        GatewayServer(router, MemoryStore(), token="t") as gateway,
        openai.AsyncOpenAI(base_url=gateway.url, api_key="t", max_retries=0) as client,
    ):
        caplog.set_level(logging.WARNING, logger="lightrail.algorithms.policies")
        for i in range(MAX_WARNED_AGENTS + 20):
            reply = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], extra_headers={AGENT_HEADER: f"a{i}"}
            )
            assert reply.choices[0].message.content == "served by policy-base"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == MAX_WARNED_AGENTS + 1 and len(router._warned) == MAX_WARNED_AGENTS + 1
    assert f"agent 'a{MAX_WARNED_AGENTS - 1}' is in no policy" in warnings[-2]
    assert "no more of them are warned about" in warnings[-1]


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


def test_a_call_no_policy_can_train_surfaces_at_its_first_occurrence_and_is_never_trained(tmp_path, caplog):
    """`GRPO` with ``policies={"write": ["writer"]}`` on the tiny model, through the real trainer, gateway and
    runners: the writer's own calls are served and trained by its policy; the writer's call that asks for the start
    model by name is misrouted (counted, not trained, warned about once with its cause); a call that names no agent
    and one of a misspelt agent are warned about by the gateway at their first call."""
    from grpo_helpers import tiny_grpo

    from examples.calculator.data import make_splits
    from lightrail import MemoryStore, Trainer
    from lightrail.adapters import build_episode
    from lightrail.engine.models import build_tiny_model
    from lightrail.types import Attr

    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, _ = make_splits(4, 0, seed=1)
    store = MemoryStore()
    grpo = tiny_grpo(model, tmp_path / "run", n_samples=2, policies={"write": ["writer"]})
    caplog.set_level(logging.WARNING)
    trainer = Trainer(n_runners=1, concurrency=4, store=store, algorithm=grpo)
    trainer.fit("loop_agents:unroutable_calls_agent", train, [])

    (step,) = [m for m in map(json.loads, (tmp_path / "run" / "metrics.jsonl").open()) if m["kind"] == "train"]
    assert (step["rollouts"], step["misrouted"]) == (4, 4)  # the writer's call to the start model, once a rollout
    assert step["write/transitions"] == step["transitions"] == 4  # the writer's own calls, nothing else
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    unnamed = [w for w in warnings if "a call named no agent" in w]
    misspelt = [w for w in warnings if "agent 'writre' is in no policy" in w]
    misrouted = [w for w in warnings if "misrouted" in w]
    assert (len(unnamed), len(misspelt), len(misrouted)) == (1, 1, 1), warnings
    cause = "a call of agent 'writer' (policy 'write', served as 'policy-write') was served by 'policy-base'"
    assert cause in misrouted[0] and "asked for model 'policy-base' by name" in misrouted[0]

    async def calls_and_training():
        served, trained = {}, []
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id)
            for call in build_episode(spans).calls:
                a = call.span.attributes
                served[call.response_id] = (a.get(Attr.CALLER_AGENT), a[Attr.RESPONSE_MODEL])
            trained += [c for s in spans if s.name == Attr.SPAN_TRAINING for c in s.attributes[Attr.TRAINING_CALLS]]
        return served, trained

    served, trained = asyncio.run(calls_and_training())
    assert len(served) == 4 * 4
    assert Counter(served.values()) == {
        ("writer", "policy-write"): 4, ("writer", "policy-base"): 4, (None, "policy-base"): 4,
        ("writre", "policy-base"): 4,
    }  # fmt: skip
    # each trained call is one the writer's policy served, and the training span names that policy (an update whose
    # groups all tie, the reward being a length's parity, is skipped and records no training span)
    assert len(trained) == (0 if step["write/skipped"] else 4), step
    assert all(c["policy"] == "write" and c["agent"] == "writer" for c in trained)
    assert all(served[c["response_id"]] == ("writer", "policy-write") for c in trained)
