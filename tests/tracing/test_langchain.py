"""`lightrail.tracing.langchain`: plain LangChain runnables name the agent behind each call, no tracer.

Real LangChain (langchain_core, ``ChatOpenAI``, LangGraph) calling the real gateway (over the `ScriptedBackend` fake
model) from agents run by a real runner over a SQLite store, OpenTelemetry off. What a user relies on: the names
LangChain code already gives its runnables are the names training selects the calls by.
"""

from __future__ import annotations

import asyncio
from typing import TypedDict
from uuid import uuid4

import httpx
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, chain
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

from lightrail import Runner, as_agent, rollout
from lightrail.adapters import build_episode
from lightrail.gateway import GatewayServer, ScriptedBackend
from lightrail.store import SQLiteStore
from lightrail.tracing import langchain
from lightrail.types import AGENT_HEADER, LLM, Attr, Resources, RolloutSpec, Task

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


async def test_runs_never_ended_cost_the_oldest_names_not_the_open_runs_of_other_rollouts(monkeypatch):
    """Past its bound the run table forgets the oldest runs (here abandoned ones, driven through the real handler),
    not every run: a chain still running while other rollouts start theirs keeps its name. The header is read
    from a real request through httpx."""
    monkeypatch.setattr(langchain._handler, "max_open_runs", 4)
    seen: list[str | None] = []

    async def app(scope, receive, send):
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(AGENT_HEADER.encode(), b"").decode() or None)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    langchain.install()
    for i in range(10):  # streams abandoned long ago: started, never ended
        langchain._handler.on_chain_start({}, {}, run_id=uuid4(), name=f"abandoned-{i}")
    go = asyncio.Event()
    started = asyncio.Semaphore(0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:

        async def writer(_: str) -> None:
            started.release()
            await go.wait()
            await client.get("/")

        async def other(_: str) -> None:  # another rollout's chain, open while the writer waits
            started.release()
            await go.wait()

        running = asyncio.gather(
            RunnableLambda(writer).ainvoke("x"), *(RunnableLambda(other).ainvoke("x") for _ in range(3))
        )
        for _ in range(4):
            await started.acquire()
        go.set()
        await running
    assert seen == ["writer"]
    assert len(langchain._handler.runs) <= 4


def test_the_cache_of_langchain_class_names_is_bounded():
    """Run names made per task (``f"writer-{i}"``) cannot grow it without limit."""
    for i in range(3 * langchain._MAX_CLASS_NAMES):
        assert not langchain._is_class_name(f"writer-{i}")
    assert langchain._is_class_name("RunnableSequence") and langchain._is_class_name("RunnableParallel<a,b>")
    assert langchain._is_runnable_class.cache_info().currsize <= langchain._MAX_CLASS_NAMES
