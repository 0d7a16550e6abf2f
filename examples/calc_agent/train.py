"""The calculator team as lightrail runs it: the AutoGen team of `agent.py`, given the attempt's routed endpoint.

Reward: 1 for the exact final answer, 0 otherwise (no answer, a wrong one, or a chat the model derailed). Tool
outcomes become intermediate rewards without any code here: with ``grpo.tool_rewards`` on, lightrail reads each
calculator result (AutoGen's ``execute_tool`` span, else the tool message in the next request) and rewards the
LLM call that asked for it (`lightrail.adapters.rewards.ToolRewardRule`; ``credit: per_turn`` uses them).
"""

from __future__ import annotations

import os

from examples.calc_agent.agent import solve
from examples.calculator.calcx import numeric_reward
from lightrail import rollout

# AutoGen's agent runtime traces its own message passing (~15 "autogen publish/process/ack" spans per agent
# turn); with OpenTelemetry on they would all be stored with each rollout and none says anything about the
# agents. The spans that do (agents, LLM calls, tool calls) come from AgentChat and stay on.
os.environ.setdefault("AUTOGEN_DISABLE_RUNTIME_TRACING", "true")


def answer_reward(answer: int | None, expected: int) -> float:
    """1.0 for the exact answer, 0.0 for a wrong one or none."""
    return 1.0 if answer is not None and answer == expected else 0.0


#: openai exceptions that mean the model server could not be reached or failed (not the policy's doing).
_SERVER_FAILURES = ("APIConnectionError", "APITimeoutError", "InternalServerError")


@rollout
async def calc_agent(task, llm):
    """Run the solver/checker team on ``task["question"]`` with the calculator ``task["tools"]`` names; the reward
    is `answer_reward`, or for a Calc-X problem (``task["result"]``) `examples.calculator.calcx.numeric_reward`.

    An AutoGen team re-raises an agent's exception as ``RuntimeError("<type>: <message>...")``, so the openai
    exception's type is lost on the way. It is read back from the text: a server that cannot be reached raises
    `ConnectionError` (lightrail ends the attempt as an infrastructure error: retried, never trained); a chat
    that outgrew the model's context scores 0 like any other failed answer.
    """
    try:
        solution = await solve(
            task["question"],
            base_url=llm.endpoint,
            model=llm.model,
            api_key=llm.api_key or "none",
            tools=task.get("tools", "local"),
            max_turns=task.get("max_turns", 3),
            one_shot=task.get("one_shot", False),
            **llm.sampling,
        )
    except RuntimeError as exc:
        kind, _, message = str(exc).partition(": ")
        message = message.partition("\nTraceback:")[0]
        if kind in _SERVER_FAILURES:
            raise ConnectionError(f"{kind}: {message}") from exc
        if kind == "BadRequestError" and "context" in message:
            return 0.0
        raise
    if "result" in task:  # a Calc-X problem (`data.calcx`): Agent Lightning's numeric comparison of the text
        return numeric_reward(solution.reply, task["result"])
    return answer_reward(solution.answer, task["answer"])
