"""Which exceptions are the infrastructure's fault, not the agent's.

An attempt that dies because the model gateway or the store could not be reached says nothing about the policy:
it ends as `INFRA_ERROR` (retried, never trained on as reward 0). Everything else the agent raises is a real
outcome (`FAILED`). httpx and openai are looked up in ``sys.modules`` instead of imported: if the agent never
imported them, none of their exceptions can be in flight, and the runner stays free of optional dependencies.
"""

from __future__ import annotations

import sys

from lightrail.types import ErrorInfo

__all__ = ["error_info", "is_infra_error"]


def _is_infra_one(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError):  # refused / reset / aborted sockets, whatever the client library
        return True
    httpx = sys.modules.get("httpx")
    if httpx is not None:
        if isinstance(exc, httpx.TransportError):  # connect/read/write errors and timeouts
            return True
        if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500:
            return True
    openai = sys.modules.get("openai")
    infra = () if openai is None else (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError)
    return isinstance(exc, infra)


def is_infra_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised ``from``, or every member of an exception group) is a
    connection error, timeout or 5xx talking to a server."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, BaseExceptionGroup):
            return all(is_infra_error(e) for e in current.exceptions)
        if _is_infra_one(current):
            return True
        current = current.__cause__  # explicit chaining only: `raise X from conn_error` keeps the meaning
    return False


def error_info(exc: BaseException) -> ErrorInfo:
    """The `ErrorInfo` recorded for an attempt that raised ``exc``."""
    from lightrail.tracing import exception_attributes

    attrs = exception_attributes(exc)
    return ErrorInfo(
        type=attrs["exception.type"], message=attrs["exception.message"], traceback=attrs["exception.stacktrace"]
    )
