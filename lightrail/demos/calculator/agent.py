"""A calculator agent in plain Python: the `openai` client and one tool. Nothing in it knows about lightrail;
it only takes the base URL (and model name) it should talk to, like any agent pointed at a new endpoint.

    python -m lightrail.demos.calculator.agent --base-url http://127.0.0.1:8000/v1 --model tiny "Tom has 3 apples ..."
"""

from __future__ import annotations

import ast
import json
import operator
import re
import warnings
from collections.abc import Callable

from openai import OpenAI

SYSTEM = "Solve the problem. Use the calculator tool for arithmetic, then reply with 'Answer: <number>'."

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

#: One worked example (a real conversation with one tool call) for models that need to be shown the format once.
ONE_SHOT: list[dict] = [
    {"role": "user", "content": "Ana has 12 pens and buys 30 more. How many pens does Ana have now?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "12+30"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    {"role": "assistant", "content": "Answer: 42"},
]

_OPS: dict[type, Callable[..., int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    """Evaluate ``+ - *`` arithmetic safely; errors come back as text, as a real tool would report them."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    try:
        with warnings.catch_warnings():  # model-written text like "84x" makes the parser warn before it fails
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression, mode="eval")
        return str(ev(tree.body))
    except (SyntaxError, ValueError, TypeError, RecursionError) as exc:
        return f"Error: {exc}"


def parse_answer(text: str | None) -> int | None:
    match = re.search(r"Answer:\s*(-?\d+)", text or "")
    return int(match.group(1)) if match else None


def solve(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    max_turns: int = 3,
    examples: list[dict] | None = None,
    **sampling,
) -> int | None:
    """Run the agent on one question; returns the number it answered, or None if it never answered.
    ``examples`` (e.g. `ONE_SHOT`) go between the system prompt and the question."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        *(examples or []),
        {"role": "user", "content": question},
    ]
    for _ in range(max_turns):
        response = client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR], **sampling)
        message = response.choices[0].message
        if not message.tool_calls:
            return parse_answer(message.content)
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = calculate(expression) if expression else "Error: missing 'expression' argument"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    print(solve(args.question, base_url=args.base_url, model=args.model))
