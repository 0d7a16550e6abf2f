"""`check_store`: what a long-running process (runner, gateway, dashboard) asks of its store when it starts, so a
wrong URL, token or role is one line at start-up rather than a retry loop or a 503 at first use.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightrail.store.base import (
    ForbiddenError,
    NotFoundError,
    Store,
    StoreError,
    StoreUnavailableError,
    UnauthorizedError,
)

__all__ = ["check_store", "is_auth_error"]


async def check_store(store: Store, routes: Iterable[str], *, token_hint: str = "the store's token") -> None:
    """That ``store`` serves a process calling ``routes`` (names of `lightrail.store.tokens.ROUTE_ROLES`): it is
    reachable, and for a store server, its token is accepted and its role may call every route.

    Raises `StoreUnavailableError` (nothing answers, or what answers is not a store server), `UnauthorizedError` (the token is refused) or
    `ForbiddenError` (the token's role is not enough), each with a one-line message saying what to do;
    ``token_hint`` names where the token comes from (``--store-token or $LIGHTRAIL_TOKEN``). A database store
    (SQLite, PostgreSQL) is opened, which is its check.
    """
    from lightrail.store.client import StoreClient
    from lightrail.store.tokens import ROUTE_ROLES

    if not isinstance(store, StoreClient):
        opening = getattr(store, "open", None)
        if opening is not None:  # PostgreSQL connects explicitly
            try:
                await opening()
            except StoreError:
                raise
            except Exception as exc:  # asyncpg's own errors (authentication, a missing database): one line
                raise StoreUnavailableError(f"cannot open the store: {type(exc).__name__}: {exc}") from None
        return
    try:
        role = (await store.whoami()).role
    except StoreUnavailableError as exc:
        raise StoreUnavailableError(
            f"no store server answers at {store.url}; start one (lightrail store serve) or fix the URL ({exc})"
        ) from None
    except UnauthorizedError as exc:
        given = "no token was given" if not store.token else "the token given is wrong, expired or revoked"
        raise UnauthorizedError(f"{exc}: {given}; pass {token_hint}") from None
    except NotFoundError:  # something answers, without a store's routes: a gateway's port, another service
        raise StoreUnavailableError(
            f"{store.url} answers but is not a lightrail store server (no /v1/whoami; a gateway's port?): give the "
            "URL `lightrail store serve` prints"
        ) from None
    needed = sorted(r.value for r in frozenset.intersection(*(ROUTE_ROLES[name] for name in routes)))
    if role.value not in needed:
        raise ForbiddenError(
            f"the store server at {store.url} gave this token the role {role.value!r}; this needs "
            f"{' or '.join(repr(r) for r in needed)} (lightrail token create --role {needed[-1]})"
        )


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the store refusing a token or a role: never worth a retry."""
    return isinstance(exc, (UnauthorizedError, ForbiddenError))
