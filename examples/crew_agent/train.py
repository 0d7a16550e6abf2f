"""The crew as lightrail runs it: the plain crew in `agent.py`, given the attempt's routed endpoint.

CrewAI is imported inside the rollout, in the runner processes (CrewAI's own environment, see ``config.yaml``'s
``runner_python``): the trainer imports this module too, to check the reference, and has no CrewAI.
"""

from __future__ import annotations

from examples.crew_agent.rewards import NO_ANSWER, answer_reward
from lightrail import emit_event, rollout


@rollout
def crew_agent(task, llm):
    """The writer's answer checked against the gold answer (see `answer_reward`; the wrong option of a
    which-of-two question must not be named).

    CrewAI raises ValueError when the model's output cannot go on (an empty message; tool calls where it forces a
    final answer after ``max_iter``): that is the policy's doing, so it scores `NO_ANSWER` (recorded as an
    event) instead of failing the rollout. Connection errors are not ValueErrors: they still end the attempt as
    an infrastructure error, retried and never trained.
    """
    return _scored(task, llm, one_shot=False)


@rollout
def crew_agent_one_shot(task, llm):
    """The same crew with each agent shown one worked exchange first (`examples.crew_agent.agent.ONE_SHOT`): what a
    small instruct model like SmolLM2 needs to call the tool and write the answer line at all."""
    return _scored(task, llm, one_shot=True)


def _scored(task, llm, *, one_shot: bool) -> float:
    from examples.crew_agent.agent import answer

    try:
        text = answer(
            task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none",
            one_shot=one_shot, **llm.sampling,
        )  # fmt: skip
    except ValueError as exc:
        emit_event("unusable_model_output", error=f"{type(exc).__name__}: {exc}"[:500])
        return NO_ANSWER
    others = [name for name in task["countries"] if name != task["answer"]] if task["kind"] == "population" else []
    return answer_reward(text, task["answer"], others)
