"""The calculator agent as lightrail runs it: the plain agent in `agent.py`, given the attempt's routed endpoint.

This adapter is the only lightrail code the example needs: the agent itself just takes a base URL.
"""

from __future__ import annotations

from examples.calculator.agent import solve
from lightrail import rollout


@rollout
def calculator_agent(task, llm):
    """Reward 1 for the exact answer, 0 otherwise (tool-call outcomes become intermediate rewards automatically)."""
    answer = solve(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none", **llm.sampling
    )
    return 1.0 if answer == task["answer"] else 0.0
