"""The Semantic Kernel solver as lightrail runs it: the plain agent of `agent.py`, given the attempt's endpoint.

Semantic Kernel is imported inside the rollout, in the runner processes (its own environment, see ``config.yaml``'s
``runner_python``): the trainer imports this module too, to check the reference, and has no Semantic Kernel.

Reward: 1 for the exact final answer (the last ``Answer: <number>`` of the agent's reply), 0 otherwise. Tool
outcomes become intermediate rewards without any code here: with ``grpo.tool_rewards`` on, lightrail reads each
calculator result (the tool message in the next request) and rewards the LLM call that asked for it.

Which agent made each call: Semantic Kernel's own telemetry, when its diagnostics are on. They are off by default
and, in Semantic Kernel 1.45, off means no agent span (no ``invoke_agent``; only its kernel functions'
``execute_tool``, which name no agent), so this module turns them on unless the environment says otherwise
(``SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS``; Semantic Kernel reads it once, when it is first
imported). With the runners' OpenTelemetry on (``trainer.otel``), the agent's ``invoke_agent solver`` span then
names every call it makes. When its spans cannot reach lightrail (the switch set off by the user; the runners'
OpenTelemetry off: no provider), the rollout names the solver's calls itself: it hands the agent
``llm.endpoint_for("solver")``.
"""

from __future__ import annotations

import os

from examples.calculator.agent import parse_answer
from examples.calculator.calcx import numeric_reward
from examples.sk_agent.prompts import SOLVER
from lightrail import rollout

DIAGNOSTICS = "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS"
os.environ.setdefault(DIAGNOSTICS, "true")


def answer_reward(text: str | None, expected: int) -> float:
    """1.0 when ``text``'s ``Answer: <number>`` is ``expected``, 0.0 for a wrong answer or none."""
    answer = parse_answer(text)
    return 1.0 if answer is not None and answer == expected else 0.0


@rollout
async def sk_agent(task, llm):
    """Run the solver on ``task["question"]`` on the attempt's endpoint; the reward is `answer_reward` (for a Calc-X
    problem, ``task["result"]``: `examples.calculator.calcx.numeric_reward`).
    Connection errors (openai's ``APIConnectionError``) end the attempt as an infrastructure error: retried,
    never trained."""
    from semantic_kernel.utils.telemetry.agent_diagnostics.decorators import are_model_diagnostics_enabled

    from examples.sk_agent.agent import solve
    from lightrail.tracing import otel

    traced = are_model_diagnostics_enabled() and otel.current() is not None
    base_url = llm.endpoint if traced else llm.endpoint_for(SOLVER)  # Semantic Kernel's spans name it, else the URL
    text = await solve(
        task["question"],
        base_url=base_url,
        model=llm.model,
        api_key=llm.api_key or "none",
        max_tool_rounds=task.get("max_tool_rounds", 2),
        one_shot=task.get("one_shot", False),
        **llm.sampling,
    )
    if "result" in task:  # a Calc-X problem (`data.calcx`): Agent Lightning's numeric comparison of the text
        return numeric_reward(text, task["result"])
    return answer_reward(text, task["answer"])
