"""A throwaway PostgreSQL server on 127.0.0.1, for the store's tests and for
``bench/load.py``: Debian's binaries (``apt-get install postgresql``; .ci/run
installs them), run as the 'postgres' user when we are root (PostgreSQL
refuses to run as root), data in a temporary directory removed afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


class PostgresMissing(RuntimeError):
    """PostgreSQL is not installed, or cannot run here (the message says why)."""


def pg_bindir() -> str | None:
    """Where initdb and pg_ctl are (the newest Debian version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(initdb)) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One initialized data directory and the server on it (``start``,
    ``stop``: a database restart, as an operator would do it)."""

    def __init__(self, max_connections: int = 100) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise PostgresMissing(
                "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
            )
        self.bindir = bindir
        self.prefix: list[str] = []
        self.root = tempfile.mkdtemp(prefix="mtf-planner-pg-")
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.root, ignore_errors=True)
                raise PostgresMissing(
                    "running as root and there is no 'postgres' user to run PostgreSQL"
                ) from None
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data, self.port = os.path.join(self.root, "data"), _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            f"-c fsync=off -c max_connections={max_connections}"
        )
        self._run(
            f"{bindir}/initdb",
            "-D",
            self.data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        )

    def _run(self, *cmd: str) -> None:
        try:
            subprocess.run(
                self.prefix + list(cmd), check=True, capture_output=True, timeout=120
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            log = Path(self.root, "log")
            detail = (getattr(e, "stderr", b"") or b"").decode()[-500:]
            if log.exists():
                detail += log.read_text()[-1000:]
            raise RuntimeError(f"PostgreSQL: {' '.join(cmd)}: {e}: {detail}") from None

    def start(self) -> None:
        self._run(
            f"{self.bindir}/pg_ctl",
            "-D",
            self.data,
            "-o",
            self.opts,
            "-l",
            f"{self.root}/log",
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(f"{self.bindir}/pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def remove(self) -> None:
        subprocess.run(
            self.prefix
            + [f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def postgres_instance(max_connections: int = 100) -> Iterator[PostgresServer]:
    """A started server (removed afterwards).  Raises PostgresMissing when it
    cannot run here and RuntimeError when it does not start."""
    server = PostgresServer(max_connections)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@contextlib.contextmanager
def postgres_server(max_connections: int = 100) -> Iterator[str]:
    """A started server's URL (user postgres, no password, database postgres)."""
    with postgres_instance(max_connections) as server:
        yield server.url


def empty_database(url: str) -> None:
    """Drops every table the service makes (a fresh database)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS plans, jobs, graphs, schema_version")
