"""The app: wiring only (settings, store, workers, middleware, routers).

>>> from api.settings import Settings
>>> app = create_app(Settings(data_dir="/tmp/mtf-planner-doctest"))
>>> sorted(r.path for r in app.routes if r.path.startswith("/v1/plans"))
['/v1/plans', '/v1/plans', '/v1/plans/{plan_id}']
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.deps import Guards
from api.errors import BodySizeLimit, NoNulInUrl, install_error_handlers
from api.metrics import Metrics, MetricsMiddleware
from api.routes import (
    dashboard,
    evaluate,
    hardware,
    health,
    jobs,
    measurements,
    plans,
    scale,
)
from api.scale_schemas import ScalePlanRequest
from api.schemas import EvaluateRequest, PlanRequest
from api.service import PlannerService
from api.settings import Settings, get_settings
from api.store import open_store

STATIC_DIR = Path(__file__).parent / "static"


def _settings(app: FastAPI) -> Settings:
    # Honour dependency_overrides, as the routes' Depends(get_settings) does.
    settings: Settings = app.dependency_overrides.get(get_settings, get_settings)()
    return settings


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = _settings(app)
    app.state.guards = Guards.from_settings(settings)
    # Threads decoding or pricing large graphs hold the GIL for the default
    # 5 ms at a time; the event loop waits that long at each of its many
    # handoffs, and /healthz took seconds under load.  1 ms keeps it answering.
    sys.setswitchinterval(0.001)
    service = PlannerService(settings, open_store(settings), app.state.metrics)
    service.start()
    app.state.service = service
    try:
        yield
    finally:
        service.stop()


def create_app(settings: Settings | None = None) -> FastAPI:
    """The planner service.  ``settings`` overrides :func:`get_settings`."""
    app = FastAPI(
        title="mtf-planner",
        version="0.1.0",
        summary="Layouts for named-dimension models on device meshes, planned "
        "by CP-SAT and priced by the cost model.",
        lifespan=lifespan,
        docs_url=None,  # served below from vendored files: no CDN
        redoc_url=None,
    )
    if settings is not None:
        app.dependency_overrides[get_settings] = lambda: settings
    app.state.metrics = Metrics()
    install_error_handlers(app)
    for module in (plans, jobs, evaluate, measurements, hardware, health, dashboard):
        app.include_router(module.router)
    app.include_router(scale.router)
    app.include_router(scale.pages)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="mtf-planner API",
            swagger_js_url="/static/swagger/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger/swagger-ui.css",
            swagger_favicon_url="data:,",
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _with_request_bodies(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # Outermost first: metrics see every answer, 413 included.
    app.add_middleware(BodySizeLimit, max_bytes=_settings(app).max_body_bytes)
    app.add_middleware(NoNulInUrl)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def _with_request_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    """Adds the bodies that routes read through ``JsonBody`` (not a FastAPI
    body parameter, so that nothing is read before the token) to the
    schema's components, where their ``requestBody`` entries point."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (PlanRequest, EvaluateRequest, ScalePlanRequest):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            components.setdefault(name, sub)
        components[model.__name__] = js
    return schema
