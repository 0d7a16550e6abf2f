"""The Semantic Kernel showcase's arithmetic word problems: the calculator example's generated problems
(`examples.calculator.data.make_splits`, held-out split disjoint by a hash of the question), with how many tool
rounds Semantic Kernel may run for the model copied into every task::

    {"question": "Tom has 12 apples and gets 30 more. ...", "answer": 42, "expression": "12+30", "max_tool_rounds": 2}
"""

from __future__ import annotations

from examples.calculator.calcx import splits as calcx_splits
from examples.calculator.data import make_splits
from examples.sk_agent.prompts import EVALUATE_DESCRIPTION, EXPRESSION_DESCRIPTION, SOLVER_SYSTEM, TOOL


def splits(
    seed: int = 0, n_train: int = 512, n_val: int = 64, *, max_tool_rounds: int = 2, one_shot: bool = False
) -> tuple[list, list]:
    """``n_train`` training and ``n_val`` held-out problems, deterministic for a seed, never overlapping.
    ``max_tool_rounds``: how often Semantic Kernel runs the calculator for the model in one problem; ``one_shot``:
    show the solver one worked problem first (`agent.one_shot_history`)."""
    if max_tool_rounds < 1:
        raise ValueError(f"max_tool_rounds must be at least 1, got {max_tool_rounds}")
    train, val = make_splits(n_train, n_val, seed=seed)
    run = {"max_tool_rounds": max_tool_rounds, "one_shot": one_shot}
    return [{**t, **run} for t in train], [{**t, **run} for t in val]


def calcx(
    path: str,
    train: str = "train.parquet",
    val: str = "test.parquet",
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
    *,
    max_tool_rounds: int = 2,
    one_shot: bool = False,
) -> tuple[list, list]:
    """Calc-X as Agent Lightning ships it (`examples.calculator.calcx`: ``<path>/train.parquet``,
    ``<path>/test.parquet``; ``n_train`` / ``n_val`` a seeded sample), with the run settings of `splits` copied into
    every task. The rollout scores a task's ``result`` with `examples.calculator.calcx.numeric_reward`."""
    if max_tool_rounds < 1:
        raise ValueError(f"max_tool_rounds must be at least 1, got {max_tool_rounds}")
    train_tasks, val_tasks = calcx_splits(path, train, val, n_train, n_val, seed)
    run = {"max_tool_rounds": max_tool_rounds, "one_shot": one_shot}
    return [{**t, **run} for t in train_tasks], [{**t, **run} for t in val_tasks]


def tokenizer_corpus() -> list[str]:
    """Text the tiny model's tokenizer should cover: the instructions, the tool, problems, calls, results, answers."""
    train, _ = make_splits(200, 0, seed=12345)
    lines = [SOLVER_SYSTEM, TOOL, EVALUATE_DESCRIPTION, EXPRESSION_DESCRIPTION, "Error: unsupported expression"]
    for t in train:
        lines += [
            t["question"],
            f'<tool_call>{{"name": "{TOOL}", "arguments": {{"expression": "{t["expression"]}"}}}}</tool_call>',
            f"<tool_response>{t['answer']}</tool_response>",
            f"Answer: {t['answer']}",
        ]
    return lines
