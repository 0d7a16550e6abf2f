"""A real, throwaway PostgreSQL server for tests and benchmarks: `PostgresServer.start()` runs ``initdb`` and
``postgres`` in a temporary directory, listening on 127.0.0.1 (a free port) and a unix socket in that directory,
with trust authentication for local connections only.

Binaries come from PATH or ``/usr/lib/postgresql/*/bin``; when neither has them, Debian's ``postgresql`` package
is installed with apt-get (said on stderr first). ``initdb`` refuses to run as root, so as root the cluster runs
as an unprivileged user: ``postgres`` if it exists, else one created with ``useradd``.

The cluster runs with ``fsync=off``: the tests kill store *servers*, never PostgreSQL itself, so what they prove
(a committed transaction survives the client process) does not depend on fsync, and the shared 2-core box is
spared an fsync per commit. Benchmarks pass ``fsync=True`` to measure PostgreSQL as deployed.

    server = PostgresServer.start()
    url = server.create_database("t1")   # postgresql://postgres@127.0.0.1:PORT/t1
    ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUPERUSER = "postgres"  # the database role initdb creates (not the OS user)
_FALLBACK_OS_USER = "lightrail-pg"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL binaries are missing and could not be installed."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (PATH first, then Debian's layout)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(candidates[-1]).parent if candidates else None


def ensure_bindir() -> Path:
    """`find_bindir`, installing Debian's ``postgresql`` package if needed (root only)."""
    bindir = find_bindir()
    if bindir is not None:
        return bindir
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PostgresUnavailable(
            "PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql/*/bin) and this process "
            "cannot apt-get install it: install the 'postgresql' package (15 or newer) and rerun"
        )
    print(
        "tests/_postgres.py: PostgreSQL not found; installing Debian's 'postgresql' package with apt-get ...",
        file=sys.stderr,
        flush=True,
    )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
    ):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable("apt-get installed 'postgresql' but initdb is still not found")
    return bindir


def _os_user() -> str | None:
    """The unprivileged user to run the cluster as (None: run as ourselves, we are not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", _FALLBACK_OS_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _FALLBACK_OS_USER],
        check=True,
        capture_output=True,
    )
    return _FALLBACK_OS_USER


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory; `stop` shuts it down and deletes the directory."""

    def __init__(self, root: Path, bindir: Path, user: str | None, port: int):
        self.root, self.bindir, self.user, self.port = root, bindir, user, port
        self.data = root / "data"
        self.log = root / "postgres.log"

    @classmethod
    def start(cls, *, fsync: bool = False, max_connections: int = 300) -> PostgresServer:
        bindir = ensure_bindir()
        user = _os_user()
        root = Path(tempfile.mkdtemp(prefix="lightrail-pg-"))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        server = cls(root, bindir, user, _free_port())
        try:
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            )
            options = (
                f"-c listen_addresses=127.0.0.1 -p {server.port} -k {root} -c max_connections={max_connections} "
                f"-c fsync={'on' if fsync else 'off'} -c full_page_writes={'on' if fsync else 'off'} "
                "-c shared_buffers=128MB"
            )
            server._run(
                "pg_ctl", "-D", str(server.data), "-l", str(server.log), "-o", options, "-w", "-t", "60", "start"
            )
        except BaseException:
            server._cleanup()
            raise
        return server

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bindir / tool), *args]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-1000:]}\n{log}")

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` (TCP on 127.0.0.1, trust auth)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create an empty database (from template0) and return its URL."""
        self.psql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url(name)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run SQL through ``psql`` (no driver needed); returns its unaligned output."""
        cmd = [
            str(self.bindir / "psql"),
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            SUPERUSER,
            "-d",
            database,
            "-c",
            sql,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def cpu_s(self) -> float:
        """CPU seconds the cluster has used so far: the postmaster with its exited children, plus live backends
        (Linux /proc)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # exited meanwhile
                continue
            pid, ppid = int(stat.parent.name), int(fields[1])
            if pid == postmaster:
                total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
            elif ppid == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def stop(self) -> None:
        try:
            if self.data.exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        for _ in range(3):  # the server may still be removing its socket file
            shutil.rmtree(self.root, ignore_errors=True)
            if not self.root.exists():
                return
            time.sleep(0.1)
