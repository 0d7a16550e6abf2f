"""A test-only wrapper of the SQL agent: the real LangGraph app (every node calls the model through the gateway),
scored 1 when its final query has an even number of characters. The tiny random model never writes a right query,
so execution match would give every sample 0 and GRPO no advantage; this reward tells samples apart, so a step
trains. It measures nothing about SQL."""

from __future__ import annotations

from examples.sql_agent.agent import ONE_SHOT, answer
from examples.sql_agent.train import MAX_TURNS, _connection
from lightrail import rollout


@rollout
def sql_agent_parity(task, llm):
    state = answer(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none",
        max_turns=MAX_TURNS, examples=ONE_SHOT, conn=_connection(), **llm.sampling,
    )  # fmt: skip
    return float(len(state.get("sql") or "") % 2 == 0)
