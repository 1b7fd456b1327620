"""The default store: one SQLite file in WAL mode under the data directory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from api.store.sql import SqlStore


class SqliteStore(SqlStore):
    """Plans and jobs in ``path`` (created with its directory if missing).

    WAL lets readers (the cached-plan path) run while a writer commits;
    ``synchronous=NORMAL`` keeps every committed write across a process crash
    (a power loss may lose the last few, which WAL's docs explain).
    """

    kind = "sqlite"

    def __init__(self, path: Path | str) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.create_schema()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn
