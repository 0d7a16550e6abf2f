"""Agents written exactly as for Agent Lightning 0.3 (``import agentlightning as agl``), with that one line changed;
importable by runner processes as ``agl_agents:<name>`` (tests/agl/conftest.py puts this folder on the path)."""

from __future__ import annotations

from openai import OpenAI

import lightrail.agl as agl


class EchoAgent(agl.LitAgent[dict]):
    """Calls the LLM once through ``get_base_url`` and rewards an answer that contains the task's expected text;
    emits a multi-dimensional reward, an object, an annotation and an operation span on the way."""

    def __init__(self) -> None:
        super().__init__(trained_agents="echo")

    def rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float | None:
        llm: agl.LLM = resources["main_llm"]
        client = OpenAI(base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id), api_key="x")
        prompt = resources["prompt"].format(question=task["question"])
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": prompt}], **llm.sampling_parameters
        )
        text = reply.choices[0].message.content or ""
        agl.emit_object({"mode": rollout.mode, "input": rollout.input, "attempt": rollout.attempt.attempt_id})
        agl.emit_annotation({"task": {"id": task["id"]}})
        self.record(text)
        ok = 1.0 if task["expect"] in text else 0.0
        agl.emit_reward({"match": ok, "length": float(len(text))}, primary_key="match")
        return None

    @agl.operation
    def record(self, text: str) -> int:
        return len(text)


class AsyncSplitAgent(agl.LitAgent[dict]):
    """Reports which of Agent Lightning's methods ran, as the reward: 1 training, 2 validation (both async)."""

    async def training_rollout_async(self, task, resources, rollout):
        return 1.0

    async def validation_rollout_async(self, task, resources, rollout):
        return 2.0

    def rollout(self, task, resources, rollout):  # never called: async methods are overridden (Agent Lightning)
        return 3.0


class SyncSplitAgent(agl.LitAgent[dict]):
    def training_rollout(self, task, resources, rollout):
        return 4.0

    def validation_rollout(self, task, resources, rollout):
        return 5.0


class AsyncAgent(agl.LitAgent[dict]):
    async def rollout_async(self, task, resources, rollout):
        return 0.5 if rollout.mode == "train" else 0.25


@agl.rollout
def prompt_agent(task, prompt_template: agl.PromptTemplate, rollout: agl.Rollout):
    agl.emit_message(prompt_template.format(**task))
    return 1.0 if rollout.attempt.attempt_id else 0.0


class SpiderLikeAgent(agl.LitAgent[dict]):
    """A LangGraph loop shaped like the reference's Spider agent: write_query -> check_query -> rewrite_query, each
    node one chat-model call; the reward is the final answer's length parity (it varies on a random model)."""

    def rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        from langchain_openai import ChatOpenAI
        from langgraph.graph import END, START, StateGraph
        from typing_extensions import TypedDict

        llm: agl.LLM = resources["main_llm"]
        chat = ChatOpenAI(
            model=llm.model,
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            api_key="dummy",  # as the reference's agents do: its proxy takes any key
            max_completion_tokens=4,
            temperature=llm.sampling_parameters.get("temperature", 1.0),
            max_retries=0,
        )

        class State(TypedDict):
            question: str
            query: str
            feedback: str

        def write_query(state: State) -> dict:
            return {"query": chat.invoke(resources["prompt"].format(question=state["question"])).content}

        def check_query(state: State) -> dict:
            return {"feedback": chat.invoke(f"check: {state['query']}").content}

        def rewrite_query(state: State) -> dict:
            return {"query": chat.invoke(f"rewrite: {state['query']} {state['feedback']}").content}

        graph = StateGraph(State)
        for node in (write_query, check_query, rewrite_query):
            graph.add_node(node.__name__, node)
        graph.add_edge(START, "write_query")
        graph.add_edge("write_query", "check_query")
        graph.add_edge("check_query", "rewrite_query")
        graph.add_edge("rewrite_query", END)
        app = graph.compile()
        out = app.invoke({"question": task["question"]}, {"callbacks": [self.tracer.get_langchain_handler()]})
        return float(len(out["query"]) % 2)


class MarkHook(agl.Hook):
    """Marks the attempt's trace at the start and end of each rollout (runs in the runner process)."""

    async def on_rollout_start(self, *, agent, runner, rollout):
        agl.emit_annotation({"hook": "start", "rollout": rollout.rollout_id})

    async def on_rollout_end(self, *, agent, runner, rollout, spans):
        agl.emit_annotation({"hook": "end", "rollout": rollout.rollout_id})
