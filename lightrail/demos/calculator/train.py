"""The calculator agent as lightrail runs it: the plain agent in `agent.py`, given the attempt's routed endpoint.

This adapter is the only lightrail code the agent needs: the agent itself just takes a base URL.
"""

from __future__ import annotations

from lightrail import rollout
from lightrail.demos.calculator.agent import ONE_SHOT, solve


@rollout
def calculator_agent(task, llm):
    """Reward 1 for the exact answer, 0 otherwise (tool-call outcomes become intermediate rewards automatically)."""
    answer = solve(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none", **llm.sampling
    )
    return 1.0 if answer == task["answer"] else 0.0


@rollout
def calculator_agent_one_shot(task, llm):
    """The same agent shown one worked example first (what an instruct model like SmolLM2 needs to use the tool)."""
    answer = solve(
        task["question"],
        base_url=llm.endpoint,
        model=llm.model,
        api_key=llm.api_key or "none",
        examples=ONE_SHOT,
        **llm.sampling,
    )
    return 1.0 if answer == task["answer"] else 0.0
