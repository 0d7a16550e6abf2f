"""Spider as it is published, and as Agent Lightning's SQL example ships it: one SQLite database per question.

Two layouts of one folder are read (nothing is downloaded; point ``path`` at the unpacked files):

* **Spider 1.0** (Yu et al. 2018, https://yale-lily.github.io/spider)::

      <path>/train_spider.json   [{"db_id", "question", "query", ...}, ...]   (7,000 questions)
      <path>/dev.json            the same fields                               (1,034 questions)
      <path>/tables.json         [{"db_id", "table_names_original", "column_names_original", "column_types", ...}]
      <path>/database/<db_id>/<db_id>.sqlite

* **Agent Lightning's parquet** (``examples/spider/data`` of microsoft/agent-lightning: ``train_spider.parquet``,
  ``test_dev_500.parquet``, ``test_dev.parquet``), columns ``question``, ``query``, ``db_id``, with the same
  ``database/`` folder beside the files. The schema is then read from each SQLite file itself.

A file's layout follows its suffix (``.json`` or ``.parquet``). A task is a JSON-able dict::

    {"question": "How many singers do we have?", "sql": "SELECT count(*) FROM singer",
     "db_id": "concert_singer", "database": "/abs/path/database/concert_singer/concert_singer.sqlite",
     "schema": "singer(Singer_ID, Name, ...)\\nconcert(...)"}

``sql`` is Spider's ``query`` (the gold query: `examples.sql_agent.train` scores by execution match on
``database``, the question's own database); ``schema`` is what the agent's prompts show, one line per table with
its original table and column names. Anything the showcase cannot use is refused in one line that names it: a
missing file, a missing column or field, a ``db_id`` with no database file or no ``tables.json`` entry.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

from examples.sql_agent.database import connect

__all__ = ["load", "schema_of_sqlite", "schema_of_tables_entry", "splits"]

#: The fields of a question the showcase reads (Spider's JSON objects and Agent Lightning's parquet columns alike).
FIELDS = ("question", "query", "db_id")
#: The fields of a ``tables.json`` entry the showcase reads.
TABLE_FIELDS = ("db_id", "table_names_original", "column_names_original")


class SpiderFormatError(ValueError):
    """The files are not in Spider's published layout; the message names the file and the missing piece."""


def schema_of_tables_entry(entry: dict[str, Any]) -> str:
    """One line per table, ``table(column, ...)``, from a ``tables.json`` entry: ``column_names_original`` is a list
    of ``[table index, column name]`` pairs, index -1 being Spider's ``*`` (left out)."""
    columns: list[list[str]] = [[] for _ in entry["table_names_original"]]
    for table, column in entry["column_names_original"]:
        if table >= 0:
            columns[table].append(column)
    return "\n".join(f"{t}({', '.join(c)})" for t, c in zip(entry["table_names_original"], columns, strict=True))


def schema_of_sqlite(path: Path) -> str:
    """The same one line per table, read from the SQLite file (tables in file order, ``sqlite_*`` left out)."""
    conn = connect(path)
    try:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            )
        ]
        lines = []
        for table in tables:
            quoted = '"' + table.replace('"', '""') + '"'
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({quoted})")]
            lines.append(f"{table}({', '.join(columns)})")
    except sqlite3.DatabaseError as exc:
        raise SpiderFormatError(f"{path}: not a readable SQLite database ({exc})") from None
    finally:
        conn.close()
    return "\n".join(lines)


def _rows(file: Path) -> list[dict[str, Any]]:
    if not file.is_file():
        raise SpiderFormatError(f"{file}: no such file")
    if file.suffix == ".json":
        rows = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise SpiderFormatError(f"{file}: expected a JSON list of questions, got {type(rows).__name__}")
        for i, row in enumerate(rows):
            missing = [f for f in FIELDS if f not in row]
            if missing:
                raise SpiderFormatError(f"{file}: question {i} has no field {missing[0]!r}")
        return rows
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq  # the parquet reader; only this layout needs it

        table = pq.read_table(file)
        missing = [f for f in FIELDS if f not in table.column_names]
        if missing:
            raise SpiderFormatError(f"{file}: no column {missing[0]!r} (it has {table.column_names})")
        return table.select(list(FIELDS)).to_pylist()
    raise SpiderFormatError(f"{file}: expected a .json (Spider) or .parquet (Agent Lightning) file")


