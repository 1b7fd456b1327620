"""The PostgreSQL store, for several service replicas sharing one database."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from api.store.base import StoreUnavailable
from api.store.sql import SqlStore, apply_migrations

log = logging.getLogger(__name__)

#: pg_advisory_lock key held while migrating ("mtfplan" in ASCII).
MIGRATION_LOCK = 0x6D7466706C616E


class PostgresStore(SqlStore):
    """Plans and jobs in the database at ``url`` (``postgresql://...``).

    psycopg 3 with a psycopg_pool ``ConnectionPool`` of at most ``pool_size``
    autocommit connections, each lent for one statement, and one more
    connection for job heartbeats and the reaper.  A borrower waits up
    to ``pool_timeout_s`` for a free one, then gets :class:`StoreUnavailable`
    (503 and ``Retry-After``); a connection the server dropped is discarded and
    replaced, so an overload or a database restart never leaves the replica
    broken.  Replicas agree on plans through the ``request_hash`` unique key,
    and on jobs through a unique index on unfinished jobs' request hash.
    """

    kind = "postgresql"
    placeholder = "%s"

    def __init__(
        self, url: str, pool_size: int = 8, pool_timeout_s: float = 2.0
    ) -> None:
        import psycopg  # imported here: SQLite users need not install it
        from psycopg_pool import ConnectionPool, PoolTimeout

        self._psycopg = psycopg
        self._pool_timeout = PoolTimeout
        self.url = url
        self.pool_size = pool_size
        self._migrate()
        self._pool = ConnectionPool(
            url,
            min_size=min(2, pool_size),
            max_size=pool_size,
            timeout=pool_timeout_s,
            kwargs={"autocommit": True, "connect_timeout": 5},
            # One empty query per checkout finds connections that a database
            # restart closed, before a request uses them.
            check=ConnectionPool.check_connection,
            name="mtf-planner",
            open=True,
        )
        # Heartbeats and the reaper: one connection of their own, opened on
        # first use (a replica with no job never needs it).
        self._maintenance = ConnectionPool(
            url,
            min_size=0,
            max_size=1,
            timeout=pool_timeout_s,
            kwargs={"autocommit": True, "connect_timeout": 5},
            check=ConnectionPool.check_connection,
            name="mtf-planner-heartbeats",
            open=True,
        )

    def _migrate(self) -> None:
        """Applies missing migrations under an advisory lock, in one
        transaction: replicas that start together wait for each other."""
        psycopg = self._psycopg
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
            try:
                with conn.transaction():

                    def execute(sql: str, params: tuple[Any, ...]) -> Any:
                        return conn.execute(self._sql(sql), params)

                    applied = apply_migrations(execute)
                if applied:
                    log.info("applied schema migrations %s", applied)
                self._measure_clock(lambda sql: conn.execute(sql).fetchone())
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))

    def _measure_clock(self, query: Callable[[str], Any]) -> None:
        """Sets ``clock_offset_s`` from the server's clock, read by
        ``query(sql) -> row`` (half the round trip is the error)."""
        t0 = time.time()
        db = float(query("SELECT EXTRACT(EPOCH FROM clock_timestamp())")[0])
        t1 = time.time()
        self.clock_offset_s = db - (t0 + t1) / 2
        if abs(self.clock_offset_s) > 1:
            log.warning(
                "this host's clock is %.1f s off the database's; job times use "
                "the database's",
                -self.clock_offset_s,
            )

    def heartbeat(self, instance: str, job_ids: list[str]) -> set[str]:
        # Clocks drift: measure again at every heartbeat.
        self._measure_clock(lambda sql: self._run(sql, (), "one", maintenance=True))
        return super().heartbeat(instance, job_ids)

    def _connection(self, timeout_s: float | None = None) -> Any:
        return self._pool.connection(timeout=timeout_s)

    def _maintenance_connection(self, timeout_s: float | None = None) -> Any:
        return self._maintenance.connection(timeout=timeout_s)

    def _unavailable(self, error: Exception) -> StoreUnavailable | None:
        if isinstance(error, self._pool_timeout):
            return StoreUnavailable(
                f"all {self.pool_size} database connections of this replica stayed "
                f"busy, or the database did not answer (db_pool_size="
                f"{self.pool_size}); try again"
            )
        if isinstance(
            error, self._psycopg.OperationalError | self._psycopg.InterfaceError
        ):
            # The driver's message names the host and port: the log gets it.
            log.warning("the database did not answer: %s", error)
            return StoreUnavailable("the database did not answer; try again")
        return None

    def close(self) -> None:
        self._pool.close()
        self._maintenance.close()
