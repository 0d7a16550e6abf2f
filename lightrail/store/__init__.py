"""Stores: where rollouts, attempts, spans and resources live, and how processes reach them.

* `MemoryStore`: dicts in one process (tests, quick experiments).
* `SQLiteStore`: the default; one file, WAL, survives crashes of any process.
* `StoreClient`: the same protocol over HTTP to a `lightrail store serve` process (`SyncStoreClient` for code
  without an event loop).

`open_store(url)` picks one from a string, so every command line takes the same ``--store`` argument.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightrail.store.base import (
    ConflictError,
    NotFoundError,
    StaleAttemptError,
    Store,
    StoreError,
    StoreUnavailableError,
)
from lightrail.store.memory import MemoryStore

__all__ = [
    "ConflictError",
    "MemoryStore",
    "NotFoundError",
    "SQLiteStore",
    "SchemaVersionError",
    "StaleAttemptError",
    "Store",
    "StoreClient",
    "StoreError",
    "StoreUnavailableError",
    "SyncStoreClient",
    "open_store",
]

_LAZY = {
    "SQLiteStore": "lightrail.store.sqlite",
    "SchemaVersionError": "lightrail.store.sqlite",
    "StoreClient": "lightrail.store.client",
    "SyncStoreClient": "lightrail.store.client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightrail.store' has no attribute {name!r}")


def open_store(url: str, *, token: str | None = None) -> Store:
    """Open a store from a string: ``memory:``, ``http(s)://host:port`` (a store server), or a SQLite file path
    (optionally ``sqlite:///path``)."""
    if url == "memory:":
        return MemoryStore()
    if url.startswith(("http://", "https://")):
        from lightrail.store.client import StoreClient

        return StoreClient(url, token=token)
    from lightrail.store.sqlite import SQLiteStore

    return SQLiteStore(url.removeprefix("sqlite://"))


if TYPE_CHECKING:  # pragma: no cover
    from lightrail.store.client import StoreClient, SyncStoreClient
    from lightrail.store.sqlite import SchemaVersionError, SQLiteStore
