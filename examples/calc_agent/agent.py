"""A calculator team in AutoGen AgentChat: a ``solver`` with a calculator tool and a ``checker`` that reviews it.

Nothing here knows about lightrail: the team takes the base URL, model name, API key and sampling settings of any
OpenAI-compatible server. The two agents take turns (`RoundRobinGroupChat`): the solver calls
``calculator(expression)`` and answers ``Answer: <number>``; the checker replies ``CORRECT`` (which ends the chat)
or says what is wrong, and the solver gets another turn. The team's answer is the solver's last ``Answer:``.

The calculator runs in one of two places, picked by ``tools``:

* ``"local"`` — an AutoGen `FunctionTool` in this process;
* ``"mcp"`` — the MCP server of `examples.calc_agent.mcp_server`, spawned as a subprocess (stdio transport) for
  the duration of one `solve`.

Both evaluate with the calculator example's safe evaluator (`ast`, ``+ - *`` only, never `eval`). A bad call —
an expression that is not arithmetic, arguments that are not ``{"expression": str}`` — *raises*, so AutoGen's
tool span is marked as an error and the tool message the model sees starts with ``Error`` (both are how tool
failures are recognised downstream).

    python -m examples.calc_agent.agent --base-url http://127.0.0.1:8000/v1 --model smollm2 --tools mcp --one-shot \\
        "Tom has 12 apples and gets 30 more. How many apples does Tom have now?"

Why not `autogen_ext.tools.mcp` (`McpWorkbench`)? autogen-ext 0.7.5 imports ``mcp.shared.context.RequestContext``,
which mcp 2 removed, so it cannot be imported next to the mcp 2 this project uses; `mcp_calculator` is the few
lines of it this agent needs, on mcp 2's own `mcp.Client`.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import TextMentionTermination
from autogen_agentchat.messages import TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken, FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelFamily,
    ModelInfo,
    UserMessage,
)
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient
from pydantic import ValidationError

from examples.calculator.agent import calculate, parse_answer

TOOLS = ("local", "mcp")
"""Where the calculator runs: in this process, or in an MCP server subprocess."""

SOLVER = "solver"
CHECKER = "checker"

SOLVER_SYSTEM = (
    "Solve the arithmetic word problem. Call the calculator tool with the arithmetic expression, "
    "then reply with 'Answer: <number>'."
)
CHECKER_SYSTEM = (
    "Check the solver's answer to the problem. If the answer is right, reply 'CORRECT'. "
    "Otherwise say which step is wrong."
)
CALCULATOR_DESCRIPTION = "Evaluate an arithmetic expression with + - * and parentheses, e.g. '12+30*2'."

#: One worked problem the solver sees before its task (``one_shot=True``): a small instruct model such as
#: SmolLM2-135M rarely calls a tool it has only read about, and almost never ends with "Answer: <number>".
ONE_SHOT: list[LLMMessage] = [
    UserMessage(content="Ana has 12 pens and buys 30 more. How many pens does Ana have now?", source="user"),
    AssistantMessage(
        content=[FunctionCall(id="call_1", name="calculator", arguments='{"expression": "12+30"}')], source=SOLVER
    ),
    FunctionExecutionResultMessage(
        content=[FunctionExecutionResult(content="42", call_id="call_1", name="calculator", is_error=False)]
    ),
    AssistantMessage(content="Answer: 42", source=SOLVER),
]

#: What AutoGen needs to know about a model whose name it has never heard of (it refuses tools otherwise).
MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    structured_output=False,
    family=ModelFamily.UNKNOWN,
    multiple_system_messages=True,
)

_PROJECT_ROOT = Path(__file__).resolve().parents[2]

# AutoGen compares the model name a server reports with the requested one to look up prices and context sizes;
# for a model it does not know (any local or fine-tuned one) it warns on every call.
warnings.filterwarnings("ignore", message="Resolved model mismatch", category=UserWarning)


class CalculatorTool(FunctionTool):
    """A `FunctionTool` whose argument errors read like its other errors (``Error: ...``).

    AutoGen validates arguments before the function runs; a model that sends ``{"expression": 42}`` or ``{}``
    would otherwise see pydantic's "1 validation error for ..." text, which does not say it failed.
    """

    async def run_json(
        self, args: Mapping[str, Any], cancellation_token: CancellationToken, call_id: str | None = None
    ) -> Any:
        try:
            return await super().run_json(args, cancellation_token, call_id)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"Error: invalid arguments {dict(args)!r} ({problems})") from exc


def local_calculator() -> CalculatorTool:
    """The calculator as an in-process tool."""

    async def calculator(expression: str) -> str:
        result = calculate(expression) if expression.strip() else "Error: empty expression"
        if result.startswith("Error"):
            raise ValueError(result)
        return result

    return CalculatorTool(calculator, description=CALCULATOR_DESCRIPTION)


def mcp_server_params() -> Any:
    """How to spawn `examples.calc_agent.mcp_server` (from the project root, so ``-m examples...`` imports)."""
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(
        command=sys.executable, args=["-m", "examples.calc_agent.mcp_server"], cwd=str(_PROJECT_ROOT)
    )


def mcp_calculator(call_tool: Callable[[str, dict[str, Any]], Awaitable[Any]], description: str) -> CalculatorTool:
    """The MCP server's ``calculator`` as an AutoGen tool: each call is one ``tools/call`` request.

    ``call_tool`` is a connected `mcp.Client`'s ``call_tool``. A result the server marks ``is_error`` raises,
    with the server's text (``Error executing tool calculator: ...``).
    """

    async def calculator(expression: str) -> str:
        result = await call_tool("calculator", {"expression": expression})
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.is_error:
            raise ValueError(text)
        return text

    return CalculatorTool(calculator, description=description)


@contextlib.asynccontextmanager
async def calculator_tool(tools: str = "local") -> AsyncIterator[CalculatorTool]:
    """The calculator for one run; with ``"mcp"`` the server process lives exactly as long as the context."""
    if tools == "local":
        yield local_calculator()
        return
    if tools != "mcp":
        raise ValueError(f"tools must be one of {TOOLS}, got {tools!r}")
    from mcp import Client

    async with Client(mcp_server_params()) as client:
        listed = await client.list_tools()
        tool = next((t for t in listed.tools if t.name == "calculator"), None)
        if tool is None:
            raise RuntimeError(f"the MCP server offers no 'calculator' tool (it has {[t.name for t in listed.tools]})")
        yield mcp_calculator(client.call_tool, tool.description or CALCULATOR_DESCRIPTION)


def build_team(
    model_client: OpenAIChatCompletionClient,
    tool: CalculatorTool,
    *,
    max_turns: int = 3,
    max_tool_iterations: int = 2,
    one_shot: bool = False,
) -> RoundRobinGroupChat:
    """The solver and the checker, taking turns until the checker says CORRECT or ``max_turns`` agent turns.

    The solver may call the calculator up to ``max_tool_iterations`` times in a turn, then writes its answer
    from the results (``reflect_on_tool_use``), so every tool result is seen by the model. With ``one_shot`` the
    solver's context starts with `ONE_SHOT`.
    """
    solver = AssistantAgent(
        SOLVER,
        model_client=model_client,
        tools=[tool],
        system_message=SOLVER_SYSTEM,
        reflect_on_tool_use=True,
        max_tool_iterations=max_tool_iterations,
        model_context=UnboundedChatCompletionContext(initial_messages=list(ONE_SHOT)) if one_shot else None,
    )
    checker = AssistantAgent(CHECKER, model_client=model_client, system_message=CHECKER_SYSTEM)
    return RoundRobinGroupChat(
        [solver, checker],
        termination_condition=TextMentionTermination("CORRECT", sources=[CHECKER]),
        max_turns=max_turns,
    )


@dataclass(frozen=True)
class Solution:
    """The team's answer (None if the solver never wrote ``Answer: <number>``) and the chat, as text lines."""

    answer: int | None
    transcript: list[str]
    reply: str | None = None
    """The solver's last message with an ``Answer:`` (whatever follows it: a Calc-X result may be ``2/3``)."""


