"""``/healthz`` (liveness for load balancers and Docker) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import ServiceDep
from api.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "Degraded."}},
    summary="Liveness",
)
def healthz(service: ServiceDep) -> JSONResponse:
    """``ok`` when the store answers and every worker process is alive."""
    pool = service.pool
    store_ok = service.store.ping()
    body: dict[str, Any] = {
        "status": "ok" if store_ok and pool.alive == pool.workers else "degraded",
        "store": service.store.kind if store_ok else f"{service.store.kind} (down)",
        "workers": pool.workers,
        "workers_alive": pool.alive,
        "queue_depth": pool.queue_depth,
        "running": pool.running,
    }
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
def metrics(request: Request) -> Response:
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
