"""Plan and job storage: :func:`open_store` picks SQLite or PostgreSQL."""

from __future__ import annotations

from api.redact import redact_url
from api.settings import Settings
from api.store.base import JobRecord, PlanRecord, Store, StoreUnavailable
from mtf_core.errors import ConfigError


def open_store(settings: Settings) -> Store:
    """PostgreSQL if ``database_url`` is a ``postgresql://`` URL, else SQLite
    in ``data_dir``; either with a pool of at most ``db_pool_size``
    connections.  Brings the schema up to date (migrations) first."""
    url = settings.database_url.strip()
    size, wait = settings.db_pool_size, settings.db_pool_timeout_s
    if url.startswith(("postgresql://", "postgres://")):
        from api.store.postgres import PostgresStore

        return PostgresStore(url, pool_size=size, pool_timeout_s=wait)
    if url:
        raise ConfigError(
            f"database_url {redact_url(url)!r} is not understood; expected a "
            "postgresql:// URL or empty (SQLite in data_dir)"
        )
    from api.store.sqlite import SqliteStore

    return SqliteStore(settings.sqlite_path, pool_size=size, pool_timeout_s=wait)


__all__ = ["JobRecord", "PlanRecord", "Store", "StoreUnavailable", "open_store"]
