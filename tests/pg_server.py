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


@contextlib.contextmanager
def postgres_server(max_connections: int = 100) -> Iterator[str]:
    """Starts a server, yields its URL (user postgres, no password, database
    postgres), stops it.  Raises PostgresMissing when it cannot run here and
    RuntimeError when it does not start."""
    bindir = pg_bindir()
    if bindir is None:
        raise PostgresMissing(
            "PostgreSQL is not installed (apt-get install postgresql; .ci/run does)"
        )
    prefix: list[str] = []
    root = tempfile.mkdtemp(prefix="mtf-planner-pg-")
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresMissing(
                "running as root and there is no 'postgres' user to run PostgreSQL"
            ) from None
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(root, "data"), _free_port()

    def run(*cmd: str) -> None:
        subprocess.run(prefix + list(cmd), check=True, capture_output=True, timeout=120)

    try:
        run(
            f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"
        )
        opts = (
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
            f"-c max_connections={max_connections}"
        )
        run(
            f"{bindir}/pg_ctl",
            "-D",
            data,
            "-o",
            opts,
            "-l",
            f"{root}/log",
            "-w",
            "start",
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        log = Path(root, "log")
        detail = (getattr(e, "stderr", b"") or b"").decode()[-500:]
        if log.exists():
            detail += log.read_text()[-1000:]
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"could not start PostgreSQL: {e}: {detail}") from None
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            prefix + [f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def empty_database(url: str) -> None:
    """Drops every table the service makes (a fresh database)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS plans, jobs, graphs, schema_version")
