"""Calc-X as Agent Lightning ships it (``examples/calc_x/data`` of microsoft/agent-lightning: ``train.parquet``, 8,192
problems; ``test.parquet``, 500; ``test_mini.parquet``, 20), read for the calculator showcases (`examples.calc_agent`,
`examples.sk_agent`). Nothing is downloaded; point ``path`` at the unpacked folder. Columns (Kadlčík et al. 2023's
Calc-X collection: ape210k, aqua_rat, gsm8k, math_qa, mawps, svamp problems)::

    id        "ape210k__00384263"
    question  "6.6 minus x (3/2) times equals 5.6."
    chain     the worked solution with its calculator calls (not read)
    result    "2/3"              a number, a fraction, or an option letter ("C") for multiple-choice problems
    source    "calc"

A task keeps what the showcases read: ``{"question", "result", "id"}``. The reward (`numeric_reward`) is Agent
Lightning's (``scalar_are_results_same`` with ``rel_tol=1e-2`` in its ``eval_utils.py``, from Calc-X's own
metrics): the text of the reply's last ``Answer:`` line against ``result``: equal strings, the same option letter,
or numbers within 1 % of each other. A missing file or column is refused in one line naming it.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re
import string
from pathlib import Path
from typing import Any

__all__ = ["COLUMNS", "CalcXFormatError", "answer_text", "load", "numeric_reward", "same_result", "splits", "value"]

#: The columns the showcases read.
COLUMNS = ("id", "question", "result")
REL_TOL = 1e-2

_ANSWER = re.compile(r"answer:", re.IGNORECASE)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}  # fmt: skip


class CalcXFormatError(ValueError):
    """The file is not Calc-X's parquet; the message names the file and the missing column."""


def load(file: str | Path) -> list[dict[str, Any]]:
    """Every problem of a Calc-X parquet file as ``{"id", "question", "result"}`` (strings), in file order."""
    file = Path(file).expanduser().resolve()
    if not file.is_file():
        raise CalcXFormatError(f"{file}: no such file")
    import pyarrow.parquet as pq

    table = pq.read_table(file)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise CalcXFormatError(f"{file}: no column {missing[0]!r} (it has {table.column_names})")
    return [{k: str(v) for k, v in row.items()} for row in table.select(list(COLUMNS)).to_pylist()]


def splits(
    path: str,
    train: str = "train.parquet",
    val: str = "test.parquet",
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
) -> tuple[list[dict], list[dict]]:
    """Training problems from ``<path>/<train>``, held-out ones from ``<path>/<val>`` (Agent Lightning's split);
    ``n_train`` / ``n_val`` keep a sample of that many, drawn with ``seed`` (None: all)."""
    root = Path(path).expanduser()
    rng = random.Random(seed)
    out = []
    for file, n, name in ((train, n_train, "train"), (val, n_val, "val")):
        if n == 0:
            out.append([])
            continue
        problems = load(root / file)
        if n is not None and n > len(problems):
            raise ValueError(f"n_{name}={n}, but {name} has {len(problems)} problems")
        out.append(rng.sample(problems, n) if n is not None else problems)
    return out[0], out[1]


def answer_text(reply: str | None) -> str | None:
    """The text after the reply's last ``Answer:`` to the end of its line (None: no ``Answer:``)."""
    matches = list(_ANSWER.finditer(reply or ""))
    if not matches:
        return None
    return reply[matches[-1].end() :].split("\n", 1)[0].strip()  # type: ignore[index]


def value(text: str) -> float:
    """A number written as Calc-X writes results: ``42``, ``-3.5``, ``2/3``, ``(3/2)*4``, ``"3/2 = around 1.5"``
    (the part before `` = around ``). Evaluated safely (numbers and ``+ - * / **`` only), where Agent Lightning's
    ``float_eval`` uses sympy's ``parse_expr`` (which evaluates Python: not for model-written text); what it
    accepts beyond these (names, functions) is refused here too, as it cannot be a number. Raises ValueError."""
    text = text.split(" = around ")[0].strip()

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(ev(node.right)) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not a number: {text!r}")

    try:
        number = ev(ast.parse(text, mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError, RecursionError) as exc:
        raise ValueError(f"not a number: {text!r} ({exc})") from None
    return number


def _option(text: str) -> str:
    return re.sub(r"(\s+|\(|\))", "", text)


def same_result(predicted: str | None, result: str, rel_tol: float = REL_TOL) -> bool:
    """Agent Lightning's ``scalar_are_results_same``: equal once stripped; for an option-letter ``result``, the same
    letter (spaces and parentheses ignored); else both numbers (`value`) within ``rel_tol`` of each other."""
    if predicted is None:
        return False
    if predicted.strip() == result.strip():
        return True
    if _option(result) in string.ascii_letters and len(_option(result)) == 1:
        return _option(predicted) == _option(result)
    try:
        return math.isclose(value(predicted), value(result), rel_tol=rel_tol)
    except ValueError:
        return False


def numeric_reward(reply: str | None, result: str) -> float:
    """1.0 when the reply's last ``Answer:`` (`answer_text`) is ``result`` (`same_result`), else 0.0."""
    return 1.0 if same_result(answer_text(reply), result) else 0.0
