"""The calculator example's arithmetic word problems, with how each is to be run (where the calculator lives).

The problems come from `examples.calculator.data.make_splits` (generated from a seed, held-out split disjoint by
a hash of the question text); this module only adds the run settings every task carries, so a config picks
them through ``data_args``::

    {"question": "Tom has 12 apples and gets 30 more. ...", "answer": 42, "expression": "12+30",
     "tools": "local", "max_turns": 3, "one_shot": false}
"""

from __future__ import annotations

from examples.calc_agent.agent import CALCULATOR_DESCRIPTION, CHECKER_SYSTEM, SOLVER_SYSTEM, TOOLS
from examples.calculator.calcx import splits as calcx_splits
from examples.calculator.data import make_splits


def splits(
    seed: int = 0,
    n_train: int = 512,
    n_val: int = 64,
    *,
    tools: str = "local",
    max_turns: int = 3,
    one_shot: bool = False,
) -> tuple[list[dict], list[dict]]:
    """``n_train`` training and ``n_val`` held-out problems. The run settings are copied into every task:
    ``tools`` ("local" or "mcp"), ``max_turns`` (agent turns of the solver/checker chat) and ``one_shot`` (show
    the solver a worked problem first)."""
    if tools not in TOOLS:
        raise ValueError(f"tools must be one of {TOOLS}, got {tools!r}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    train, val = make_splits(n_train, n_val, seed=seed)
    run = {"tools": tools, "max_turns": max_turns, "one_shot": one_shot}
    return [{**t, **run} for t in train], [{**t, **run} for t in val]


def calcx(
    path: str,
    train: str = "train.parquet",
    val: str = "test.parquet",
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
    *,
    tools: str = "local",
    max_turns: int = 3,
    one_shot: bool = False,
) -> tuple[list[dict], list[dict]]:
    """Calc-X as Agent Lightning ships it (`examples.calculator.calcx`: ``<path>/train.parquet``,
    ``<path>/test.parquet``; ``n_train`` / ``n_val`` a seeded sample), with the run settings of `splits` copied into
    every task. The rollout scores a task's ``result`` with `examples.calculator.calcx.numeric_reward`."""
    if tools not in TOOLS:
        raise ValueError(f"tools must be one of {TOOLS}, got {tools!r}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    train_tasks, val_tasks = calcx_splits(path, train, val, n_train, n_val, seed)
    run = {"tools": tools, "max_turns": max_turns, "one_shot": one_shot}
    return [{**t, **run} for t in train_tasks], [{**t, **run} for t in val_tasks]


def tokenizer_corpus() -> list[str]:
    """Text the tiny model's tokenizer should cover: prompts, problems, tool calls and results, answers."""
    train, _ = make_splits(200, 0, seed=12345)
    lines = [SOLVER_SYSTEM, CHECKER_SYSTEM, CALCULATOR_DESCRIPTION, "CORRECT", "Error: unsupported expression"]
    for t in train:
        lines += [
            t["question"],
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{t["expression"]}"}}}}</tool_call>',
            f"<tool_response>{t['answer']}</tool_response>",
            f"Answer: {t['answer']}",
        ]
    return lines
