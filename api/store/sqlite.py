"""The default store: one SQLite file in WAL mode under the data directory."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from api.store.base import StoreUnavailable
from api.store.sql import BoundedPool, SqlStore, apply_migrations


class SqliteStore(SqlStore):
    """Plans and jobs in ``path`` (created with its directory if missing).

    WAL lets readers (the cached-plan path) run while a writer commits;
    ``synchronous=NORMAL`` keeps every committed write across a process crash
    (a power loss may lose the last few, which WAL's docs explain).  At most
    ``pool_size`` connections, lent per statement, and one more for job
    heartbeats and the reaper.
    """

    kind = "sqlite"

    def __init__(
        self, path: Path | str, pool_size: int = 8, pool_timeout_s: float = 2.0
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._migrate()
        self._pool = BoundedPool(
            self._connect, pool_size, pool_timeout_s, broken=(sqlite3.Error,)
        )
        self._maintenance = BoundedPool(
            self._connect, 1, pool_timeout_s, broken=(sqlite3.Error,)
        )

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _migrate(self) -> None:
        # Switching a new file to WAL can be refused at once ("database is
        # locked", no busy wait) while another process does the same: retry.
        deadline = time.monotonic() + 30
        while True:
            try:
                return self._migrate_once()
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _migrate_once(self) -> None:
        # BEGIN IMMEDIATE takes SQLite's write lock: processes starting
        # together on one file apply each migration once.
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                apply_migrations(conn.execute)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _connection(self, timeout_s: float | None = None) -> Any:
        return self._pool.connection(timeout_s)

    def _maintenance_connection(self, timeout_s: float | None = None) -> Any:
        return self._maintenance.connection(timeout_s)

    def _unavailable(self, error: Exception) -> StoreUnavailable | None:
        # Only "locked"/"busy" past busy_timeout: anything else is our bug.
        text = str(error).lower()
        if isinstance(error, sqlite3.OperationalError) and (
            "locked" in text or "busy" in text
        ):
            return StoreUnavailable("the SQLite store stayed locked; try again")
        return None

    def close(self) -> None:
        self._pool.close()
        self._maintenance.close()
