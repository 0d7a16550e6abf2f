"""An imperfect scripted teacher: demonstrations for the supervised warm start, wrong often enough that rewards
have something to fix.

Per problem (seeded): with probability ``p_skip_tool`` it skips the tool and answers from "memory" with a slipped
digit; with ``p_bad_expression`` it calls the tool on a wrong expression (last operand dropped, or an operator
flipped) and reports that result; otherwise it calls the tool correctly and reports the result. A model imitating it
learns the format (tool call, then ``Answer: N``) and a share of bad habits; the reward prefers the good ones.
"""

from __future__ import annotations

import json
import random

from examples.calculator.agent import SYSTEM, calculate


def _slip(n: int, rng: random.Random) -> int:
    digits = list(str(abs(n)))
    i = rng.randrange(len(digits))
    digits[i] = str((int(digits[i]) + rng.choice([1, 2, 8, 9])) % 10)
    slipped = int("".join(digits))
    return -slipped if n < 0 else slipped


def _corrupt(expression: str, rng: random.Random) -> str:
    ops = [i for i, c in enumerate(expression) if c in "+-*" and i > 0]
    if len(ops) > 1 and rng.random() < 0.5:
        return expression[: ops[-1]]  # drop the last step
    i = rng.choice(ops)
    return expression[:i] + {"+": "-", "-": "+", "*": "+"}[expression[i]] + expression[i + 1 :]


def demonstration(
    problem: dict, rng: random.Random, *, p_skip_tool: float = 0.25, p_bad_expression: float = 0.2
) -> list[dict]:
    """One conversation (OpenAI messages) solving ``problem`` the way the teacher would."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem["question"]}]
    roll = rng.random()
    if roll < p_skip_tool:
        messages.append({"role": "assistant", "content": f"Answer: {_slip(problem['answer'], rng)}"})
        return messages
    expression = (
        problem["expression"] if roll >= p_skip_tool + p_bad_expression else _corrupt(problem["expression"], rng)
    )
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
    }
    result = calculate(expression)
    messages += [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": result},
        {"role": "assistant", "content": f"Answer: {result}"},
    ]
    return messages


def demonstrations(problems: list[dict], *, seed: int = 0, **rates: float) -> list[list[dict]]:
    rng = random.Random(seed)
    return [demonstration(p, rng, **rates) for p in problems]
