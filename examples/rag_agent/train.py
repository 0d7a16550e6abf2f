"""The rag agent as lightrail runs it: the plain Agents SDK agent in `agent.py`, given the attempt's routed
endpoint, scored by `reward.py`. This is the only lightrail code the example needs."""

from __future__ import annotations

from examples.rag_agent.agent import EDITOR_ONE_SHOT, ONE_SHOT, answer
from examples.rag_agent.reward import reward
from lightrail import rollout


@rollout
async def rag_agent(task, llm):
    """Format bonus plus answer F1 against the accepted answers (see `examples.rag_agent.reward`); search-tool
    errors become intermediate rewards when GRPO's ``tool_rewards`` is on. A task of a renamed world
    (``"world": k``) searches that world's passages."""
    reply = await answer(
        task["question"],
        base_url=llm.endpoint,
        model=llm.model,
        api_key=llm.api_key or "none",
        world=task.get("world", 0),
        **llm.sampling,
    )
    return reward(reply, task["answers"])


@rollout
async def rag_agent_one_shot(task, llm):
    """The same workflow with each agent shown one worked example first (the researcher: two searches, then its
    notes; the editor: one answer line): what a small instruct model like SmolLM2 needs to use the tool and the
    answer format at all."""
    reply = await answer(
        task["question"],
        base_url=llm.endpoint,
        model=llm.model,
        api_key=llm.api_key or "none",
        world=task.get("world", 0),
        examples=ONE_SHOT,
        editor_examples=EDITOR_ONE_SHOT,
        **llm.sampling,
    )
    return reward(reply, task["answers"])
