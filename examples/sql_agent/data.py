"""Questions about New York City's 2013 flights, each paired with the gold SQL that answers it.

Questions come from templates filled with values drawn from the database itself (airline and airport names,
months, thresholds), so every question is answerable and its gold SQL is checked by running it: questions whose
answer is empty, NULL or zero, and "which ... the most" questions with a tie for first place, are skipped (an
answer a lazy query could guess, or one that two correct queries would disagree on, teaches nothing).

A task is a JSON-able dict::

    {"question": "How many flights did JetBlue Airways operate from La Guardia in March?",
     "sql": "SELECT COUNT(*) FROM flights f JOIN airlines a ...",
     "answer": [[527]],                     # the gold SQL's rows
     "template": "flights_by_airline_origin_month"}

Splits are disjoint by question: a question's split is decided by a hash of its text, so the held-out set never
shares a question with training, for any seed or size.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from examples.sql_agent.database import QueryError, connect, database_path, run_query, schema_text

__all__ = ["BASIC_TEMPLATES", "TEMPLATES", "TIERS", "Template", "splits", "tokenizer_corpus"]

MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip
ORIGINS = {"EWR": "Newark Liberty Intl", "JFK": "John F Kennedy Intl", "LGA": "La Guardia"}


def _quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Template:
    """One kind of question. ``question`` and ``sql`` are format strings over the values ``draw`` returns
    (string values are quoted in the SQL). An ``argmax`` template's SQL has a ``{select}`` column and ends in
    ``ORDER BY COUNT(*) DESC LIMIT 1``: the generator checks there is no tie for first place."""

    name: str
    question: str
    sql: str
    draw: Callable[[random.Random, dict[str, list]], dict[str, Any]]
    argmax: str | None = None  # the column the question asks for, when it asks "which ... the most"


def _airline(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
    return {"airline": rng.choice(pools["airlines"])}


def _airline_origin_month(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
    return {"airline": rng.choice(pools["airlines"]), "origin": rng.choice(list(ORIGINS.values())),
            "month": rng.randint(1, 12)}  # fmt: skip


def _airline_month(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
    return {"airline": rng.choice(pools["airlines"]), "month": rng.randint(1, 12)}


def _origin_month(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
    return {"origin": rng.choice(list(ORIGINS.values())), "month": rng.randint(1, 12)}


def _origin_dest(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
    return {"origin": rng.choice(list(ORIGINS.values())), "dest": rng.choice(pools["destinations"])}


_F_AIRLINE = "FROM flights f JOIN airlines a ON a.carrier = f.carrier"
TEMPLATES: list[Template] = [
    Template(
        "flights_by_airline_origin_month",
        "How many flights did {airline} operate from {origin} in {month_name}?",
        f"SELECT COUNT(*) {_F_AIRLINE} JOIN airports o ON o.faa = f.origin "
        "WHERE a.name = {airline} AND o.name = {origin} AND f.month = {month}",
        _airline_origin_month,
    ),
    Template(
        "top_manufacturer",
        "Which manufacturer built the most planes flown by {airline}?",
        "SELECT {select} FROM planes p WHERE p.tailnum IN "
        f"(SELECT f.tailnum {_F_AIRLINE} WHERE a.name = {{airline}}) "
        "GROUP BY p.manufacturer ORDER BY COUNT(*) DESC LIMIT 1",
        _airline,
        argmax="p.manufacturer",
    ),
    Template(
        "average_departure_delay",
        "What was the average departure delay in minutes, rounded to one decimal, of flights from {origin} to {dest}?",
        "SELECT ROUND(AVG(f.dep_delay), 1) FROM flights f JOIN airports o ON o.faa = f.origin "
        "JOIN airports d ON d.faa = f.dest WHERE o.name = {origin} AND d.name = {dest}",
        _origin_dest,
    ),
    Template(
        "late_arrivals",
        "How many flights to {dest} in {month_name} arrived more than {minutes} minutes late?",
        "SELECT COUNT(*) FROM flights f JOIN airports d ON d.faa = f.dest "
        "WHERE d.name = {dest} AND f.month = {month} AND f.arr_delay > {minutes}",
        lambda rng, pools: {
            "dest": rng.choice(pools["destinations"]),
            "month": rng.randint(1, 12),
            "minutes": rng.choice([15, 30, 60, 120]),
        },
    ),
    Template(
        "top_destination",
        "Which airport did {airline} fly to most often from {origin}? Give the airport name.",
        f"SELECT {{select}} {_F_AIRLINE} JOIN airports o ON o.faa = f.origin JOIN airports d ON d.faa = f.dest "
        "WHERE a.name = {airline} AND o.name = {origin} GROUP BY d.name ORDER BY COUNT(*) DESC LIMIT 1",
        lambda rng, pools: {"airline": rng.choice(pools["airlines"]), "origin": rng.choice(list(ORIGINS.values()))},
        argmax="d.name",
    ),
    Template(
        "distinct_planes",
        "How many different planes did {airline} fly in {month_name}?",
        f"SELECT COUNT(DISTINCT f.tailnum) {_F_AIRLINE} WHERE a.name = {{airline}} AND f.month = {{month}}",
        _airline_month,
    ),
    Template(
        "highest_wind_speed",
        "What was the highest wind speed recorded at {origin} in {month_name}?",
        "SELECT MAX(w.wind_speed) FROM weather w JOIN airports o ON o.faa = w.origin "
        "WHERE o.name = {origin} AND w.month = {month}",
        _origin_month,
    ),
    Template(
        "flights_on_big_planes",
        "How many flights did {airline} operate with planes that have more than {seats} seats?",
        f"SELECT COUNT(*) {_F_AIRLINE} JOIN planes p ON p.tailnum = f.tailnum "
        "WHERE a.name = {airline} AND p.seats > {seats}",
        lambda rng, pools: {"airline": rng.choice(pools["airlines"]), "seats": rng.choice([50, 100, 150, 200])},
    ),
    Template(
        "total_distance",
        "What was the total distance in miles flown by {airline} in {month_name}?",
        f"SELECT SUM(f.distance) {_F_AIRLINE} WHERE a.name = {{airline}} AND f.month = {{month}}",
        _airline_month,
    ),
    Template(
        "old_planes",
        "How many planes built before {year} did {airline} fly?",
        f"SELECT COUNT(DISTINCT p.tailnum) {_F_AIRLINE} JOIN planes p ON p.tailnum = f.tailnum "
        "WHERE a.name = {airline} AND p.year < {year}",
        lambda rng, pools: {"airline": rng.choice(pools["airlines"]), "year": rng.choice(range(1990, 2011, 5))},
    ),
    Template(
        "busiest_day",
        "On which day of {month_name} did the most flights leave {origin}? Give the day of the month.",
        "SELECT {select} FROM flights f JOIN airports o ON o.faa = f.origin "
        "WHERE o.name = {origin} AND f.month = {month} GROUP BY f.day ORDER BY COUNT(*) DESC LIMIT 1",
        _origin_month,
        argmax="f.day",
    ),
    Template(
        "cold_departures",
        "How many flights left {origin} in {month_name} during an hour when it was colder than {degrees} degrees F?",
        "SELECT COUNT(*) FROM flights f JOIN weather w ON w.origin = f.origin AND w.time_hour = f.time_hour "
        "JOIN airports o ON o.faa = f.origin WHERE o.name = {origin} AND f.month = {month} AND w.temp < {degrees}",
        lambda rng, pools: {
            "origin": rng.choice(list(ORIGINS.values())),
            "month": rng.randint(1, 12),
            "degrees": rng.choice([20, 32, 40, 50, 60]),
        },
    ),
]


def _draw(*keys: str) -> Callable[[random.Random, dict[str, list]], dict[str, Any]]:
    """Values for the basic tier: codes from the pools, a month, a day of the month (1-28)."""

    def draw(rng: random.Random, pools: dict[str, list]) -> dict[str, Any]:
        ranges = {"month": (1, 12), "day": (1, 28)}
        return {k: rng.randint(*ranges[k]) if k in ranges else rng.choice(pools[k + "s"]) for k in keys}

    return draw


def _count(name: str, question: str, *keys: str) -> Template:
    """A basic-tier count: the flights matching ``keys`` (columns of the flights table, ``month`` and ``day``
    included), asked as ``question``."""
    where = " AND ".join(f"{k} = {{{k}}}" for k in keys)
    return Template(name, question, f"SELECT COUNT(*) FROM flights WHERE {where}", _draw(*keys))


BASIC_TEMPLATES: list[Template] = [
    _count("carrier_dest_day", "How many flights did carrier {carrier} fly to {dest} on {month_name} {day}?",
           "carrier", "dest", "month", "day"),
    _count("carrier_dest_month", "How many flights did carrier {carrier} fly to {dest} in {month_name}?",
           "carrier", "dest", "month"),
    _count("carrier_dest", "How many flights did carrier {carrier} fly to {dest}?", "carrier", "dest"),
    _count("origin_dest", "How many flights went from {origin} to {dest}?", "origin", "dest"),
    _count("carrier_origin_month", "How many flights did carrier {carrier} fly from {origin} in {month_name}?",
           "carrier", "origin", "month"),
    _count("origin_day", "How many flights left {origin} on {month_name} {day}?", "origin", "month", "day"),
]  # fmt: skip
"""The ``basic`` tier: counts over the flights table alone, filtered by one to four of carrier, origin, destination
(as the codes the table holds), month and day; no joins. Chosen for a small pretrained model before any training
(SmolLM2-135M matches none of `TEMPLATES`, nor single-table questions that ask for other aggregates or columns than its
worked example shows, at temperature 0 or 0.7: README.md). The first template has the shape of the basic agent's
worked example (`agent.ONE_SHOT_BASIC`), the others drop or swap its filters."""
TIERS = {"full": TEMPLATES, "basic": BASIC_TEMPLATES, "mixed": BASIC_TEMPLATES + TEMPLATES}
"""``mixed``: both tiers' templates taking turns (the SmolLM2 recipe's task set: README.md, "A pretrained model")."""


@cache
def _pools() -> dict[str, list]:
    """Values questions are drawn from: every airline, and the destinations with at least 1,000 flights that the
    airports table knows (a destination missing there would make its name-based question unanswerable); for the
    basic tier, codes: carriers with at least 1,000 flights, the three origins, destinations with at least 2,000."""
    conn = connect(database_path())
    try:
        airlines = [name for (name,) in run_query(conn, "SELECT name FROM airlines ORDER BY carrier")[1]]
        destinations = [
            name
            for (name,) in run_query(
                conn,
                "SELECT d.name FROM flights f JOIN airports d ON d.faa = f.dest GROUP BY d.name "
                "HAVING COUNT(*) >= 1000 ORDER BY COUNT(*) DESC, d.name",
            )[1]
        ]
        carriers = [
            c for (c,) in run_query(conn, "SELECT carrier FROM flights GROUP BY carrier HAVING COUNT(*) >= 1000")[1]
        ]
        dests = [d for (d,) in run_query(conn, "SELECT dest FROM flights GROUP BY dest HAVING COUNT(*) >= 2000")[1]]
    finally:
        conn.close()
    return {
        "airlines": airlines,
        "destinations": destinations,
        "carriers": sorted(carriers),
        "origins": sorted(ORIGINS),
        "dests": sorted(dests),
    }


def _instance(template: Template, values: dict[str, Any]) -> tuple[str, str, str | None]:
    """The question, its gold SQL, and (argmax templates) the SQL of the top two counts."""
    shown = {**values, "month_name": MONTHS[values["month"] - 1]} if "month" in values else values
    sql_values = {k: _quote(v) if isinstance(v, str) else v for k, v in values.items()}
    question = template.question.format(**shown)
    if template.argmax is None:
        return question, template.sql.format(**sql_values), None
    gold = template.sql.format(select=template.argmax, **sql_values)
    top_two = template.sql.format(select="COUNT(*)", **sql_values).replace("LIMIT 1", "LIMIT 2")
    return question, gold, top_two


def _answer(conn, sql: str, top_two: str | None) -> list[list] | None:
    """The gold rows, or None when the question should be skipped (no answer, zero, NULL, a tie)."""
    try:
        rows = run_query(conn, sql, timeout_s=30.0)[1]
        if top_two is not None:
            counts = [count for (count,) in run_query(conn, top_two, timeout_s=30.0)[1]]
            if len(counts) == 2 and counts[0] == counts[1]:
                return None
    except QueryError as exc:  # a gold query must run: a broken template is a bug, not a skipped question
        raise RuntimeError(f"gold SQL failed ({exc}): {sql}") from None
    if not rows or any(v is None or v == 0 for row in rows for v in row):
        return None
    return [list(row) for row in rows]


def split_of(question: str, val_fraction: float = 0.2) -> str:
    """``"train"`` or ``"val"``, from a hash of the question's text (the same for every seed and size)."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "val" if bucket < val_fraction else "train"


