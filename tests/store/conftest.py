"""The ``store`` fixture: every contract test runs against each Store implementation.

``http`` is the real thing end to end: a `lightrail store serve`-equivalent uvicorn server on 127.0.0.1 (its own
thread and event loop) backed by SQLite, and the httpx `StoreClient` in the test's loop. ``postgres`` is
`PostgresStore` on a real PostgreSQL server this session starts (``tests/_postgres.py``), a fresh database per
test; ``http-postgres`` is the HTTP server in front of it.
"""

from __future__ import annotations

import itertools

import pytest

from lightrail.store import MemoryStore
from tests._postgres import PostgresServer, PostgresUnavailable

STORE_KINDS = ["memory", "sqlite", "http", "postgres", "http-postgres"]

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL cluster for the whole session (started on first use, a second or two)."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres_server.create_database(f"test_{next(_databases)}")


@pytest.fixture(params=STORE_KINDS)
async def store(request, tmp_path):
    kind = request.param
    server = None
    if kind == "memory":
        s = MemoryStore()
    elif kind == "sqlite":
        from lightrail.store import SQLiteStore

        s = SQLiteStore(tmp_path / "store.db")
    elif kind == "postgres":
        from lightrail.store import PostgresStore

        s = PostgresStore(request.getfixturevalue("postgres_url"))
    else:
        from lightrail.store import StoreClient
        from lightrail.store.server import serve_in_thread

        db = request.getfixturevalue("postgres_url") if kind == "http-postgres" else tmp_path / "store.db"
        server = serve_in_thread(db, token="test-token")
        s = StoreClient(server.url, token="test-token")
    yield s
    await s.close()
    if server is not None:
        server.stop()
