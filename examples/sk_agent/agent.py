"""A Semantic Kernel `ChatCompletionAgent` that solves arithmetic word problems with a calculator plugin.

Nothing here knows about lightrail: the agent takes the base URL, model name, API key and sampling settings of any
OpenAI-compatible server (`OpenAIChatCompletion` on an `openai.AsyncOpenAI` client pointed there).

    solver ──calculator-evaluate(expression)──► result ──► solver: "Answer: 42"

* ``solver`` — a `ChatCompletionAgent` with one plugin, ``calculator``, whose one kernel function ``evaluate`` is
  the tool the model calls (Semantic Kernel names it ``calculator-evaluate`` in the request's ``tools``).
  `FunctionChoiceBehavior.Auto` lets Semantic Kernel invoke the function the model asks for and hand the result
  back, ``max_tool_rounds`` times at most; the agent's answer is its last message.
* The calculator is the calculator example's safe evaluator (`ast`, ``+ - *`` only, never `eval`); a bad
  expression comes back as ``Error: ...`` text, as a real tool would report it.

    python -m examples.sk_agent.agent --base-url http://127.0.0.1:8000/v1 --model tiny \\
        "Tom has 12 apples and gets 30 more. How many apples does Tom have now?"

Semantic Kernel's own telemetry, on the global OpenTelemetry tracer provider, only while its diagnostics switch is
on (``SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS=true``, or ``..._SENSITIVE`` which adds prompts and
completions; read once, when Semantic Kernel is first imported; off by default): the agent's ``invoke_agent solver``
span (OpenTelemetry's GenAI conventions), a ``chat.completions <model>`` span per model call and an ``execute_tool``
span per function call. Off, only the ``execute_tool`` spans are made (they name no agent).
"""

from __future__ import annotations

from typing import Annotated, Any

from openai import AsyncOpenAI
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.open_ai import OpenAIChatCompletion, OpenAIChatPromptExecutionSettings
from semantic_kernel.contents import (
    AuthorRole,
    ChatHistory,
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
)
from semantic_kernel.functions import KernelArguments, kernel_function

from examples.calculator.agent import calculate, parse_answer
from examples.sk_agent.prompts import (
    EVALUATE_DESCRIPTION,
    EXPRESSION_DESCRIPTION,
    FUNCTION,
    PLUGIN,
    SOLVER,
    SOLVER_SYSTEM,
    TOOL,
)


def one_shot_history() -> list[ChatMessageContent]:
    """One worked problem the solver sees before its task (``one_shot=True``): the question, a call of the
    calculator, its result and the answer line, as Semantic Kernel's own chat history holds them. A small instruct
    model such as SmolLM2-135M rarely calls a tool it has only read about, and almost never ends with
    "Answer: <number>"."""
    call = {"id": "call_1", "function_name": FUNCTION, "plugin_name": PLUGIN}
    return [
        ChatMessageContent(role=AuthorRole.USER, content="Ana has 12 pens and buys 30 more. How many pens does Ana have now?"),
        ChatMessageContent(role=AuthorRole.ASSISTANT, items=[FunctionCallContent(**call, arguments='{"expression": "12+30"}')]),
        ChatMessageContent(role=AuthorRole.TOOL, items=[FunctionResultContent(**call, result="42")]),
        ChatMessageContent(role=AuthorRole.ASSISTANT, content="Answer: 42", name=SOLVER),
    ]  # fmt: skip


class CalculatorPlugin:
    """The solver's plugin: one kernel function, the tool."""

    @kernel_function(name=FUNCTION, description=EVALUATE_DESCRIPTION)
    def evaluate(self, expression: Annotated[str, EXPRESSION_DESCRIPTION]) -> str:
        return calculate(expression)


def build_agent(
    *, base_url: str, model: str, api_key: str = "none", max_tool_rounds: int = 2, **sampling: Any
) -> ChatCompletionAgent:
    """The solver on one OpenAI-compatible endpoint. ``sampling`` (``temperature``, ``max_tokens``, ``top_p``,
    ...) goes to every call; ``max_tool_rounds`` bounds how often Semantic Kernel runs the calculator for the
    model (then the model must answer without tools)."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    service = OpenAIChatCompletion(ai_model_id=model, async_client=client, service_id=SOLVER)
    settings = OpenAIChatPromptExecutionSettings(
        service_id=SOLVER,
        function_choice_behavior=FunctionChoiceBehavior.Auto(maximum_auto_invoke_attempts=max_tool_rounds),
        **sampling,
    )
    kernel = Kernel()
    kernel.add_plugin(CalculatorPlugin(), plugin_name=PLUGIN)
    return ChatCompletionAgent(
        kernel=kernel,
        service=service,
        name=SOLVER,
        instructions=SOLVER_SYSTEM,
        arguments=KernelArguments(settings=settings),
    )


async def solve(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    max_tool_rounds: int = 2,
    one_shot: bool = False,
    **sampling: Any,
) -> str:
    """Run the solver on one problem; returns its final message (``"Answer: 42"`` when it behaves). With
    ``one_shot`` the conversation starts with `one_shot_history`'s worked problem."""
    agent = build_agent(base_url=base_url, model=model, api_key=api_key, max_tool_rounds=max_tool_rounds, **sampling)
    thread = ChatHistoryAgentThread(ChatHistory(messages=one_shot_history())) if one_shot else None
    response = await agent.get_response(messages=question, thread=thread)
    return str(response.content)


__all__ = [
    "PLUGIN",
    "SOLVER",
    "SOLVER_SYSTEM",
    "TOOL",
    "CalculatorPlugin",
    "build_agent",
    "one_shot_history",
    "parse_answer",
    "solve",
]

if __name__ == "__main__":
    import argparse
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--one-shot", action="store_true", help="show the solver one worked problem first")
    args = parser.parse_args()
    text = asyncio.run(
        solve(
            args.question,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            max_tokens=args.max_tokens,
            one_shot=args.one_shot,
        )  # fmt: skip
    )
    print(text)
