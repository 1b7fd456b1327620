"""The dashboard: HTML pages over the same store (not part of the JSON API).

``/``: stored plans and recent jobs.  ``/plans/{id}``: the chosen rules, a
Chart.js chart of the candidates' and baselines' step time (compute and
communication per mesh axis, stacked) and memory per device against
capacity, the per-dimension table from ``explain``, the dimension graph, and
a form that plans the same graph on another mesh shape or hardware.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from api.deps import FormBody, ServiceDep
from api.dimgraph_svg import AXIS_COLOURS, axis_colours, dimension_graph_layout
from api.schemas import PlanRequest
from api.service import PlannerService, QueueFull, iso, job_dict, plan_header
from api.store import PlanRecord
from cost_models.hardware import PRESETS
from layout_planner.plan import fmt_bytes, fmt_s
from mtf_core.errors import MtfError

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent.parent / "templates")
# Every value is escaped, whatever a template's name ends with (select_autoescape
# would leave .svg or .txt templates unescaped).
templates.env.autoescape = True
templates.env.globals.update(
    fmt_s=fmt_s, fmt_bytes=fmt_bytes, static=lambda name: f"/static/{name}"
)

#: Pages run only our own scripts: a reflected or stored value that slipped
#: past the escaping still could not run.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}


def _page(
    request: Request, name: str, context: dict[str, Any], status: int = 200
) -> Response:
    """Every dashboard page: an autoescaping template, with the CSP."""
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers=_HEADERS
    )


def _not_found(request: Request, kind: str, ident: str) -> Response:
    return _page(request, "notfound.html", {"kind": kind, "ident": ident}, 404)

#: Longest label under a chart bar.
_LABEL_CHARS = 28


@router.get("/", response_class=HTMLResponse)
def index(request: Request, service: ServiceDep) -> Response:
    records, total = service.store.list_plans(200)
    jobs = [job_dict(j) for j in service.store.list_jobs(20)]
    return _page(
        request,
        "index.html",
        {"plans": [plan_header(r) for r in records], "total": total, "jobs": jobs},
    )


def chart_data(plan: dict[str, Any], colours: dict[str, str]) -> dict[str, Any]:
    """What dashboard.js draws: one bar per candidate, then per baseline."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for c in plan["candidates"]:
        rules = c["layout_rules"] or "(nothing split)"
        tag = "chosen" if c["rank"] == 1 else f"#{c['rank']}"
        rows.append((f"{tag}: {rules}"[:_LABEL_CHARS], c["cost"]))
    if not rows:  # nothing fits: the plan holds the layout with the smallest peak
        rules = plan["layout_rules"] or "(nothing split)"
        rows.append((f"chosen: {rules}"[:_LABEL_CHARS], plan["cost"]))
    for b in plan["baselines"]:
        if b["cost"] is not None:
            rows.append((f"baseline {b['name']}"[:_LABEL_CHARS], b["cost"]))
    axes = sorted({a for _, cost in rows for a in cost["comm_s_by_axis"]})
    # Collectives over several axes ("x,y") get colours after the mesh axes'.
    colours = dict(colours)
    for a in axes:
        colours.setdefault(a, AXIS_COLOURS[len(colours) % len(AXIS_COLOURS)])
    return {
        "labels": [label for label, _ in rows],
        "chosen": 0,
        "compute": [cost["compute_s"] for _, cost in rows],
        "comm": {
            a: [cost["comm_s_by_axis"].get(a, 0.0) for _, cost in rows] for a in axes
        },
        "peak": [cost["peak_memory_bytes"] for _, cost in rows],
        "capacity": plan["cost"]["memory_capacity_bytes"],
        "colours": colours,
    }


def _plan_page(
    request: Request,
    service: PlannerService,
    record: PlanRecord,
    form_error: str = "",
    status: int = 200,
) -> Response:
    plan = record.plan
    mesh_axes = [part.split(":")[0] for part in plan["mesh_shape"].split(",") if part]
    colours = axis_colours(mesh_axes)
    graph = dimension_graph_layout(
        plan.get("dimension_graph", {}), plan["rules"], mesh_axes
    )
    return _page(
        request,
        "plan.html",
        {
            "rec": record,
            "plan": plan,
            "created": iso(record.created_at)[:19].replace("T", " "),
            "colours": colours,
            "mesh_axes": mesh_axes,
            "graph": graph,
            "chart": chart_data(plan, colours),
            "presets": sorted(PRESETS),
            "needs_token": bool(service.settings.tokens),
            "form_error": form_error,
        },
        status,
    )


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(plan_id: str, request: Request, service: ServiceDep) -> Response:
    record = service.store.get_plan(plan_id)
    if record is None:
        return _not_found(request, "plan", plan_id)
    return _plan_page(request, service, record)


def _try_request(
    record: PlanRecord, graph_json: str, form: dict[str, str]
) -> PlanRequest:
    plan = record.plan
    hardware: Any = form.get("hardware") or plan["hardware"]["name"]
    if hardware == "__this_plan__":
        hardware = plan["hardware"]
    devices = form.get("num_devices", "").strip() or None
    mesh = form.get("mesh_shape", "").strip() or None
    return PlanRequest(
        graph=json.loads(graph_json),
        mesh_shape=None if devices else mesh,
        num_devices=devices,  # type: ignore[arg-type]  # pydantic parses "8"
        hardware=hardware,
        objective=form.get("objective", plan["objective"]),
        top_k=max(1, len(plan["candidates"])),
        time_limit_s=float(plan["solver"]["time_limit_s"]),
    )


@router.post("/plans/{plan_id}/try")
async def try_other(
    plan_id: str, request: Request, service: ServiceDep, form: FormBody
) -> Response:
    """Plans the same graph with the form's mesh shape, hardware, objective.
    The form's token is checked before anything is planned (FormBody)."""
    record = await run_in_threadpool(service.store.get_plan, plan_id)
    if record is None:
        return _not_found(request, "plan", plan_id)
    if not form.authorized:
        return await run_in_threadpool(
            _plan_page,
            request,
            service,
            record,
            "a valid API token is needed to plan",
            401,
        )
    graph_json = await run_in_threadpool(service.store.get_graph, record.graph_hash)
    if graph_json is None:
        return await run_in_threadpool(
            _plan_page, request, service, record, "this plan's graph is not stored", 404
        )
    try:
        spec = await run_in_threadpool(
            lambda: service.spec(_try_request(record, graph_json, form.fields))
        )
        cached = await run_in_threadpool(service.cached, spec)
        if cached is not None:
            return RedirectResponse(f"/plans/{cached.id}", status_code=303)
        job, _ = await run_in_threadpool(service.submit, spec)
    except (ValidationError, MtfError, ValueError, QueueFull) as e:
        if isinstance(e, ValidationError):
            err = e.errors()[0]
            message = f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
        else:
            message = str(e)
        return await run_in_threadpool(
            _plan_page, request, service, record, message, 422
        )
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, service: ServiceDep) -> Response:
    job = service.store.get_job(job_id)
    if job is None:
        return _not_found(request, "job", job_id)
    if job.status == "done" and job.plan_id:
        return RedirectResponse(f"/plans/{job.plan_id}", status_code=303)
    finished = job.status not in ("queued", "running")
    return _page(request, "job.html", {"job": job_dict(job), "finished": finished})
