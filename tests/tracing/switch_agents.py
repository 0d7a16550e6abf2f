"""Agents for `test_tracing_switches`: framework agents whose own tracing switches are turned off, as users
following each framework's advice for non-OpenAI backends do (importable by reference)."""

from __future__ import annotations

from openai import AsyncOpenAI

from lightrail import rollout
from lightrail.gateway import ScriptedReply


def scripted(request) -> ScriptedReply | str:
    """The model of these tests: hands off to the specialist when it can, looks the topic up once, then answers
    ``done``; without tools it says ``fine``."""
    tools = {t["function"]["name"] for t in request.tools or ()}
    looked_up = any(m.get("role") == "tool" and m.get("content") == "facts about tides" for m in request.messages)
    if "transfer_to_specialist" in tools:
        return ScriptedReply(tool_calls=[("transfer_to_specialist", {})])
    if "lookup" in tools and not looked_up:
        return ScriptedReply(tool_calls=[("lookup", {"topic": "tides"})])
    return "done" if looked_up else "fine"


@rollout
async def triage_and_specialist(task, llm) -> float:
    """The OpenAI Agents SDK: a triage agent hands off to a specialist, who uses a tool, then answers. ``task["switch"]``
    says how tracing is turned off: ``"global"`` (``set_tracing_disabled(True)``), ``"run"``
    (``RunConfig(tracing_disabled=True)``) or ``"on"`` (left on)."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool, set_tracing_disabled

    if task["switch"] == "global":
        set_tracing_disabled(True)

    @function_tool
    def lookup(topic: str) -> str:
        """Look a topic up."""
        return f"facts about {topic}"

    client = AsyncOpenAI(base_url=llm.endpoint, api_key="none", max_retries=0)
    model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
    specialist = Agent(name="specialist", instructions="Look it up, then answer.", model=model, tools=[lookup])
    triage = Agent(name="triage", instructions="Hand the question off.", model=model, handoffs=[specialist])
    config = RunConfig(tracing_disabled=task["switch"] == "run")
    result = await Runner.run(triage, task["question"], run_config=config, max_turns=6)
    await client.close()
    return float(result.final_output == "done")


@rollout
def write_then_check(task, llm) -> float:
    """LangGraph: two nodes, ``write`` and ``check``, each one LLM call through LangChain's ChatOpenAI."""
    from typing import TypedDict

    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        text: str

    model = ChatOpenAI(model=llm.model, base_url=llm.endpoint, api_key="none", max_retries=0)

    def write(state: State) -> State:
        return {"text": model.invoke(state["text"]).content}

    def check(state: State) -> State:
        return {"text": model.invoke("check: " + state["text"]).content}

    graph = StateGraph(State)
    graph.add_node("write", write)
    graph.add_node("check", check)
    graph.add_edge(START, "write")
    graph.add_edge("write", "check")
    graph.add_edge("check", END)
    graph.compile().invoke({"text": task["question"]})
    return 1.0


async def agent_names(agent: str, instrument: list[str], task: dict) -> list[list[str | None]]:
    """Run ``agent`` on ``task`` twice through a gateway with a scripted model and OTel on, in this process; the
    agent name of each LLM call of each rollout. For switches read once per process (environment variables)."""
    from lightrail.adapters import build_episode
    from lightrail.agent import Runner
    from lightrail.gateway import ScriptedBackend, create_gateway_app
    from lightrail.store import MemoryStore
    from lightrail.tracing import otel
    from lightrail.types import LLM, Resources, RolloutSpec, Task
    from tests.tracing.test_otel import serve

    store = MemoryStore()
    otel.setup(instrument=instrument)
    async with serve(create_gateway_app(ScriptedBackend(scripted), store)) as url:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=url + "/v1", model="scripted")}))
        ids = [r.rollout_id for r in await store.enqueue([RolloutSpec(task=Task(input=task)) for _ in range(2)])]
        stats = await Runner(store, agent, otel=True, handle_signals=False).run(max_rollouts=2)
    assert stats.ended.get("succeeded") == 2, stats
    return [[c.agent_name for c in build_episode(await store.query_spans(i)).calls] for i in ids]
