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


def _paragraph(idx: int, title: str, text: str, supporting: bool = False) -> dict[str, Any]:
    return {"idx": idx, "title": title, "paragraph_text": text, "is_supporting": supporting}


#: MuSiQue records (fields and nesting as in musique_ans_v1.0_*.jsonl; facts made up where they are not real).
#: Paragraphs are listed out of ``idx`` order, as a loader must not rely on the order; the Hamlet paragraph is
#: shared by two questions (it is indexed once when pooled).
HAMLET = _paragraph(0, "Hamlet (1948 film)", "Hamlet is a 1948 British film adaptation of William Shakespeare's play, "
                    "adapted and directed by and starring Laurence Olivier.", True)  # fmt: skip
MUSIQUE_TRAIN = [
    {
        "id": "2hop__1001_2002",
        "paragraphs": [
            _paragraph(2, "Dorking", "Dorking is a market town in Surrey in South East England."),
            _paragraph(1, "Laurence Olivier", "Laurence Kerr Olivier was born in Dorking, Surrey, on 22 May 1907.", True),
            HAMLET,
            _paragraph(3, "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
        ],
        "question": "Where was the director of the 1948 film Hamlet born?",
        "question_decomposition": [
            {"id": 1001, "question": "Who directed the 1948 film Hamlet?", "answer": "Laurence Olivier",
             "paragraph_support_idx": 0},
            {"id": 2002, "question": "Where was #1 born?", "answer": "Dorking", "paragraph_support_idx": 1},
        ],
        "answer": "Dorking",
        "answer_aliases": ["Dorking, Surrey"],
        "answerable": True,
    },
    {
        "id": "3hop1__1001_3003_4004",
        "paragraphs": [
            HAMLET,
            _paragraph(1, "Olivier Theatre", "The Olivier Theatre, named after Laurence Olivier, is the largest "
                       "stage of the Royal National Theatre in London.", True),
            _paragraph(2, "Royal National Theatre", "The Royal National Theatre stands on the South Bank of the "
                       "River Thames.", True),
            _paragraph(3, "Thames", "The River Thames flows through southern England."),
        ],
        "question": "On the bank of which river stands the theatre whose largest stage is named after the director "
        "of the 1948 Hamlet?",
        "question_decomposition": [
            {"id": 1001, "question": "Who directed the 1948 film Hamlet?", "answer": "Laurence Olivier",
             "paragraph_support_idx": 0},
            {"id": 3003, "question": "The largest stage of which theatre is named after #1?",
             "answer": "Royal National Theatre", "paragraph_support_idx": 1},
            {"id": 4004, "question": "On which river's bank does #2 stand?", "answer": "River Thames",
             "paragraph_support_idx": 2},
        ],
        "answer": "River Thames",
        "answer_aliases": ["Thames", "the Thames"],
        "answerable": True,
    },
]  # fmt: skip
MUSIQUE_DEV = [
    {
        "id": "2hop__5005_6006",
        "paragraphs": [
            _paragraph(0, "Kathmandu", "Kathmandu is the capital of Nepal.", True),
            _paragraph(1, "Nepalese rupee", "The Nepalese rupee is the official currency of Nepal.", True),
            _paragraph(2, "Lima", "Lima is the capital of Peru."),
        ],
        "question": "What is the currency of the country whose capital is Kathmandu?",
        "question_decomposition": [
            {"id": 5005, "question": "Kathmandu is the capital of which country?", "answer": "Nepal",
             "paragraph_support_idx": 0},
            {"id": 6006, "question": "What is the currency of #1?", "answer": "Nepalese rupee",
             "paragraph_support_idx": 1},
        ],
        "answer": "Nepalese rupee",
        "answer_aliases": ["NPR", "rupee"],
        "answerable": True,
    },
    {  # as the musique_full files hold it: not answerable from its paragraphs, left out
        "id": "2hop__7007_8008",
        "paragraphs": [_paragraph(0, "Lima", "Lima is the capital of Peru.")],
        "question": "What is the currency of the country whose capital is Thimphu?",
        "question_decomposition": [
            {"id": 7007, "question": "Thimphu is the capital of which country?", "answer": "Bhutan",
             "paragraph_support_idx": None},
            {"id": 8008, "question": "What is the currency of #1?", "answer": "ngultrum", "paragraph_support_idx": None},
        ],
        "answer": "ngultrum",
        "answer_aliases": [],
        "answerable": False,
    },
]  # fmt: skip


def write_musique(root: Path) -> Path:
    """MuSiQue's ``data/`` layout under ``root``: ``musique_ans_v1.0_train.jsonl`` and ``musique_ans_v1.0_dev.jsonl``
    (one record a line). Returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, records in (("train", MUSIQUE_TRAIN), ("dev", MUSIQUE_DEV)):
        text = "".join(json.dumps(r) + "\n" for r in records)
        (root / f"musique_ans_v1.0_{name}.jsonl").write_text(text, encoding="utf-8")
    return root


#: Calc-X rows as Agent Lightning's parquet holds them (columns id, question, chain, result, source; from its
#: examples/calc_x/data/sample.jsonl and made-up ones): a fraction, integers, a decimal and an option letter.
CALCX_TRAIN = [
    ("ape210k__00384263", "6.6 minus x (3/2) times equals 5.6.",
     '<gadget id="calculator">1 / (3/2)</gadget>\n<output>2/3 = around 0.666667</output>\n<result>2/3 = around 0.666667</result>',
     "2/3"),
    ("ape210k__00469689", "How many degrees of 75° can form a right angle?",
     '<gadget id="calculator">90 - 75</gadget>\n<output>15</output>\n<result>15</result>', "15"),
    ("aqua_rat__0bgRP2fAiH8URR9A", "36 men can complete a piece of work in 18 days. In how many days will 108 men "
     "complete the same work ?\nChoose the correct choice\nA) 24 B) 77 C) 6 D) 29 E) 21", "x = 6\n<result>C</result>",
     "C"),
]  # fmt: skip
CALCX_TEST = [
    ("gsm8k__aBcD1234", "A pen costs 2.5 dollars. How much do 3 pens cost?",
     '<gadget id="calculator">2.5 * 3</gadget>\n<output>7.5</output>\n<result>7.5</result>', "7.5"),
    ("ape210k__00935567", "Uncle Wang has 20 goats, 14 sheep, and 408 rabbits. How many times more rabbits are "
     "there than sheep?", '<gadget id="calculator">408 / 34</gadget>\n<output>12</output>\n<result>12</result>', "12"),
]  # fmt: skip


def write_calcx(root: Path) -> Path:
    """Agent Lightning's Calc-X files under ``root``: ``train.parquet`` and ``test.parquet``. Returns ``root``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", CALCX_TRAIN), ("test", CALCX_TEST)):
        columns = {"id": [r[0] for r in rows], "question": [r[1] for r in rows], "chain": [r[2] for r in rows],
                   "result": [r[3] for r in rows], "source": ["calc"] * len(rows)}  # fmt: skip
        pq.write_table(pa.table(columns), root / f"{name}.parquet")
    return root
