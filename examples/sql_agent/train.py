"""The SQL agent as lightrail runs it: the LangGraph app of `agent.py`, pointed at the attempt's routed endpoint,
scored by execution match against the task's gold SQL.

This wrapper is the only lightrail code the example needs. Which LLM calls are trained is decided by the config
(``grpo.agents: [write_query, rewrite_query]``), from the LangGraph node each call ran in: with OpenTelemetry on,
the OpenInference LangChain instrumentor records the node (``langgraph.node``) on the framework's spans, and
the adapter matches the gateway's span of each call to the framework's LLM span of the same response id.
"""

from __future__ import annotations

import sqlite3
import threading
from functools import cache

from examples.sql_agent.agent import ONE_SHOT, ONE_SHOT_BASIC, MaskedQuestionSelector, answer
from examples.sql_agent.data import splits
from examples.sql_agent.database import connect, database_path
from examples.sql_agent.reward import condition_credit, execution_match
from lightrail import rollout

MAX_TURNS = 3
_local = threading.local()


@cache
def _database() -> str:
    return str(database_path())  # built (or found in the cache) once per runner process


#: The pool dynamic few-shot examples come from: training questions of another seed (`data.split_of` keeps every
#: held-out question out of every training split, so no held-out question or its SQL is ever shown).
EXAMPLE_POOL = {"seed": 1000, "n_train": 200, "n_val": 0}


@cache
def example_selector(tier: str = "mixed") -> MaskedQuestionSelector:
    """The writer's and rewriter's worked example for each question: the pool's most similar question with its SQL
    (`agent.MaskedQuestionSelector`), from `EXAMPLE_POOL`'s questions of ``tier``."""
    return MaskedQuestionSelector(splits(**EXAMPLE_POOL, tier=tier)[0])


def _connection(database: str | None = None) -> sqlite3.Connection:
    """One read-only connection per thread and database: sync rollouts run in the runner's threads, several at
    once. ``database`` is a task's own SQLite file (a Spider task's ``database``); None: the flights database."""
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    path = database or _database()
    if path not in conns:
        conns[path] = connect(path)
    return conns[path]


def _score(task: dict, llm, examples=(), max_turns: int = MAX_TURNS, reward=execution_match) -> float:
    """Run the agent on the task's question against the task's database (``task["database"]`` with its
    ``task["schema"]``, as `examples.sql_agent.spider` gives them; else the flights database) and score its final
    query there against the gold ``task["sql"]``."""
    conn = _connection(task.get("database"))
    state = answer(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none",
        max_turns=max_turns, examples=examples, conn=conn, schema=task.get("schema"), **llm.sampling,
    )  # fmt: skip
    return reward(conn, state.get("sql"), task["sql"])


@rollout
def sql_agent(task, llm):
    """Reward 1 when the query the agent settled on returns the gold query's rows, else 0 (invalid SQL: 0)."""
    return _score(task, llm)


@rollout
def sql_agent_one_shot(task, llm):
    """The same agent with one worked example shown to the writer and the rewriter (what a small instruct model
    like SmolLM2 needs to answer in SQL rather than prose)."""
    return _score(task, llm, ONE_SHOT)


@rollout
def sql_agent_basic(task, llm):
    """The agent for the basic tier (``data_args.tier: basic``) and a small pretrained model: one worked example
    of that tier (`agent.ONE_SHOT_BASIC`), at most two queries (the first and one rewrite)."""
    return _score(task, llm, ONE_SHOT_BASIC, max_turns=2)


@rollout
def sql_agent_basic_credit(task, llm):
    """`sql_agent_basic` with a denser reward (`reward.condition_credit`): 1 on an execution match, else up to 0.5
    for the WHERE conditions the query shares with the gold query. Train and validate it with
    ``success_threshold: 1.0``: a success is still an execution match."""
    return _score(task, llm, ONE_SHOT_BASIC, max_turns=2, reward=condition_credit)


@rollout
def sql_agent_nearest(task, llm):
    """The agent with dynamic few-shot examples (`example_selector`): the writer and the rewriter see the most
    similar question of a pool of training questions of both tiers with its SQL, at most two queries (the first and
    one rewrite), scored by `reward.condition_credit` (train and validate with ``success_threshold: 1.0``). For a
    small pretrained model: it has to adapt the example's names, codes and numbers to the question."""
    return _score(task, llm, example_selector(), max_turns=2, reward=condition_credit)
