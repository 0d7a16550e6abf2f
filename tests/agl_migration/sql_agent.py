"""The article's SQL agent: a LangGraph write -> check -> rewrite loop over a SQLite database, trained with VERL on
the writer and rewriter only."""

import argparse
import re
import sqlite3

import agentlightning as agl
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

SCHEMA = "CREATE TABLE singer (name TEXT, age INTEGER); INSERT INTO singer VALUES ('Ann', 31), ('Bo', 25);"


class State(TypedDict):
    question: str
    query: str
    feedback: str
    turns: int


def execute(query: str):
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    try:
        return db.execute(query).fetchall()
    except sqlite3.Error as exc:
        return f"error: {exc}"


class LitSQLAgent(agl.LitAgent[dict]):
    def __init__(self, max_turns: int = 2):
        super().__init__(trained_agents="write|rewrite")
        self.max_turns = max_turns

    def rollout(self, task: dict, resources: agl.NamedResources, rollout: agl.Rollout) -> float | None:
        llm: agl.LLM = resources["main_llm"]
        chat = ChatOpenAI(
            model=llm.model,
            base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
            api_key="dummy",
            temperature=llm.sampling_parameters.get("temperature", 0.0),
            max_completion_tokens=8,
            max_retries=0,
        )

        def write_query(state: State):
            reply = chat.invoke([HumanMessage(f"Schema: {SCHEMA}\nQuestion: {state['question']}\nSQL:")])
            return {"query": reply.content, "turns": 0}

        def check_query(state: State):
            reply = chat.invoke([HumanMessage(f"Check this SQL: {state['query']}\nResult: {execute(state['query'])}")])
            return {"feedback": reply.content, "turns": state["turns"] + 1}

        def rewrite_query(state: State):
            reply = chat.invoke([HumanMessage(f"Rewrite {state['query']} given: {state['feedback']}")])
            return {"query": reply.content}

        def should_continue(state: State):
            return END if "correct" in state["feedback"].lower() or state["turns"] >= self.max_turns else "rewrite"

        graph = StateGraph(State)
        graph.add_node("write", write_query)
        graph.add_node("check", check_query)
        graph.add_node("rewrite", rewrite_query)
        graph.add_edge(START, "write")
        graph.add_edge("write", "check")
        graph.add_conditional_edges("check", should_continue, {END: END, "rewrite": "rewrite"})
        graph.add_edge("rewrite", "check")
        app = graph.compile()
        handler = self.tracer.get_langchain_handler()
        result = app.invoke({"question": task["question"]}, {"callbacks": [handler], "recursion_limit": 20})
        predicted = execute(re.sub(r"```(sql)?", "", result["query"]))
        return 1.0 if predicted == execute(task["query"]) else 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dev")
    parser.add_argument("--train")
    args = parser.parse_args()
    tasks = [
        {"question": "How many singers are there?", "query": "SELECT count(*) FROM singer"},
        {"question": "Name the oldest singer.", "query": "SELECT name FROM singer ORDER BY age DESC LIMIT 1"},
    ]
    agent = LitSQLAgent()
    if args.dev:
        trainer = agl.Trainer(
            n_workers=1,
            initial_resources={
                "main_llm": agl.LLM(endpoint=args.dev, model="gpt-4.1-nano", sampling_parameters={"temperature": 0.7})
            },
        )
        trainer.dev(agent, tasks)
        return
    config = {
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "data": {"train_batch_size": 2, "max_prompt_length": 4096, "max_response_length": 8},
        "actor_rollout_ref": {
            "rollout": {"n": 2, "multi_turn": {"format": "hermes"}},
            "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-6}, "use_kl_loss": False},
            "model": {"path": args.train},
        },
        "trainer": {
            "total_epochs": 1,
            "val_before_train": False,
            "experiment_name": "sql_agent",
            "logger": ["console"],
        },
    }
    trainer = agl.Trainer(n_runners=2, algorithm=agl.VERL(config), adapter={"agent_match": "write|rewrite"})
    trainer.fit(agent, train_dataset=tasks, val_dataset=tasks[:1])


if __name__ == "__main__":
    main()
