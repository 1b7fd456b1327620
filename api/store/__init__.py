"""Plan and job storage: :func:`open_store` picks SQLite or PostgreSQL."""

from __future__ import annotations

from api.settings import Settings
from api.store.base import JobRecord, PlanRecord, Store
from mtf_core.errors import ConfigError


def open_store(settings: Settings) -> Store:
    """PostgreSQL if ``database_url`` is a ``postgresql://`` URL, else SQLite
    in ``data_dir``."""
    url = settings.database_url.strip()
    if url.startswith(("postgresql://", "postgres://")):
        from api.store.postgres import PostgresStore

        return PostgresStore(url)
    if url:
        raise ConfigError(
            f"database_url {url!r} is not understood; expected a postgresql:// URL "
            "or empty (SQLite in data_dir)"
        )
    from api.store.sqlite import SqliteStore

    return SqliteStore(settings.sqlite_path)


__all__ = ["JobRecord", "PlanRecord", "Store", "open_store"]
