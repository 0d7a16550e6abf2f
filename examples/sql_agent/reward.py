"""Execution match: a predicted query is right when it returns the same rows as the gold query.

Comparing results, not SQL text, accepts every correct query (a join or a carrier code, ``COUNT(*)`` or
``COUNT(f.flight)``, any alias) and nothing else. Rows are compared as a multiset: row order is ignored (no
question asks for an order), duplicates count, column order counts, column names do not. Floats are compared
rounded to 4 decimals, so two correct ways of computing an average (which may differ in the last bit) agree.

SQL that does not run — a syntax error, an unknown column, a write, two statements, more than the time limit —
scores 0, like a query that runs and returns the wrong rows.

`condition_credit` is a denser training reward for small models (the basic tier): execution match, and below it
(for a query that runs) partial credit for the equality conditions of the WHERE clause the query shares with the gold query (the F1 of the two
condition sets, as Spider's component matching scores a WHERE clause, values included), at most ``partial``. A
success is still an execution match (reward 1.0): held-out success is measured with ``success_threshold: 1.0``.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence

from examples.sql_agent.database import QueryError, run_query

__all__ = ["condition_credit", "equality_conditions", "execution_match", "same_rows"]


def _multiset(rows: Iterable[Sequence]) -> Counter:
    # 216 and 216.0 are equal and hash alike in Python, so only floats need rounding
    return Counter(tuple(round(v, 4) if isinstance(v, float) else v for v in row) for row in rows)


def same_rows(predicted: Iterable[Sequence], gold: Iterable[Sequence]) -> bool:
    """True when both results hold the same rows the same number of times, in any order."""
    return _multiset(predicted) == _multiset(gold)


def execution_match(
    conn: sqlite3.Connection, predicted_sql: str | None, gold_sql: str, *, timeout_s: float = 2.0
) -> float:
    """1.0 when ``predicted_sql`` returns the rows ``gold_sql`` returns on ``conn``, else 0.0.

    The predicted query gets ``timeout_s`` (a model can write a cross join of all flights); the gold query is
    trusted and gets 30 s. A gold query that fails raises `QueryError`: that is a broken task, not a score.
    """
    return {True: 1.0, False: 0.0, None: 0.0}[_matches(conn, predicted_sql, gold_sql, timeout_s)]


def _matches(conn: sqlite3.Connection, predicted_sql: str | None, gold_sql: str, timeout_s: float) -> bool | None:
    """Whether ``predicted_sql`` returns the gold rows; None when it does not run (or is empty)."""
    if not predicted_sql or not predicted_sql.strip():
        return None
    try:
        predicted = run_query(conn, predicted_sql, timeout_s=timeout_s)[1]
    except QueryError:
        return None
    gold = run_query(conn, gold_sql, timeout_s=30.0)[1]
    return same_rows(predicted, gold)


_WHERE = re.compile(r"\bWHERE\b(.*?)(?:\bGROUP\s+BY\b|\bORDER\s+BY\b|\bLIMIT\b|\bHAVING\b|$)", re.I | re.S)
_EQUALS = re.compile(r"([A-Za-z_][\w.]*)\s*=\s*('(?:[^']|'')*'|\"[^\"]*\"|-?\d+(?:\.\d+)?)")


def equality_conditions(sql: str | None) -> set[tuple[str, str]]:
    """The ``column = value`` conditions of ``sql``'s first WHERE clause, as (column, value) pairs: the column
    without its table alias and lower-cased, the value unquoted (``'AA'``, ``"AA"`` and ``AA`` alike)."""
    found = _WHERE.search(sql or "")
    if found is None:
        return set()
    return {
        (column.rsplit(".", 1)[-1].lower(), value.strip("'\"").replace("''", "'"))
        for column, value in _EQUALS.findall(found.group(1))
    }


def condition_credit(
    conn: sqlite3.Connection, predicted_sql: str | None, gold_sql: str, *, partial: float = 0.5, timeout_s: float = 2.0
) -> float:
    """1.0 on an execution match; for a query that runs but returns other rows, ``partial`` times the F1 of the
    predicted and gold queries' equality conditions (`equality_conditions`); 0.0 for a query that does not run.
    ``partial`` < 1 keeps every near miss below a success."""
    if not 0.0 <= partial < 1.0:
        raise ValueError(f"partial must be in [0, 1), got {partial}")
    matched = _matches(conn, predicted_sql, gold_sql, timeout_s)
    if matched is None or matched:
        return float(bool(matched))
    predicted, gold = equality_conditions(predicted_sql), equality_conditions(gold_sql)
    shared = len(predicted & gold)
    return partial * 2 * shared / (len(predicted) + len(gold)) if shared else 0.0
