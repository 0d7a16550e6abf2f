"""`ChildWatch`: a trainer session notices when a process it started (its store server, a runner) exits on its own.

Without it, a run whose store server died went on for minutes, its runners logging a failed span write every few
seconds, until someone killed it. The watch polls each child's exit code every ``poll_s`` seconds; the first that
exited unexpectedly calls ``on_exit`` (the trainer kills its runners there: without their store they could only
retry, and log each retry), cancels the session's task, and the session then raises `ChildExited`, one line naming
the child and its exit code. Until `ChildWatch.close`, lightrail's own warnings are held back (the teardown of a run
whose store is gone is a chorus of "store unavailable" retries: not news after that line). Children the session
stops itself are no longer watched (`ChildWatch.stop` first).

Concurrency model: one asyncio task on the trainer's event loop; exit codes are read without blocking
(``Popen.poll``, ``Process.exitcode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

__all__ = ["ChildExited", "ChildWatch"]


class ChildExited(RuntimeError):
    """A process the trainer started exited while the run needed it (the message names it and its exit code)."""


def exit_description(code: int) -> str:
    """``code 1``, or for a signal (a negative code, as `subprocess` and `multiprocessing` give it) ``code -9
    (SIGKILL)``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"


class ChildWatch:
    """``watch.add("the store server (pid 12)", proc.poll)``; ``watch.start()`` inside the session's task; ``await
    watch.stop()`` before stopping the children on purpose; in the session's ``except asyncio.CancelledError``,
    ``watch.raise_if_died()``."""

    def __init__(self, poll_s: float = 0.25, *, on_exit: Callable[[], None] | None = None) -> None:
        self.poll_s = poll_s
        self.on_exit = on_exit
        self.died: str | None = None
        """The line naming the child that exited, once one did."""
        self._children: list[tuple[str, Callable[[], int | None]]] = []
        self._host: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._level: int | None = None
        self._stopped = False

    def add(self, name: str, exitcode: Callable[[], int | None]) -> Callable[[], None]:
        """Watch a child: ``exitcode()`` is None while it runs. Returns the function that stops watching it (call it
        before stopping the child on purpose)."""
        entry = (name, exitcode)
        self._children.append(entry)

        def forget() -> None:
            if entry in self._children:
                self._children.remove(entry)

        return forget

    def start(self) -> None:
        """Watch from now on, on behalf of the current task (the one cancelled when a child exits)."""
        self._host = asyncio.current_task()
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Stop watching (the children are about to be stopped on purpose): `poll` looks no more either."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def close(self) -> None:
        """Stop watching for good, and let lightrail's warnings through again."""
        if self._task is not None:
            self._task.cancel()
        if self._level is not None:
            logging.getLogger("lightrail").setLevel(self._level)
            self._level = None

    def raise_if_died(self) -> None:
        """In the host task's handler of its `asyncio.CancelledError`: `ChildExited` if the watch cancelled it."""
        if self.died is not None:
            if self._host is not None:
                self._host.uncancel()
            raise ChildExited(self.died)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            if self.poll() is not None:
                if self._host is not None:
                    self._host.cancel()
                return

    def name_the_death(self, exc: BaseException) -> None:
        """In a session's handler of ``exc``: `ChildExited` when a child died, whether the watch cancelled the
        session for it (``exc`` is that `asyncio.CancelledError`) or the session failed on its own a moment after
        (``exc`` chained); returns otherwise, for the caller to re-raise ``exc``."""
        if isinstance(exc, asyncio.CancelledError):
            self.raise_if_died()
        elif (died := self.poll()) is not None:
            raise ChildExited(died) from exc

    def poll(self) -> str | None:
        """Look at every child once (the watch does every ``poll_s``): the line naming the first that exited, after
        ``on_exit`` ran; None while all run. A session whose run failed on its own calls it too, before its error:
        a child that died a moment ago is the cause to name (its store server gone, a store call failed first)."""
        if self.died is not None or self._stopped:
            return self.died
        for name, exitcode in self._children:
            code = exitcode()
            if code is not None:
                self.died = f"{name} exited unexpectedly with {exit_description(code)}: the run stops"
                quiet = logging.getLogger("lightrail")
                self._level = quiet.level
                quiet.setLevel(logging.ERROR)
                if self.on_exit is not None:
                    self.on_exit()
                return self.died
        return None
