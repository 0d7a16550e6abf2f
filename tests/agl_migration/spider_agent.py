"""Shaped like the reference's Spider example: a LangGraph SQL loop whose trained agent is chosen on the command
line (``agent_match``: all agents by default, or the ones whose name the regex finds). No ``__main__`` guard: the
script is its entry point, as the published walkthrough is written."""

import argparse
import sqlite3

import agentlightning as agl
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

DB = "CREATE TABLE city (name TEXT, people INTEGER); INSERT INTO city VALUES ('Oslo', 700), ('Bergen', 290);"


class State(TypedDict):
    question: str
    query: str
    turn: int


def run_sql(query):
    db = sqlite3.connect(":memory:")
    db.executescript(DB)
    try:
        return db.execute(query).fetchall()
    except sqlite3.Error:
        return None


class SpiderAgent(agl.LitAgent[dict]):
    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        chat = ChatOpenAI(
            model=llm.model,
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            api_key="dummy",
            max_completion_tokens=8,
            max_retries=0,
            **llm.sampling_parameters,
        )

        def write_query(state):
            return {"query": chat.invoke(f"{DB}\n-- {state['question']}\nSELECT").content, "turn": 0}

        def rewrite_query(state):
            return {"query": chat.invoke(f"Fix: {state['query']}").content, "turn": state["turn"] + 1}

        def route(state):
            return END if run_sql(state["query"]) is not None or state["turn"] >= 2 else "rewrite_query"

        graph = StateGraph(State)
        graph.add_node("write_query", write_query)
        graph.add_node("rewrite_query", rewrite_query)
        graph.add_edge(START, "write_query")
        graph.add_conditional_edges("write_query", route, {END: END, "rewrite_query": "rewrite_query"})
        graph.add_conditional_edges("rewrite_query", route, {END: END, "rewrite_query": "rewrite_query"})
        state = graph.compile().invoke(
            {"question": task["question"]}, {"callbacks": [self.tracer.get_langchain_handler()]}
        )
        return 1.0 if run_sql(state["query"]) == run_sql(task["gold"]) else 0.0


parser = argparse.ArgumentParser()
parser.add_argument("--dev")
parser.add_argument("--train")
parser.add_argument("--active-agent", default="write")
args = parser.parse_args()
agl.setup_logging("WARNING")
data = [
    {"question": "How many cities?", "gold": "SELECT count(*) FROM city"},
    {"question": "Largest city?", "gold": "SELECT name FROM city ORDER BY people DESC LIMIT 1"},
]
agent = SpiderAgent()
if args.dev:
    resources = {"main_llm": agl.LLM(endpoint=args.dev, model="gpt-4.1-nano", sampling_parameters={"temperature": 0})}
    agl.Trainer(n_workers=1, initial_resources=resources).dev(agent, data)
else:
    config = {
        "algorithm": {"adv_estimator": "grpo"},
        "data": {"train_batch_size": 2, "max_response_length": 8},
        "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2}, "model": {"path": args.train}},
        "trainer": {"total_epochs": 1, "val_before_train": False, "experiment_name": "spider"},
    }
    trainer = agl.Trainer(n_runners=2, algorithm=agl.VERL(config), adapter={"agent_match": args.active_agent})
    trainer.fit(agent, train_dataset=data, val_dataset=data[:1])
