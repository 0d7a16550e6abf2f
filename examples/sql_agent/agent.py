"""A text-to-SQL agent in LangGraph: write a query, run it, check it, rewrite it until the checker is satisfied.

Nothing here knows about lightrail: the agent takes the base URL, model name, API key and sampling settings of
any OpenAI-compatible server, like any LangGraph app pointed at a new endpoint::

    python -m examples.sql_agent.agent --base-url http://127.0.0.1:8000/v1 --model tiny
    python -m examples.sql_agent.agent --base-url ... --model ... "How many flights did Envoy Air operate ...?"

The graph (three LLM nodes, one tool node)::

    write_query ─► execute_query ─► check_query ─┬─► END   (the checker says CORRECT, or max_turns queries)
                        ▲                        │
                        └──── rewrite_query ◄────┘

Every prompt shows the schema. The agent survives any model output: a reply without SQL is run as it is and
fails like any invalid SQL, the error goes to the checker and the rewriter, and the loop ends after
``max_turns`` queries. Text that comes from the model (its SQL, the rows and errors that SQL produced, the
checker's words) is shown clipped to ``clip`` characters, runs of non-ASCII characters as one ``?`` (the
database is ASCII; a small model's byte soup would cost a token per byte), so a rambling model cannot flood
the next prompt. A request the server still rejects as longer than the model's context gets an empty reply,
as from a model that said nothing: the query fails and scores 0, the rollout goes on.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any, TypedDict

from langchain_core.example_selectors import BaseExampleSelector

from examples.sql_agent.database import QueryError, connect, database_path, run_query, schema_text

__all__ = ["ONE_SHOT", "ONE_SHOT_BASIC", "MaskedQuestionSelector", "SQLState", "answer", "build_graph", "extract_sql"]

WRITE = (
    "You write one SQLite query that answers the question. Tables:\n{schema}\nReply with the query in a ```sql block."
)
CHECK = (
    "You check SQLite queries. Tables:\n{schema}\n"
    "Reply CORRECT if the query and its result answer the question; otherwise say what is wrong in one sentence."
)
REWRITE = "You fix SQLite queries. Tables:\n{schema}\nReply with one corrected query in a ```sql block."

#: One worked example for the writer and the rewriter, for small models that need the answer format shown once
#: (SmolLM2-135M answers in prose without it). No template asks about a single day's flights, so it gives no task away.
ONE_SHOT: list[tuple[str, str]] = [
    (
        "How many flights left John F Kennedy Intl on January 1?",
        "SELECT COUNT(*) FROM flights f JOIN airports o ON o.faa = f.origin "
        "WHERE o.name = 'John F Kennedy Intl' AND f.month = 1 AND f.day = 1",
    )
]

#: The worked example of the basic tier (`data.BASIC_TEMPLATES`: counts over the flights table filtered by codes,
#: months and days): one shape of that tier, its values those of no held-out question.
ONE_SHOT_BASIC: list[tuple[str, str]] = [
    (
        "How many flights did carrier AA fly to ORD on June 15?",
        "SELECT COUNT(*) FROM flights WHERE carrier = 'AA' AND dest = 'ORD' AND month = 6 AND day = 15",
    )
]

_WORD = re.compile(r"[A-Za-z0-9']+")
_NOT_ASCII = re.compile(r"[^\x20-\x7e\n]+")
_FENCE = re.compile(r"```(?:sql)?\s*(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_START = re.compile(r"\b(SELECT|WITH)\b", re.IGNORECASE)
_ACCEPTS = re.compile(r"[\W_]*correct\b", re.IGNORECASE)  # "CORRECT", "**Correct.**"; not "incorrect"


def _masked_terms(question: str) -> set[str]:
    """The words and word pairs of a question with its values masked: every word after the first that starts with a
    capital letter or a digit (names, codes, months, numbers) becomes ``_``, a run of them one ``_``."""
    words: list[str] = []
    for i, word in enumerate(_WORD.findall(question)):
        masked = "_" if i and (word[0].isupper() or word[0].isdigit()) else word.lower()
        if not (masked == "_" and words and words[-1] == "_"):
            words.append(masked)
    return set(words) | {f"{a} {b}" for a, b in zip(words, words[1:], strict=False)}


class MaskedQuestionSelector(BaseExampleSelector):
    """Dynamic few-shot examples for the writer and the rewriter: the ``k`` (question, SQL) pairs of a pool whose
    questions are most like the asked one once names, codes and numbers are masked (the masked question similarity
    of DAIL-SQL, Gao et al. 2023), never the asked question itself. A LangChain example selector
    (``select_examples({"question": ...})`` returns ``{"question", "sql"}`` dicts; `build_graph` takes one as
    ``examples``). Ties go to the earlier example of the pool."""

    def __init__(self, examples: Sequence[dict[str, str]] = (), k: int = 1) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k = k
        self.examples: list[dict[str, str]] = []
        self._terms: list[set[str]] = []
        for example in examples:
            self.add_example(example)

    def add_example(self, example: dict[str, str]) -> None:
        self.examples.append({"question": example["question"], "sql": example["sql"]})
        self._terms.append(_masked_terms(example["question"]))

    def select_examples(self, input_variables: dict[str, str]) -> list[dict[str, str]]:
        question = input_variables["question"]
        terms = _masked_terms(question)
        similarity = {
            i: len(terms & other) / len(terms | other)
            for i, (example, other) in enumerate(zip(self.examples, self._terms, strict=True))
            if example["question"] != question
        }
        ranked = sorted(similarity, key=lambda i: -similarity[i])  # a stable sort: ties keep the pool's order
        return [self.examples[i] for i in ranked[: self.k]]


class SQLState(TypedDict, total=False):
    """The graph's state. ``sql`` and ``result`` always describe the latest query."""

    question: str
    sql: str
    result: str
    """The query's rows as text, or ``Error: ...``."""
    ran: bool
    """The latest query ran without error."""
    feedback: str
    correct: bool
    """The checker accepted the latest query (never when it failed to run)."""
    turns: int
    """Queries written so far (by write_query and rewrite_query)."""