def _tables(file: Path) -> dict[str, str]:
    """``db_id`` -> schema text, from ``tables.json``."""
    if not file.is_file():
        raise SpiderFormatError(f"{file}: no such file (Spider's JSON layout needs tables.json beside the questions)")
    schemas = {}
    for i, entry in enumerate(json.loads(file.read_text(encoding="utf-8"))):
        missing = [f for f in TABLE_FIELDS if f not in entry]
        if missing:
            raise SpiderFormatError(f"{file}: entry {i} has no field {missing[0]!r}")
        schemas[entry["db_id"]] = schema_of_tables_entry(entry)
    return schemas


def load(path: str | Path, file: str, *, databases: str = "database", tables: str = "tables.json") -> list[dict]:
    """Every question of ``<path>/<file>`` as a task (module docstring), in the file's order. ``databases`` is the
    folder of ``<db_id>/<db_id>.sqlite`` files, ``tables`` the schema file (read for ``.json`` question files
    only), both relative to ``path``. Raises `SpiderFormatError` naming the first thing missing."""
    root = Path(path).expanduser().resolve()
    question_file = root / file
    rows = _rows(question_file)
    schemas = _tables(root / tables) if question_file.suffix == ".json" else None
    sqlite_schemas: dict[str, str] = {}
    tasks = []
    for row in rows:
        db_id = str(row["db_id"])
        database = root / databases / db_id / f"{db_id}.sqlite"
        if not database.is_file():
            raise SpiderFormatError(f"{question_file}: db_id {db_id!r} has no database {database}")
        if schemas is not None:
            if db_id not in schemas:
                raise SpiderFormatError(f"{root / tables}: no entry for db_id {db_id!r}")
            schema = schemas[db_id]
        else:
            if db_id not in sqlite_schemas:
                sqlite_schemas[db_id] = schema_of_sqlite(database)
            schema = sqlite_schemas[db_id]
        tasks.append(
            {"question": str(row["question"]), "sql": str(row["query"]), "db_id": db_id, "database": str(database),
             "schema": schema}
        )  # fmt: skip
    return tasks


def splits(
    path: str,
    train: str = "train_spider.json",
    val: str = "dev.json",
    n_train: int | None = None,
    n_val: int | None = None,
    seed: int = 0,
    databases: str = "database",
    tables: str = "tables.json",
) -> tuple[list[dict], list[dict]]:
    """The ``data:`` function of a config (``data: examples.sql_agent.spider:splits``): training tasks from
    ``<path>/<train>``, held-out tasks from ``<path>/<val>`` (Spider's own split: no database of ``dev.json`` is in
    ``train_spider.json``). ``n_train`` / ``n_val`` keep a sample of that many (drawn with ``seed``; None: all).
    Agent Lightning's parquet: ``train: train_spider.parquet, val: test_dev_500.parquet``."""
    train_tasks, val_tasks = load(path, train, databases=databases, tables=tables), []
    if n_val != 0:
        val_tasks = load(path, val, databases=databases, tables=tables)
    rng = random.Random(seed)
    for tasks, n, name in ((train_tasks, n_train, "train"), (val_tasks, n_val, "val")):
        if n is not None and n > len(tasks):
            raise ValueError(f"n_{name}={n}, but {name} has {len(tasks)} questions")
    train_tasks = rng.sample(train_tasks, n_train) if n_train is not None else train_tasks
    val_tasks = rng.sample(val_tasks, n_val) if n_val else val_tasks
    return train_tasks, val_tasks
