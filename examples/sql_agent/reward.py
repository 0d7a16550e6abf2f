"""Execution match: a predicted query is right when it returns the same rows as the gold query.

Comparing results, not SQL text, accepts every correct query (a join or a carrier code, ``COUNT(*)`` or
``COUNT(f.flight)``, any alias) and nothing else. Rows are compared as a multiset: row order is ignored (no
question asks for an order), duplicates count, column order counts, column names do not. Floats are compared
rounded to 4 decimals, so two correct ways of computing an average (which may differ in the last bit) agree.

SQL that does not run — a syntax error, an unknown column, a write, two statements, more than the time limit —
scores 0, like a query that runs and returns the wrong rows.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence

from examples.sql_agent.database import QueryError, run_query

__all__ = ["execution_match", "same_rows"]


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
    if not predicted_sql or not predicted_sql.strip():
        return 0.0
    try:
        predicted = run_query(conn, predicted_sql, timeout_s=timeout_s)[1]
    except QueryError:
        return 0.0
    gold = run_query(conn, gold_sql, timeout_s=30.0)[1]
    return 1.0 if same_rows(predicted, gold) else 0.0
