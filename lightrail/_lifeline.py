"""Child processes that do not outlive the process that started them.

A trainer killed hard (``kill -9``, an OOM kill, a crashed notebook kernel) cannot stop its store server and
runner processes; without a lifeline they would go on retrying a dead store forever, holding ports, memory and
CPU. `exit_with_parent` watches the parent from a daemon thread and, once it is gone, stops this process the
graceful way (SIGTERM to itself: runners hand unfinished attempts back, the server closes its store), then
for sure after ``grace_s``.

Watching is a 1 s poll of ``os.getppid()`` (the parent's death re-parents us): portable across start methods
and interpreters, and costs nothing measurable.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

__all__ = ["exit_with_parent"]

log = logging.getLogger(__name__)


def exit_with_parent(*, poll_s: float = 1.0, grace_s: float = 30.0) -> None:
    """Stop this process when its parent dies (SIGTERM to itself, then ``os._exit(1)`` after ``grace_s``)."""
    parent = os.getppid()
    if parent <= 1:  # already orphaned, or started by init: nothing to watch
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("parent process %d is gone: stopping (pid %d)", parent, os.getpid())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(1)

    threading.Thread(target=watch, name="lightrail-lifeline", daemon=True).start()
