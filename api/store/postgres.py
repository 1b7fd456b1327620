"""The PostgreSQL store, for several service replicas sharing one database."""

from __future__ import annotations

from typing import Any

from api.store.sql import SqlStore


class PostgresStore(SqlStore):
    """Plans and jobs in the database at ``url`` (``postgresql://...``).

    psycopg 3, one autocommit connection per thread.  Replicas agree on plans
    through the ``request_hash`` unique key: two replicas solving the same
    request store one plan (``put_plan`` returns the winner).
    """

    kind = "postgresql"
    placeholder = "%s"

    def __init__(self, url: str) -> None:
        import psycopg  # imported here: SQLite users need not install it

        self._psycopg = psycopg
        self.url = url
        super().__init__()
        self.create_schema()

    def _connect(self) -> Any:
        return self._psycopg.connect(self.url, autocommit=True, connect_timeout=10)