def splits(seed: int = 0, n_train: int = 400, n_val: int = 100, tier: str = "full") -> tuple[list[dict], list[dict]]:
    """``n_train`` training and ``n_val`` held-out tasks, deterministic for a seed, no question in both.

    Templates take turns (a seeded shuffle of them per round), so both splits mix all kinds of question; a
    smaller request is a prefix of a larger one with the same seed. Raises ValueError when the templates cannot
    produce that many distinct questions of a split. Each gold query runs once (~10 ms); the splits are cached
    next to the database, keyed by the database, the templates and the arguments. ``tier``: ``full`` (`TEMPLATES`),
    ``basic`` (`BASIC_TEMPLATES`, for small pretrained models) or ``mixed`` (both).
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {sorted(TIERS)}, got {tier!r}")
    if n_train < 0 or n_val < 0:
        raise ValueError(f"n_train and n_val must be >= 0, got {n_train} and {n_val}")
    db = database_path()
    templates = [(t.name, t.question, t.sql, t.argmax) for t in TIERS[tier]]
    key = hashlib.sha256(repr((db.name, templates, seed, n_train, n_val)).encode()).hexdigest()[:16]
    cached = db.parent / f"sql_agent-splits-{key}.json"
    if cached.exists():
        train, val = json.loads(cached.read_text())
        return train, val
    train, val = _generate(db, seed, n_train, n_val, TIERS[tier])
    staging = cached.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps([train, val]))
    os.replace(staging, cached)  # atomic: concurrent writers write identical content
    return train, val


def _generate(
    db: Path, seed: int, n_train: int, n_val: int, templates: list[Template]
) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    pools = _pools()
    seen: set[str] = set()
    out: dict[str, list[dict]] = {"train": [], "val": []}
    want = {"train": n_train, "val": n_val}
    conn = connect(db)
    try:
        misses = 0
        while len(out["train"]) < n_train or len(out["val"]) < n_val:
            order = rng.sample(templates, len(templates))
            for template in order:
                question, sql, top_two = _instance(template, template.draw(rng, pools))
                split = split_of(question)
                if question in seen or len(out[split]) >= want[split]:
                    misses += 1
                    if misses > 20 * (n_train + n_val) + 1000:
                        raise ValueError(f"cannot draw {n_train} + {n_val} distinct questions; ask for fewer")
                    continue
                seen.add(question)
                answer = _answer(conn, sql, top_two)
                if answer is None:
                    continue
                task = {"question": question, "sql": sql, "answer": answer, "template": template.name}
                out[split].append(task)
    finally:
        conn.close()
    return out["train"], out["val"]


def tokenizer_corpus() -> list[str]:
    """Text of this task for the tiny models' tokenizer: the schema, questions with their gold SQL and answers,
    so table names, columns and SQL keywords become single tokens and prompts fit a 512-token context."""
    train, val = splits(seed=0, n_train=300, n_val=0)
    schema = schema_text()
    docs = [schema] * 20
    for task in train:
        answer = ", ".join(str(v) for row in task["answer"] for v in row)
        docs.append(f"{task['question']}\n```sql\n{task['sql']}\n```\n{answer}")
    return docs
