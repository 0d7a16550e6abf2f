"""Small fixtures in the exact layout the benchmark data sets are published in (no network): Spider (JSON files,
``tables.json``, one SQLite database per ``db_id``) and Agent Lightning's Spider parquet, MuSiQue's jsonl and
Agent Lightning's Calc-X parquet. Each writer returns what the tests check the loaders against."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

#: Three Spider databases (names and tables as in Spider 1.0; rows made up). ``concert_singer`` and ``singer``
#: both have a ``singer`` table with different rows: the same gold query answers differently on each.
DATABASES: dict[str, dict[str, tuple[list[tuple[str, str]], list[tuple]]]] = {
    "concert_singer": {
        "stadium": ([("Stadium_ID", "int"), ("Location", "text"), ("Name", "text"), ("Capacity", "int")],
                    [(1, "Raith Rovers", "Stark's Park", 10104), (2, "Ayr United", "Somerset Park", 11998)]),
        "singer": ([("Singer_ID", "int"), ("Name", "text"), ("Country", "text"), ("Age", "int")],
                   [(1, "Joe Sharp", "Netherlands", 52), (2, "Timbaland", "United States", 32),
                    (3, "Justin Brown", "France", 29), (4, "Rose White", "France", 41)]),
    },
    "singer": {
        "singer": ([("Singer_ID", "int"), ("Name", "text"), ("Birth_Year", "real"), ("Citizenship", "text")],
                   [(1, "Liliane Bettencourt", 1944.0, "France"), (2, "Christy Walton", 1948.0, "United States"),
                    (3, "Alice Walton", 1949.0, "United States"), (4, "Iris Fontbona", 1942.0, "Chile"),
                    (5, "Jacqueline Mars", 1940.0, "United States"), (6, "Gina Rinehart", 1953.0, "Australia"),
                    (7, "Susanne Klatten", 1962.0, "Germany")]),
        "song": ([("Song_ID", "int"), ("Title", "text"), ("Singer_ID", "int"), ("Sales", "real")],
                 [(1, "Do They Know It's Christmas", 1, 1094000.0), (2, "F**k It (I Don't Want You Back)", 1, 552407.0)]),
    },
    "pets_1": {
        "Student": ([("StuID", "INTEGER"), ("LName", "VARCHAR(12)"), ("Fname", "VARCHAR(12)"), ("Age", "INTEGER")],
                    [(1001, "Smith", "Linda", 18), (1002, "Kim", "Tracy", 19), (1003, "Jones", "Shiela", 21)]),
        "Pets": ([("PetID", "INTEGER"), ("PetType", "VARCHAR(20)"), ("pet_age", "INTEGER"), ("weight", "REAL")],
                 [(2001, "cat", 3, 12.0), (2002, "dog", 2, 13.4), (2003, "dog", 1, 9.3)]),
    },
}  # fmt: skip

#: (db_id, question, query): training questions (``train_spider.json``) and held-out ones (``dev.json``), databases
#: disjoint as in Spider. The two "singers" questions have the same gold query on two databases.
SPIDER_TRAIN = [
    ("concert_singer", "How many singers do we have?", "SELECT count(*) FROM singer"),
    ("concert_singer", "What is the capacity of Stark's Park?", "SELECT Capacity FROM stadium WHERE Name = \"Stark's Park\""),
    ("singer", "How many singers are there?", "SELECT count(*) FROM singer"),
    ("singer", "List the titles of the songs of Liliane Bettencourt.",
     "SELECT T2.Title FROM singer AS T1 JOIN song AS T2 ON T1.Singer_ID = T2.Singer_ID WHERE T1.Name = 'Liliane Bettencourt'"),
]  # fmt: skip
SPIDER_DEV = [
    ("pets_1", "How many dogs are there?", "SELECT count(*) FROM Pets WHERE PetType = 'dog'"),
    ("pets_1", "What is the average age of the students?", "SELECT avg(Age) FROM Student"),
]


def _tables_entry(db_id: str) -> dict[str, Any]:
    """A ``tables.json`` entry as Spider writes it (``column_names`` lower-cased with spaces, ``*`` first)."""
    tables = DATABASES[db_id]
    columns: list[list[Any]] = [[-1, "*"]]
    types = ["text"]
    for i, (_, (cols, _rows)) in enumerate(tables.items()):
        columns += [[i, name] for name, _ in cols]
        types += ["number" if kind.lower() in ("int", "integer", "real") else "text" for _, kind in cols]
    return {
        "db_id": db_id,
        "table_names_original": list(tables),
        "table_names": [t.lower() for t in tables],
        "column_names_original": columns,
        "column_names": [[t, c.lower().replace("_", " ")] for t, c in columns],
        "column_types": types,
        "primary_keys": [1],
        "foreign_keys": [],
    }


def _question(db_id: str, question: str, query: str) -> dict[str, Any]:
    """A question as ``train_spider.json`` / ``dev.json`` hold it (the parsed ``sql`` reduced to its keys)."""
    return {
        "db_id": db_id, "query": query, "query_toks": query.split(), "query_toks_no_value": query.split(),
        "question": question, "question_toks": question.split(),
        "sql": {"from": {}, "select": [], "where": [], "groupBy": [], "having": [], "orderBy": [], "limit": None,
                "intersect": None, "union": None, "except": None},
    }  # fmt: skip


def write_spider(root: Path) -> Path:
    """Spider 1.0's layout under ``root`` (``train_spider.json``, ``dev.json``, ``tables.json``,
    ``database/<db_id>/<db_id>.sqlite``) and Agent Lightning's parquet beside it (``train_spider.parquet``,
    ``test_dev_500.parquet``: columns ``db_id``, ``query``, ``question``). Returns ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for db_id, tables in DATABASES.items():
        folder = root / "database" / db_id
        folder.mkdir(parents=True)
        conn = sqlite3.connect(folder / f"{db_id}.sqlite")
        for table, (columns, rows) in tables.items():
            conn.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t in columns)})")
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})", rows)
        conn.commit()
        conn.close()
    (root / "tables.json").write_text(json.dumps([_tables_entry(d) for d in DATABASES], indent=2))
    for name, rows in (("train_spider", SPIDER_TRAIN), ("dev", SPIDER_DEV)):
        (root / f"{name}.json").write_text(json.dumps([_question(*r) for r in rows], indent=2))
    for name, rows in (("train_spider", SPIDER_TRAIN), ("test_dev_500", SPIDER_DEV)):
        columns = {"db_id": [r[0] for r in rows], "query": [r[2] for r in rows], "question": [r[1] for r in rows]}
        pq.write_table(pa.table(columns), root / f"{name}.parquet")
    return root
