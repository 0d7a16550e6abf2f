"""The SQL agent's imperfect teacher, a program: it plays the model of the LangGraph app's three nodes.

As the writer it answers with the task's gold query, but not always: on two question shapes it has a habit
(``SYSTEMATIC``: counting flights rather than planes on "how many different planes", ``>=`` for "more than ...
minutes late"), followed 70 % of the time, and 15 % of the time it slips a month (the next one) wherever the
question names one. As the checker it replies ``CORRECT``; as the rewriter (reached only when a query fails,
which the teacher's never do) it answers with the gold query. A student that imitates every chat inherits the
habits and the slips; the rewards then tell GRPO which queries were wrong.

``sft.teacher: {script: examples.sql_agent.teacher:teacher}`` in a config distils a student from it: SFT runs the
LangGraph app with this teacher as its model, through the runners and the gateway.
"""

from __future__ import annotations

import random
import re
from typing import Any

from examples.sql_agent.agent import CHECK, REWRITE, WRITE
from lightrail.gateway.fake import ScriptedBackend

__all__ = ["SYSTEMATIC", "teacher", "teacher_query"]

#: template -> (the gold query's text, the teacher's habit in its place)
SYSTEMATIC: dict[str, tuple[str, str]] = {
    "distinct_planes": ("COUNT(DISTINCT f.tailnum)", "COUNT(*)"),
    "late_arrivals": ("f.arr_delay >", "f.arr_delay >="),
}
_MONTH = re.compile(r"\b(f|w)\.month = (\d+)")
_QUESTION = re.compile(r"^Question: (.*?)(?:\nQuery: |\Z)", re.DOTALL)


def teacher_query(task: dict, rng: random.Random, *, habit: float = 0.7, slip: float = 0.15) -> str:
    """The query the teacher writes for ``task``: the gold one, with its habit (probability ``habit``) on the
    `SYSTEMATIC` shapes and the next month instead of the asked one with probability ``slip``."""
    sql = task["sql"]
    if task["template"] in SYSTEMATIC and rng.random() < habit:
        right, wrong = SYSTEMATIC[task["template"]]
        sql = sql.replace(right, wrong)
    if _MONTH.search(sql) and rng.random() < slip:
        sql = _MONTH.sub(lambda m: f"{m.group(1)}.month = {int(m.group(2)) % 12 + 1}", sql)
    return sql


def teacher(tasks: list[dict], *, seed: int = 0, **rates: float) -> ScriptedBackend:
    """A gateway backend (model name ``teacher``) answering the SQL agent's calls on ``tasks`` as the imperfect
    teacher (``rates``: ``habit``, ``slip``; see `teacher_query`). The k-th time a question is asked the teacher
    draws from its own seeded RNG, so a run is reproducible. Questions it was not given get ``SELECT 0``."""
    by_question = {t["question"]: t for t in tasks}
    asked: dict[str, int] = {}
    check, write, rewrite = (prompt.split("Tables:")[0] for prompt in (CHECK, WRITE, REWRITE))

    def script(request: Any) -> str:
        messages = request.messages
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        if system.startswith(check):
            return "CORRECT"
        user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
        found = _QUESTION.match(user)
        task = by_question.get(found.group(1)) if found else None
        if task is None:
            return "```sql\nSELECT 0\n```"
        if system.startswith(rewrite) or not system.startswith(write):
            return f"```sql\n{task['sql']}\n```"
        question = task["question"]
        k = asked[question] = asked.get(question, 0) + 1
        return f"```sql\n{teacher_query(task, random.Random(f'{seed}:{question}:{k}'), **rates)}\n```"

    return ScriptedBackend(script, model="teacher")
