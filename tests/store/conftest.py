"""The ``store`` fixture: every contract test runs against each Store implementation.

``http`` is the real thing end to end: a `lightrail store serve`-equivalent uvicorn server on 127.0.0.1 (its own
thread and event loop) backed by SQLite, and the httpx `StoreClient` in the test's loop. ``postgres`` is
`PostgresStore` on a real PostgreSQL server this session starts (``tests/_postgres.py``), a fresh database per
test (``postgres_url``, tests/conftest.py); ``http-postgres`` is the HTTP server in front of it.
"""

from __future__ import annotations

import pytest

from lightrail.store import MemoryStore

STORE_KINDS = ["memory", "sqlite", "http", "postgres", "http-postgres"]


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
