"""Arithmetic word problems with exact answers, generated from a seed (no data set to download).

Each task is ``{"question": str, "answer": int, "expression": str}``. Splits are disjoint by construction: a
problem's split is decided by a hash of its text, so the held-out set never shares a problem with training.
"""

from __future__ import annotations

import hashlib
import random

NAMES = ["Tom", "Ana", "Li", "Sam", "Maya", "Omar", "Zoe", "Ivan", "Nia", "Ben"]
ITEMS = ["apples", "coins", "books", "stamps", "marbles", "cards", "shells", "pens"]

ONE_STEP = [
    ("{n} has {a} {i} and gets {b} more. How many {i} does {n} have now?", "{a}+{b}"),
    ("{n} has {a} {i} and gives away {b}. How many {i} are left?", "{a}-{b}"),
    ("{n} buys {a} boxes with {b} {i} each. How many {i} is that?", "{a}*{b}"),
]
TWO_STEP = [
    ("{n} has {a} {i}, gets {b} more, then gives away {c}. How many {i} now?", "{a}+{b}-{c}"),
    ("{n} has {a} {i}, buys {b} packs of {c} more. How many {i} in total?", "{a}+{b}*{c}"),
    ("{n} had {a} {i}, lost {b}, then found {c}. How many {i} now?", "{a}-{b}+{c}"),
]


def _problem(rng: random.Random) -> dict:
    two_step = rng.random() < 0.5
    text, expr = rng.choice(TWO_STEP if two_step else ONE_STEP)
    a, b, c = rng.randint(10, 99), rng.randint(2, 60), rng.randint(2, 9)
    if "*" in expr:
        b = rng.randint(2, 9)
    if expr == "{a}-{b}":
        a, b = max(a, b), min(a, b)
    values = {"n": rng.choice(NAMES), "i": rng.choice(ITEMS), "a": a, "b": b, "c": c}
    expression = expr.format(**values)
    return {"question": text.format(**values), "answer": int(eval(expression)), "expression": expression}  # noqa: S307 - our own digits and operators


def _split_of(question: str, val_fraction: float) -> str:
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if bucket < val_fraction else "train"


def make_splits(n_train: int, n_val: int, *, seed: int = 0, val_fraction: float = 0.2) -> tuple[list[dict], list[dict]]:
    """``n_train`` training and ``n_val`` held-out problems, deterministic for a seed, never overlapping."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {"train": [], "val": []}
    want = {"train": n_train, "val": n_val}
    while len(splits["train"]) < n_train or len(splits["val"]) < n_val:
        problem = _problem(rng)
        if problem["question"] in seen:
            continue
        seen.add(problem["question"])
        split = _split_of(problem["question"], val_fraction)
        if len(splits[split]) < want[split]:
            splits[split].append(problem)
    return splits["train"], splits["val"]
