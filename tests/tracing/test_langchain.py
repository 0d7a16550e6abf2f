"""`lightrail.tracing.langchain`: plain LangChain runnables name the agent behind each call, no tracer.

Real LangChain (langchain_core, ``ChatOpenAI``, LangGraph) calling the real gateway (over the `ScriptedBackend` fake
model) from agents run by a real runner over a SQLite store, OpenTelemetry off. What a user relies on: the names
LangChain code already gives its runnables are the names training selects the calls by.
"""

from __future__ import annotations

from typing import TypedDict

from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, chain
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from lightrail import Runner, as_agent, rollout
from lightrail.adapters import build_episode
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import SQLiteStore
from lightrail.types import LLM, Attr, Resources, RolloutSpec, Task

TOKEN = "langchain-token"
PROMPT = ChatPromptTemplate.from_messages([("user", "{q}")])


def _model(llm, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.endpoint, api_key=llm.api_key, model=llm.model, max_retries=0, **kwargs)


@rollout
def sync_chains(task, llm) -> float:
    """Chains run synchronously (the runner's worker thread): named by run name, by tag, nested, and unnamed."""
    model = _model(llm)
    writer = (PROMPT | model).with_config(run_name="writer")
    reviewer = (PROMPT | model).with_config(tags=["agent:reviewer"])
    writer.invoke({"q": "draft"})
    reviewer.invoke({"q": "review"})
    pipeline = writer | RunnableLambda(lambda reply: {"q": reply.content}) | reviewer  # a sequence nobody named
    pipeline.invoke({"q": "both"})
    (PROMPT | model).invoke({"q": "nobody"})
    with as_agent("boss"):  # an explicit name wins over the runnable's
        writer.invoke({"q": "overruled"})
    return 1.0


@rollout
async def async_runnables(task, llm) -> float:
    """Async: a ``@chain`` function, a chat model with a run name or a ``name``, and a LangGraph node."""
    model = _model(llm)

    @chain
    async def planner(question: str):
        return await model.ainvoke(question)

    await planner.ainvoke("plan")
    await model.with_config(run_name="critic").ainvoke("criticize")
    await _model(llm, name="judge").ainvoke("judge")

    class State(TypedDict):
        q: str

    async def draft(state: State) -> State:
        await model.ainvoke(state["q"])
        return state

    graph = StateGraph(State).add_node("draft", draft).add_edge(START, "draft").add_edge("draft", END).compile()
    await graph.ainvoke({"q": "graph"})
    return 1.0


async def _agents_of(tmp_path, agent) -> list[str | None]:
    store = SQLiteStore(tmp_path / "store.db")
    async with GatewayServer(ScriptedBackend(), store, token=TOKEN) as gateway:
        await store.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key=TOKEN)}))
        (queued,) = await store.enqueue([RolloutSpec(task=Task(input={}), resources_version=1)])
        stats = await Runner(store, agent, handle_signals=False).run(max_rollouts=1)
    assert stats.ended["succeeded"] == 1, stats
    episode = build_episode(await store.query_spans(queued.rollout_id))
    await store.close()
    assert [c.span.attributes.get(Attr.CALLER_AGENT) for c in episode.calls] == [c.agent_name for c in episode.calls]
    return [c.agent_name for c in episode.calls]


async def test_sync_chains_name_their_calls_by_run_name_and_agent_tag(tmp_path):
    assert await _agents_of(tmp_path, sync_chains) == ["writer", "reviewer", "writer", "reviewer", None, "boss"]


async def test_async_runnables_chat_models_and_graph_nodes_name_their_calls(tmp_path):
    assert await _agents_of(tmp_path, async_runnables) == ["planner", "critic", "judge", "draft"]
