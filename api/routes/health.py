"""``/healthz`` (liveness), ``/readyz`` (readiness) and ``/metrics``.

Liveness answers whether the process serves HTTP at all: it runs on the event
loop, touches neither the database nor a lock a solve could hold, and is 200
whenever the process answers (a busy solver, an exhausted connection pool or
a worker respawning after a cancel do not make it fail, so an orchestrator
never restarts a replica for being busy).  Readiness says whether to send it
traffic: the database answers and every solve worker is up.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from api.deps import ServiceDep

router = APIRouter(tags=["health"])

#: How long readiness waits for a pooled connection and ``SELECT 1``.
READY_DB_TIMEOUT_S = 1.0


class LiveOut(BaseModel):
    """The process answers; the counts come from memory."""

    status: Literal["ok"]
    replica: str
    workers: int
    workers_alive: int
    queue_depth: int
    running: int


class ReadyOut(BaseModel):
    """``ready`` when the store answers and every solve worker is up."""

    status: Literal["ready", "not ready"]
    store: str
    store_ok: bool
    workers: int
    workers_up: bool
    maintenance_age_s: float | None
    replica: str


@router.get("/healthz", response_model=LiveOut, summary="Liveness")
async def healthz(service: ServiceDep) -> dict[str, Any]:
    """200 whenever the process answers (never blocked by the database, the
    pool or a solve); for Docker's HEALTHCHECK and liveness probes."""
    pool = service.pool
    return {
        "status": "ok",
        "replica": service.replica_id,
        "workers": pool.workers,
        "workers_alive": pool.alive,
        "queue_depth": pool.queue_depth,
        "running": pool.running,
    }


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "Not ready."}},
    summary="Readiness",
)
async def readyz(service: ServiceDep) -> JSONResponse:
    """200 when the database answers within a second and every solve worker
    process has started (503 otherwise); for load balancers."""
    store_ok = await run_in_threadpool(service.store.ping, READY_DB_TIMEOUT_S)
    workers_up = service.pool.up
    last = service.last_maintenance
    body: dict[str, Any] = {
        "status": "ready" if store_ok and workers_up else "not ready",
        "store": service.store.kind,
        "store_ok": store_ok,
        "workers": service.pool.workers,
        "workers_up": workers_up,
        "maintenance_age_s": round(time.time() - last, 3) if last else None,
        "replica": service.replica_id,
    }
    return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
