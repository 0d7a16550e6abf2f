"""Stores: where rollouts, attempts, spans and resources live, and how processes reach them.

* `MemoryStore`: dicts in one process (tests, quick experiments).
* `SQLiteStore`: the default; one file, WAL, survives crashes of any process.
* `PostgresStore`: one PostgreSQL database behind several store servers (scale-out); asyncpg loads on first use.
* `StoreClient`: the same protocol over HTTP to a `lightrail store serve` process (`SyncStoreClient` for code
  without an event loop).

`open_store(url)` picks one from a string, so every command line takes the same ``--store`` argument.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from lightrail._lazy import lazy_face
from lightrail.store.base import (
    ConflictError,
    ForbiddenError,
    InvalidIdError,
    NotFoundError,
    StaleAttemptError,
    Store,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
    WaitResult,
)
from lightrail.store.memory import MemoryStore

if TYPE_CHECKING:  # the lazily loaded part of the export list (read by `lazy_face`): aiosqlite, asyncpg, the client
    from lightrail.store.checks import check_store
    from lightrail.store.client import StoreClient, SyncStoreClient
    from lightrail.store.postgres import PostgresStore
    from lightrail.store.sqlite import SchemaVersionError, SQLiteStore

_EXPORTS, _lazy_names, __getattr__, __dir__ = lazy_face(__name__, __file__)
__all__ = sorted(
    [
        *_lazy_names,
        "ConflictError",
        "ForbiddenError",
        "InvalidIdError",
        "MemoryStore",
        "NotFoundError",
        "StaleAttemptError",
        "Store",
        "StoreError",
        "StoreUnavailableError",
        "UnauthorizedError",
        "WaitResult",
        "open_store",
    ]
)  # the eager names: the imports above, and `open_store` below


STORE_URL_FORMS = (
    "memory:, http(s)://HOST:PORT (a store server), postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE, "
    "sqlite:///PATH or a plain file path"
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d+(/.*)?$")  # 127.0.0.1:4747, [::1]:4747, db:5432/x


def store_kind(url: str) -> Literal["memory", "http", "postgres", "sqlite"]:
    """Which store ``url`` names, or a one-line `ValueError` for a ``scheme://`` lightrail does not serve."""
    if url == "memory:":
        return "memory"
    match = _SCHEME.match(url)
    if match is None:
        if _HOST_PORT.match(url):  # a server's address without its scheme, never meant as a file name
            raise ValueError(
                f"store URL {url!r} has no scheme (for a store server: http://{url}); use {STORE_URL_FORMS}"
            )
        return "sqlite"  # a file path
    scheme = match.group(1).lower()
    if scheme in ("http", "https"):
        return "http"
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    if scheme == "sqlite":
        return "sqlite"
    # never echo what follows the scheme: it may hold a password
    raise ValueError(f"unsupported store URL scheme {scheme + '://'!r}; use {STORE_URL_FORMS}")


def open_store(url: str, *, token: str | None = None) -> Store:
    """Open a store from a string: ``memory:``, ``http(s)://host:port`` (a store server, with ``token``),
    ``postgresql://user:password@host:port/database`` (``postgres://`` too), or a SQLite file path (optionally
    ``sqlite:///path``; its folder is created). Any other ``scheme://``, or a ``host:port`` without a scheme,
    raises a one-line `ValueError` naming the accepted forms."""
    kind = store_kind(url)
    if kind == "memory":
        return MemoryStore()
    if kind == "http":
        from lightrail.store.client import StoreClient

        return StoreClient(url, token=token)
    if kind == "postgres":
        from lightrail.store.postgres import PostgresStore

        return PostgresStore(url)
    from lightrail.store.sqlite import SQLiteStore

    return SQLiteStore(sqlite_path(url))


def redact_url(url: str) -> str:
    """A store location fit to print: a database URL without its password."""
    parts = urlsplit(url)
    if parts.password:
        return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()
    return url


RUN_STORE = "store.db"
"""The store file of a run folder (``lightrail train``'s ``out_dir``, `Trainer.fit`'s default)."""


def resolve_store(location: str) -> str:
    """What a ``--store`` (or ``store:``) names, the one reading every command shares: a URL as it is (``memory:``,
    ``http(s)://``, ``postgresql://``), a SQLite file, or a folder meaning its ``store.db`` (a run folder; a path
    that ends with ``/`` or is an existing folder). A ``scheme://`` lightrail does not serve is a one-line
    `ValueError` (`store_kind`). Nothing is created."""
    kind = store_kind(location)
    if kind != "sqlite":
        return location
    path = location.removeprefix("sqlite://")
    if path != ":memory:" and (path.endswith(("/", os.sep)) or os.path.isdir(path)):
        return os.path.join(path, RUN_STORE)
    return location


def sqlite_path(url: str) -> str:
    """The file of a SQLite store URL (``sqlite:///PATH``, a plain path, or a folder meaning its ``store.db``:
    `resolve_store`), its folder created if missing (a new store's ``runs/store.db`` should not need a ``mkdir``
    first)."""
    path = resolve_store(url).removeprefix("sqlite://")
    if path != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path
