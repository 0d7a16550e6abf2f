"""The rag agent as lightrail runs it: the plain Agents SDK agent in `agent.py`, given the attempt's routed
endpoint, scored by `reward.py`. This is the only lightrail code the example needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from examples.rag_agent.agent import EDITOR_ONE_SHOT, ONE_SHOT, answer
from examples.rag_agent.reward import reward
from lightrail import rollout


def corpus_of(task: dict) -> Callable[[], Any] | None:
    """What a task searches, made on its first search (in the search tool's worker thread): a MuSiQue task's own
    paragraphs (``"passages"``) or the pooled paragraphs of its files (``"corpus": {"files": [...]}``), see
    `examples.rag_agent.musique`; None for a country task (its ``world``'s passages)."""
    from examples.rag_agent.retrieval import pooled_index, question_index

    if "passages" in task:
        passages = tuple(task["passages"])
        return lambda: question_index(passages)
    if "corpus" in task:
        files = tuple(task["corpus"]["files"])
        return lambda: pooled_index(files)
    return None


@rollout
async def rag_agent(task, llm):
    """Format bonus plus answer F1 against the accepted answers (see `examples.rag_agent.reward`); search-tool
    errors become intermediate rewards when GRPO's ``tool_rewards`` is on. A task of a renamed world
    (``"world": k``) searches that world's passages; a MuSiQue task (`examples.rag_agent.musique`) its paragraphs."""
    reply = await answer(
        task["question"],
        base_url=llm.endpoint,
        model=llm.model,
        api_key=llm.api_key or "none",
        world=task.get("world", 0),
        corpus=corpus_of(task),
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
        corpus=corpus_of(task),
        **llm.sampling,
    )
    return reward(reply, task["answers"])
