"""Servers in subprocesses for tests: a command started in its own process group, its output in a log file,
waited on until ``/health`` answers, stopped with SIGTERM (SIGKILL if it hangs).

Used where a test needs the real command line (``lightrail gateway serve``, ``lightrail store serve``, ``vllm``)
rather than an app in a thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Served", "free_port", "served"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A server in a subprocess (own process group, log in a file); ``root`` is ``http://127.0.0.1:PORT`` and
    ``url`` its OpenAI base URL (``root + "/v1"``). A server with a TLS certificate is ``https://`` and checked
    against ``ca_file``."""

    def __init__(
        self, cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None, ca_file: str | None = None
    ) -> None:
        self.root = f"{'https' if ca_file else 'http'}://127.0.0.1:{port}"
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.url, self.log = self.root + "/v1", log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )

    def log_tail(self, n_chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n_chars:]

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.root + "/health", timeout=2, context=self._ssl) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def served(
    cmd: list[str],
    port: int,
    log: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    ca_file: str | None = None,
) -> Iterator[Served]:
    """Start ``cmd``, wait until healthy, yield it, stop it."""
    server = Served(cmd, port, log, env, ca_file)
    try:
        server.wait_healthy(timeout_s)
        yield server
    finally:
        server.stop()
