"""The rag agent as lightrail runs it: the plain Agents SDK agent in `agent.py`, given the attempt's routed
endpoint, scored by `reward.py`. This is the only lightrail code the example needs."""

from __future__ import annotations

from examples.rag_agent.agent import ONE_SHOT, answer
from examples.rag_agent.reward import reward
from lightrail import rollout


@rollout
async def rag_agent(task, llm):
    """Format bonus plus answer F1 against the accepted answers (see `examples.rag_agent.reward`); search-tool
    errors become intermediate rewards when GRPO's ``tool_rewards`` is on."""
    reply = await answer(
        task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none", **llm.sampling
    )
    return reward(reply, task["answers"])


@rollout
async def rag_agent_one_shot(task, llm):
    """The same workflow with the researcher shown one worked example first (two searches, then an answer):
    what a small instruct model like SmolLM2 needs before it calls the tool at all."""
    reply = await answer(
        task["question"],
        base_url=llm.endpoint,
        model=llm.model,
        api_key=llm.api_key or "none",
        examples=ONE_SHOT,
        **llm.sampling,
    )
    return reward(reply, task["answers"])
