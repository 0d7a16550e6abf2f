"""What a command prints for an error it expected (bad input, an unreachable store, a busy port): one line that
names the problem, never a traceback."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(exc: BaseException) -> str:
    """``exc`` as one line: an `OSError` as ``<what>: <path>`` without its ``[Errno N]``, a `SyntaxError` as
    ``<file>:<line>: <message>``, anything else as its message's first line (its type name when it has none)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    if isinstance(exc, SyntaxError) and exc.filename:  # where to look first: file:line, as compilers say it
        return f"{exc.filename}:{exc.lineno}: {exc.msg}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` in agreement: ``counted(1, "rollout")`` is ``"1 rollout"``, ``counted(2, ...)``
    ``"2 rollouts"`` (regular plurals only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
