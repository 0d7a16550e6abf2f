"""Writing agents: `rollout` injection by parameter name, `LitAgent`, import references, error classification."""

from __future__ import annotations

import asyncio
import pickle
import socket

import httpx
import pytest
import sample_agents

from lightrail.agent import LitAgent, agent_reference, is_infra_error, load_agent, rollout, route_resources
from lightrail.types import LLM, Attempt, AttemptStatus, PromptTemplate, RetryPolicy, Rollout, RolloutStatus, Task

ROLLOUT = Rollout(
    rollout_id="ro-1",
    task=Task(input={"q": 1}),
    mode="train",
    sample_index=0,
    resources_version=1,
    policy=RetryPolicy(),
    status=RolloutStatus.RUNNING,
    created_at=0.0,
)
ATTEMPT = Attempt(
    attempt_id="at-1",
    rollout_id="ro-1",
    index=1,
    worker_id="w",
    status=AttemptStatus.RUNNING,
    started_at=0.0,
    lease_expires_at=1.0,
)


def test_parameters_are_injected_by_name():
    resources = route_resources(
        {"llm": LLM(endpoint="http://gw:8000/v1", model="m"), "prompt": PromptTemplate(template="Q: {q}")},
        "ro-1",
        "at-1",
    )

    @rollout
    def agent(attempt, prompt_template, llm, task, rollout, resources):
        return attempt, prompt_template, llm, task, rollout, resources

    got = agent.invoke({"q": 1}, resources, ROLLOUT, ATTEMPT)
    assert got == (ATTEMPT, resources["prompt"], resources["llm"], {"q": 1}, ROLLOUT, resources)
    llm = got[2]
    assert llm.endpoint == "http://gw:8000/rollouts/ro-1/attempts/at-1/v1"  # ready for OpenAI(base_url=...)
    assert llm.base_url() == llm.endpoint
    assert agent.is_async is False
    assert agent("direct", 1, 2, 3, 4, 5) == ("direct", 1, 2, 3, 4, 5)  # still a plain function


def test_unknown_parameter_names_are_rejected_at_decoration():
    with pytest.raises(TypeError, match="unknown parameter 'question'"):

        @rollout
        def agent(task, question):
            pass

    with pytest.raises(TypeError, match=r"\*args"):

        @rollout
        def agent2(task, **extra):
            pass


def test_llm_injection_picks_the_named_or_only_llm():
    @rollout
    async def agent(llm):
        return llm.model

    assert agent.is_async
    only = {"policy": LLM(endpoint="http://a/v1", model="only")}
    assert asyncio.run(agent.invoke(None, only, ROLLOUT, ATTEMPT)) == "only"
    two = {"judge": LLM(endpoint="http://a/v1", model="judge"), "llm": LLM(endpoint="http://b/v1", model="main")}
    assert asyncio.run(agent.invoke(None, two, ROLLOUT, ATTEMPT)) == "main"
    ambiguous = {"a": LLM(endpoint="http://a/v1", model="a"), "b": LLM(endpoint="http://b/v1", model="b")}
    with pytest.raises(LookupError, match="2 of type LLM"):
        asyncio.run(agent.invoke(None, ambiguous, ROLLOUT, ATTEMPT))
    with pytest.raises(LookupError, match="no LLM"):
        asyncio.run(agent.invoke(None, {}, ROLLOUT, ATTEMPT))


def test_lit_agent_subclass():
    class Mine(LitAgent):
        async def rollout(self, task, resources, rollout):
            return task["x"]

    agent = Mine()
    assert agent.is_async
    assert asyncio.run(agent.invoke({"x": 3.0}, {}, ROLLOUT, ATTEMPT)) == 3.0
    with pytest.raises(NotImplementedError):
        LitAgent().invoke(None, {}, ROLLOUT, ATTEMPT)


def test_import_references_round_trip():
    assert agent_reference(sample_agents.tagged) == "sample_agents:tagged"
    assert load_agent("sample_agents:tagged") is sample_agents.tagged
    assert agent_reference(sample_agents.doubler) == "sample_agents:doubler"
    assert agent_reference(sample_agents.Doubler) == "sample_agents:Doubler"
    assert isinstance(load_agent("sample_agents:Doubler"), sample_agents.Doubler)  # classes are instantiated
    assert pickle.loads(pickle.dumps(sample_agents.tagged)) is sample_agents.tagged
    assert agent_reference("pkg.mod:obj") == "pkg.mod:obj"
    file_ref = f"{sample_agents.__file__}:sleeper"
    loaded = load_agent(file_ref)
    assert loaded.__qualname__ == "sleeper" and agent_reference(loaded) == file_ref


def test_unimportable_agents_get_a_clear_error():
    with pytest.raises(ValueError, match="lambda"):
        agent_reference(rollout(lambda task: 1.0))

    @rollout
    def local(task):
        return 1.0

    with pytest.raises(ValueError, match="inside a function"):
        agent_reference(local)
    with pytest.raises(ImportError, match="no attribute"):
        load_agent("sample_agents:nope")
    with pytest.raises(ValueError, match="module:object"):
        load_agent("sample_agents")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_errors_are_infrastructure_errors():
    with pytest.raises(httpx.TransportError) as caught:
        httpx.get(f"http://127.0.0.1:{closed_port()}/v1/models")
    assert is_infra_error(caught.value)
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{closed_port()}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as api_error:
        client.models.list()
    assert is_infra_error(api_error.value)
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as exc:
            raise RuntimeError("tool failed") from exc
    except RuntimeError as chained:
        assert is_infra_error(chained)  # raised *from* a connection error: still the infrastructure
    assert not is_infra_error(ValueError("wrong answer"))
    assert not is_infra_error(KeyError("x"))
