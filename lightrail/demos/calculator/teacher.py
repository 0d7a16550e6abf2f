"""An imperfect scripted teacher: demonstrations for the supervised warm start, wrong often enough, and
*systematically* enough, that the warm-started model inherits habits only rewards can fix.

Per problem (seeded): with probability ``p_skip_tool`` the teacher skips the tool and answers from "memory" with a
slipped digit. Otherwise it calls the tool, on a wrong expression with a probability that depends on the problem's
shape: most "gets more, then gives away" problems lose their last step, most "lost, then found" problems get the
last operator flipped (``SYSTEMATIC``), other shapes slip now and then (``p_bad_expression``). A model imitating it
picks up the majority habit per shape, so even its greedy answers are wrong on those shapes; sampling still finds
the right expression sometimes, and the reward makes that the habit.
"""

from __future__ import annotations

import json
import random
import re

from lightrail.demos.calculator.agent import SYSTEM, calculate


def _slip(n: int, rng: random.Random) -> int:
    digits = list(str(abs(n)))
    i = rng.randrange(len(digits))
    digits[i] = str((int(digits[i]) + rng.choice([1, 2, 8, 9])) % 10)
    slipped = int("".join(digits))
    return -slipped if n < 0 else slipped


#: Error rate of the teacher's tool calls by expression shape (numbers replaced by ``n``).
SYSTEMATIC = {"n+n-n": 0.7, "n-n+n": 0.7}


def shape(expression: str) -> str:
    """``"84+5-6"`` -> ``"n+n-n"``."""
    return re.sub(r"\d+", "n", expression)


def _corrupt(expression: str, rng: random.Random) -> str:
    """The teacher's mistakes: drop the last step of a two-step sum, flip the last operator otherwise."""
    ops = [i for i, c in enumerate(expression) if c in "+-*" and i > 0]
    if shape(expression) == "n+n-n":
        return expression[: ops[-1]]
    i = ops[-1]
    return expression[:i] + {"+": "-", "-": "+", "*": "+"}[expression[i]] + expression[i + 1 :]


def demonstration(
    problem: dict, rng: random.Random, *, p_skip_tool: float = 0.15, p_bad_expression: float = 0.1
) -> list[dict]:
    """One conversation (OpenAI messages) solving ``problem`` the way the teacher would."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem["question"]}]
    if rng.random() < p_skip_tool:
        messages.append({"role": "assistant", "content": f"Answer: {_slip(problem['answer'], rng)}"})
        return messages
    p_bad = SYSTEMATIC.get(shape(problem["expression"]), p_bad_expression)
    expression = _corrupt(problem["expression"], rng) if rng.random() < p_bad else problem["expression"]
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