def final_reply(messages: Sequence[Any]) -> str | None:
    """The solver's last text message that has an ``Answer:``; None when it never gave one."""
    for message in reversed(messages):
        if isinstance(message, TextMessage) and message.source == SOLVER and "answer:" in message.content.lower():
            return message.content
    return None


def final_answer(messages: Sequence[Any]) -> int | None:
    """The number in the solver's last text message that has an ``Answer:``; None when it never gave one."""
    for message in reversed(messages):
        if isinstance(message, TextMessage) and message.source == SOLVER:
            answer = parse_answer(message.content)
            if answer is not None:
                return answer
    return None


async def solve(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    tools: str = "local",
    max_turns: int = 3,
    max_tool_iterations: int = 2,
    one_shot: bool = False,
    **sampling: Any,
) -> Solution:
    """Run the team on one question. ``sampling`` (temperature, max_tokens, ...) goes to every model call."""
    model_client = OpenAIChatCompletionClient(
        model=model, base_url=base_url, api_key=api_key, model_info=MODEL_INFO, max_retries=0, **sampling
    )
    try:
        async with calculator_tool(tools) as tool:
            team = build_team(
                model_client, tool, max_turns=max_turns, max_tool_iterations=max_tool_iterations, one_shot=one_shot
            )
            result: TaskResult = await team.run(task=question)
    finally:
        await model_client.close()
    transcript = [f"{getattr(m, 'source', '?')}: {m.to_text()}" for m in result.messages]
    return Solution(answer=final_answer(result.messages), transcript=transcript, reply=final_reply(result.messages))


if __name__ == "__main__":
    import argparse
    import asyncio

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--tools", choices=TOOLS, default="local")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--one-shot", action="store_true", help="show the solver one worked problem first")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    solution = asyncio.run(
        solve(
            args.question,
            base_url=args.base_url,
            model=args.model,
            api_key=args.api_key,
            tools=args.tools,
            max_turns=args.max_turns,
            one_shot=args.one_shot,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
    )
    print("\n".join(solution.transcript))
    print(f"answer: {solution.answer}")
