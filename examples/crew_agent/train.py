"""The crew as lightrail runs it: the plain crew in `agent.py`, given the attempt's routed endpoint.

CrewAI is imported inside the rollout, in the runner processes (CrewAI's own environment, see ``config.yaml``'s
``runner_python``): the trainer imports this module too, to check the reference, and has no CrewAI.
"""

from __future__ import annotations

from examples.crew_agent.rewards import answer_reward
from lightrail import rollout


@rollout
def crew_agent(task, llm):
    """The writer's answer line checked against the gold answer (see `answer_reward`)."""
    from examples.crew_agent.agent import answer

    text = answer(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none", **llm.sampling
    )
    return answer_reward(text, task["answer"])
