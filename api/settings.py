"""Service settings, read from ``MTF_PLANNER_*`` environment variables.

>>> Settings(workers=1).queue_size
16

FastAPI reads them through :func:`get_settings`, which tests and
:func:`api.main.create_app` override (``app.dependency_overrides``).
"""

from __future__ import annotations

import functools
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.redact import redact_url
from mtf_core.serialization import Limits


class Settings(BaseSettings):
    """Everything the service can be told; the defaults suit a 2-core host."""

    model_config = SettingsConfigDict(env_prefix="MTF_PLANNER_", extra="ignore")

    #: where the SQLite file lives (ignored with a PostgreSQL ``database_url``)
    data_dir: Path = Path("mtf-planner-data")
    #: ``postgresql://user@host/db`` for PostgreSQL; empty: SQLite in data_dir
    database_url: str = ""
    #: comma-separated bearer tokens; empty: write endpoints are open
    api_tokens: str = ""

    # -- limits on what one request may ask for --------------------------------------
    max_body_bytes: int = Field(16 * 2**20, ge=1024)
    max_graph_operations: int = Field(20_000, ge=1)
    max_distinct_dims: int = Field(512, ge=1)
    max_rank: int = Field(16, ge=1)
    max_dim_size: int = Field(2**40, ge=1)
    max_constant_elements: int = Field(1_000_000, ge=1)
    max_num_devices: int = Field(65_536, ge=1)
    max_mesh_axes: int = Field(4, ge=1)
    max_top_k: int = Field(20, ge=1)
    max_time_limit_s: float = Field(120.0, gt=0)
    #: JSON bodies are scanned before decoding: nesting depth, longest string
    #: (characters), and tokens (strings, brackets and commas) in all
    max_json_depth: int = Field(32, ge=4)
    max_json_string_chars: int = Field(4096, ge=64)
    max_json_tokens: int = Field(4_000_000, ge=1000)

    # -- per-client and global guards on the endpoints that cost CPU or memory ---------
    #: requests one client (its API token, else its address) may have in flight
    client_max_concurrent: int = Field(128, ge=1)
    #: a client's sustained requests per second (token bucket; 0: no rate limit)
    client_rate_per_s: float = Field(2000.0, ge=0)
    #: requests a client may send at once above its rate
    client_burst: int = Field(4000, ge=1)
    #: request body bytes all clients together may have in flight (counted as
    #: they arrive); over it, 503
    max_inflight_body_bytes: int = Field(48 * 2**20, ge=1024)
    #: seconds a request's body may take to arrive once its headers have;
    #: past it, 408 (a stalled upload holds no budget for long)
    body_timeout_s: float = Field(30.0, gt=0, le=3600)
    #: requests decoding or pricing a large body at once; the rest wait their turn
    #: (pure Python under one GIL: a second one would only slow the event loop)
    heavy_concurrency: int = Field(1, ge=1, le=64)

    # -- solving -------------------------------------------------------------------------
    #: worker processes that run solves (each a spawned interpreter, no TF)
    workers: int = Field(2, ge=1, le=64)
    #: CP-SAT threads per solve
    solver_threads: int = Field(1, ge=1, le=64)
    #: jobs waiting for a worker before new ones get 429
    queue_size: int = Field(16, ge=1)
    #: how long POST /v1/plans waits for a new solve before answering 202
    sync_wait_s: float = Field(30.0, ge=0)
    #: graphs with more operations always go through a job (202)
    sync_max_operations: int = Field(5_000, ge=1)
    #: memory for repeated requests' answers (exact bytes -> cached plan)
    response_cache_bytes: int = Field(64 * 2**20, ge=0)

    # -- the database --------------------------------------------------------------------
    #: connections one replica (one process) may hold at most for requests
    #: (it holds one more for job heartbeats and the reaper)
    db_pool_size: int = Field(8, ge=1, le=1000)
    #: how long a request waits for a free connection before a 503
    db_pool_timeout_s: float = Field(2.0, gt=0, le=60)

    # -- replicas ------------------------------------------------------------------------
    #: a label for this replica in logs; jobs are owned by a replica id made
    #: unique at each start (``PlannerService.replica_id``), never by this name
    instance_name: str = Field(default_factory=socket.gethostname)
    #: unfinished jobs whose owner sent no heartbeat for this long are failed
    stale_job_s: float = Field(20.0, gt=0)
    #: how often a replica marks its jobs alive and reaps dead replicas' jobs
    heartbeat_s: float = Field(2.0, gt=0)

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.api_tokens.split(",") if t.strip())

    @property
    def graph_limits(self) -> Limits:
        """What :func:`mtf_core.graph_from_dict` enforces on client graphs."""
        return Limits(
            max_operations=self.max_graph_operations,
            max_rank=self.max_rank,
            max_distinct_dims=self.max_distinct_dims,
            max_dim_size=self.max_dim_size,
            max_constant_elements=self.max_constant_elements,
            max_json_bytes=self.max_body_bytes,
        )

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "planner.sqlite3"

    @property
    def store_description(self) -> str:
        """Where the store is, fit to print: the database URL without its
        password, or the SQLite file."""
        if self.database_url.strip():
            return redact_url(self.database_url.strip())
        return str(self.sqlite_path)


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The settings from the environment (read once)."""
    return Settings()