def extract_sql(text: str | None) -> str:
    """The query in a model reply: the first fenced block if there is one, else the text from the first
    ``SELECT``/``WITH`` on, else the whole reply (which will then fail to run, as it should)."""
    text = text or ""
    fenced = _FENCE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start = _START.search(text)
    return (text[start.start() :] if start else text).strip()


def _shown(text: str, limit: int) -> str:
    """Model-made text as a prompt shows it: non-ASCII runs as ``?``, at most ``limit`` characters."""
    text = _NOT_ASCII.sub("?", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _overflowed(exc: Exception) -> bool:
    """The server refused the request as longer than the model's context (LangChain classifies the usual
    messages; an OpenAI-style error body says it with ``code``)."""
    from langchain_core.exceptions import ContextOverflowError

    return isinstance(exc, ContextOverflowError) or getattr(exc, "code", None) == "context_length_exceeded"


def _rows_text(columns: list[str], rows: list[tuple], shown: int = 5) -> str:
    lines = [", ".join(columns)] + [", ".join(str(v) for v in row) for row in rows[:shown]]
    if len(rows) > shown:
        lines.append(f"... ({len(rows)} rows)")
    return "\n".join(lines) if rows else f"{', '.join(columns)}\n(no rows)"


def build_graph(
    llm: Any,
    conn: sqlite3.Connection,
    *,
    max_turns: int = 3,
    clip: int = 300,
    examples: Sequence[tuple[str, str]] | BaseExampleSelector = (),
    checker: Any = None,
    schema: str | None = None,
) -> Any:
    """The compiled LangGraph app. ``llm`` (a LangChain chat model) writes and rewrites queries, ``checker``
    (default: the same model) judges them; ``conn`` is a read-only connection to the flights database;
    ``clip`` bounds each piece of model-made text a prompt shows (the result and the checker's words get
    two thirds of it); ``examples`` (question, SQL) pairs, e.g. `ONE_SHOT`, are shown to the writer and the
    rewriter as earlier turns of their conversations, or an example selector (e.g. `MaskedQuestionSelector`) picks
    them for each question; ``schema`` is the schema the prompts show (default: the flights database's,
    `database.schema_text`; a Spider task carries its own database's)."""
    import openai
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langgraph.graph import END, START, StateGraph

    if max_turns < 1 or clip < 10:
        raise ValueError(f"need max_turns >= 1 and clip >= 10, got {max_turns} and {clip}")
    schema = schema or schema_text()
    checker = checker or llm
    short = clip * 2 // 3

    def worked(question: str) -> list[Any]:
        pairs = (
            [(e["question"], e["sql"]) for e in examples.select_examples({"question": question})]
            if isinstance(examples, BaseExampleSelector)
            else examples
        )
        return [m for q, sql in pairs for m in (HumanMessage(f"Question: {q}"), AIMessage(f"```sql\n{sql}\n```"))]

    def ask(model: Any, system: str, user: str, earlier: Sequence[Any] = ()) -> str:
        try:
            reply = model.invoke([SystemMessage(system.format(schema=schema)), *earlier, HumanMessage(user)])
        except openai.BadRequestError as exc:
            if _overflowed(exc):
                return ""
            raise
        return reply.content if isinstance(reply.content, str) else str(reply.content)

    def write_query(state: SQLState) -> SQLState:
        reply = ask(llm, WRITE, f"Question: {state['question']}", worked(state["question"]))
        return {"sql": extract_sql(reply), "turns": state.get("turns", 0) + 1}

    def execute_query(state: SQLState) -> SQLState:
        sql = state["sql"]
        if not sql:
            return {"result": "Error: the reply had no SQL query", "ran": False}
        try:
            columns, rows = run_query(conn, sql)
        except QueryError as exc:
            return {"result": _shown(f"Error: {exc}", short), "ran": False}
        return {"result": _shown(_rows_text(columns, rows), short), "ran": True}

    def check_query(state: SQLState) -> SQLState:
        user = f"Question: {state['question']}\nQuery: {_shown(state['sql'], clip)}\nResult: {state['result']}"
        reply = ask(checker, CHECK, user).strip()
        correct = state["ran"] and _ACCEPTS.match(reply) is not None
        return {"correct": correct, "feedback": "" if correct else _shown(reply, short)}

    def rewrite_query(state: SQLState) -> SQLState:
        user = (
            f"Question: {state['question']}\nQuery: {_shown(state['sql'], clip)}\nResult: {state['result']}\n"
            f"Checker: {state['feedback']}"
        )
        reply = ask(llm, REWRITE, user, worked(state["question"]))
        return {"sql": extract_sql(reply), "turns": state["turns"] + 1}

    def after_check(state: SQLState) -> str:
        return END if state["correct"] or state["turns"] >= max_turns else "rewrite_query"

    graph = StateGraph(SQLState)
    graph.add_node("write_query", write_query)
    graph.add_node("execute_query", execute_query)
    graph.add_node("check_query", check_query)
    graph.add_node("rewrite_query", rewrite_query)
    graph.add_edge(START, "write_query")
    graph.add_edge("write_query", "execute_query")
    graph.add_edge("execute_query", "check_query")
    graph.add_conditional_edges("check_query", after_check, ["rewrite_query", END])
    graph.add_edge("rewrite_query", "execute_query")
    return graph.compile()


def answer(
    question: str,
    *,
    base_url: str,
    model: str,
    api_key: str = "none",
    max_turns: int = 3,
    clip: int = 300,
    examples: Sequence[tuple[str, str]] | BaseExampleSelector = (),
    conn: sqlite3.Connection | None = None,
    schema: str | None = None,
    **sampling: Any,
) -> SQLState:
    """Run the agent on one question; returns the final state (``sql`` is the query it settled on).

    ``sampling`` (``temperature``, ``max_tokens``, ``top_p``, ...) goes to every call. ``conn`` defaults to a
    new read-only connection to the cached flights database; a Spider question (`examples.sql_agent.spider`) passes
    a connection to its own database and that database's ``schema``."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, max_retries=0, **sampling)
    own = conn is None
    conn = conn or connect(database_path())
    try:
        app = build_graph(llm, conn, max_turns=max_turns, clip=clip, examples=examples, schema=schema)
        # each turn is 3 graph steps; the limit only guards against a routing bug
        return app.invoke({"question": question, "turns": 0}, {"recursion_limit": 3 * max_turns + 5})
    finally:
        if own:
            conn.close()


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", help="default: the first held-out task, scored against its gold SQL")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--one-shot", action="store_true", help="show one worked example (small models)")
    args = parser.parse_args()
    task = None
    if args.question is None:
        from examples.sql_agent.data import splits

        task = splits(n_train=0, n_val=1)[1][0]
    state = answer(
        args.question or task["question"], base_url=args.base_url, model=args.model, api_key=args.api_key,
        max_turns=args.max_turns, examples=ONE_SHOT if args.one_shot else (), temperature=args.temperature,
        max_tokens=args.max_tokens,
    )  # fmt: skip
    print(json.dumps(state, indent=2))
    if task is not None:
        from examples.sql_agent.reward import execution_match

        conn = connect(database_path())
        print(f"gold: {task['sql']}\nexecution match: {execution_match(conn, state.get('sql'), task['sql'])}")
