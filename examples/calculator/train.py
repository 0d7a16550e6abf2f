"""The calculator agent as lightrail runs it: the plain agent (`agent.py`) given the attempt's routed endpoint.

This adapter is the only lightrail code the example needs; the agent itself just takes a base URL::

    @rollout
    def calculator_agent(task, llm):
        answer = solve(task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none",
                       **llm.sampling)
        return 1.0 if answer == task["answer"] else 0.0

Defined in ``lightrail/demos/calculator/train.py``; configs and runners name it here
(``agent: examples.calculator.train:calculator_agent``).
"""

from __future__ import annotations

from lightrail.demos.calculator.train import calculator_agent, calculator_agent_one_shot

__all__ = ["calculator_agent", "calculator_agent_one_shot"]
