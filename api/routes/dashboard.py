"""The dashboard: HTML pages over the same store (not part of the JSON API).

``/``: stored plans and recent jobs.  ``/plans/{id}``: the chosen rules, a
Chart.js chart of the candidates' and baselines' step time (compute and
communication per mesh axis, stacked) and memory per device against
capacity, the per-dimension table from ``explain``, the dimension graph, and
a form that plans the same graph on another mesh shape or hardware.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from api.deps import FormBody, ServiceDep
from api.dimgraph_svg import AXIS_COLOURS, axis_colours, dimension_graph_layout
from api.errors import SHOWN_CHARS
from api.learned import profile_from_request
from api.plan_detail import DetailCache, plan_detail
from api.planning import RequestError
from api.routes.measurements import record_dict
from api.schemas import PlanRequest
from api.service import (
    JobFinished,
    PlannerService,
    QueueFull,
    iso,
    job_dict,
    job_kind,
    plan_header,
    result_path,
)
from api.store import JobRecord, PlanRecord
from api.store.base import JobStatus
from cost_models.hardware import PRESETS
from layout_planner.plan import fmt_bytes, fmt_s
from mtf_core.errors import MtfError

log = logging.getLogger(__name__)
router = APIRouter(tags=["dashboard"])

_HTML = {"text/html": {"schema": {"type": "string"}}}
_WHY = {
    303: "Forwarded to the result (Location).",
    401: "The form's API token is missing or wrong (the page says so).",
    404: "No such plan or job (an HTML page).",
    409: "The job has finished already (the page says so).",
    413: "The form is over 16 KiB.",
    415: "The form is not application/x-www-form-urlencoded.",
    422: "The form asks for something invalid (the page says what).",
    429: "This client is over its limits; retry after Retry-After seconds.",
}
_JSON_ERRORS = (413, 415, 429)  # answered before any page is made


def _html_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"description": _WHY[code]}
        if code in _JSON_ERRORS:
            entry["content"] = {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/ErrorBody"}
                }
            }
        elif code == 303:
            entry["headers"] = {"Location": {"schema": {"type": "string"}}}
        else:
            entry["content"] = _HTML
        out[code] = entry
    return out


_FORM_FIELDS = {
    "mesh_shape": {"type": "string", "maxLength": 512},
    "num_devices": {"type": "string", "maxLength": 16},
    "hardware": {"type": "string", "maxLength": 64},
    "objective": {"type": "string", "maxLength": 16},
    "token": {"type": "string", "maxLength": 256},
}
_FORM_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {"type": "object", "properties": _FORM_FIELDS}
            }
        },
    }
}
_details = DetailCache()
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
    shown = ident if len(ident) <= SHOWN_CHARS else ident[:SHOWN_CHARS] + "\u2026"
    return _page(request, "notfound.html", {"kind": kind, "ident": shown}, 404)


#: Longest line of a chart label; longer rules wrap at their ';' (never cut).
_LINE_CHARS = 18


def _label_lines(tag: str, rules: str) -> list[str]:
    """A bar's label as lines (Chart.js draws a list as several lines)."""
    lines = [tag]
    for part in rules.split(";") if rules else ["(nothing split)"]:
        if len(lines) > 1 and len(lines[-1]) + 1 + len(part) <= _LINE_CHARS:
            lines[-1] += ";" + part
        else:
            lines.append(part)
    return lines


def _rules_dict(rules: str) -> dict[str, str]:
    return dict(part.split(":", 1) for part in rules.split(";") if ":" in part)


@router.get(
    "/",
    response_class=HTMLResponse,
    summary="Dashboard: stored plans and recent jobs",
)
def index(request: Request, service: ServiceDep) -> Response:
    records, total = service.store.list_plans(200)
    jobs = [job_dict(j) for j in service.store.list_jobs(20)]
    return _page(
        request,
        "index.html",
        {"plans": [plan_header(r) for r in records], "total": total, "jobs": jobs},
    )


def chart_data(plan: dict[str, Any], colours: dict[str, str]) -> dict[str, Any]:
    """What dashboard.js draws: one bar per candidate, then per baseline, and
    the layouts it compares side by side (``rows``)."""
    rows: list[tuple[str, str, dict[str, str], dict[str, Any]]] = []
    for c in plan["candidates"]:
        tag = "chosen" if c["rank"] == 1 else f"#{c['rank']}"
        rows.append((tag, c["layout_rules"], dict(c["rules"]), c["cost"]))
    if not rows:  # nothing fits: the plan holds the layout with the smallest peak
        tag = "smallest peak (does not fit)"
        rows.append((tag, plan["layout_rules"], dict(plan["rules"]), plan["cost"]))
    for b in plan["baselines"]:
        if b["cost"] is not None:
            rules = b["layout_rules"] or ""
            rows.append((f"baseline {b['name']}", rules, _rules_dict(rules), b["cost"]))
    axes = sorted({a for *_, cost in rows for a in cost["comm_s_by_axis"]})
    # Collectives over several axes ("x,y") get colours after the mesh axes'.
    colours = dict(colours)
    for a in axes:
        colours.setdefault(a, AXIS_COLOURS[len(colours) % len(AXIS_COLOURS)])
    return {
        "labels": [_label_lines(f"{tag}:", rules) for tag, rules, *_ in rows],
        "chosen": 0,
        "compute": [cost["compute_s"] for *_, cost in rows],
        "comm": {
            a: [cost["comm_s_by_axis"].get(a, 0.0) for *_, cost in rows] for a in axes
        },
        "peak": [cost["peak_memory_bytes"] for *_, cost in rows],
        "capacity": plan["cost"]["memory_capacity_bytes"],
        "colours": colours,
        "rows": [
            {
                "name": tag,
                "layout_rules": rules or "(nothing split)",
                "rules": rd,
                "time_s": cost["time_s"],
                "compute_s": cost["compute_s"],
                "comm_s_by_axis": cost["comm_s_by_axis"],
                "peak_memory_bytes": cost["peak_memory_bytes"],
                "fits": bool(cost["fits"]),
            }
            for tag, rules, rd, cost in rows
        ],
        "dims": [d["name"] for d in plan["dims"]],
    }


def _detail(service: PlannerService, record: PlanRecord) -> dict[str, Any] | None:
    """The per-op and per-tensor tables (None when the graph is not stored)."""
    hit = _details.get(record.id)
    if hit is not None:
        return hit
    # One at a time: pricing a large graph is pure Python, and these pages
    # are open to anyone (a burst of first views must not starve the loop).
    with _details.computing:
        hit = _details.get(record.id)  # computed while this one waited
        if hit is not None:
            return hit
        graph_json = service.store.get_graph(record.graph_hash)
        if graph_json is None:
            return None
        try:
            detail = plan_detail(json.loads(graph_json), record.plan)
        except Exception:  # a page without its tables beats no page
            log.exception("plan %s: the per-op and per-tensor tables failed", record.id)
            return None
        _details.put(record.id, detail)
        return detail


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
            "detail": _detail(service, record),
            "measurements": [
                record_dict(m)
                for m in service.store.list_measurements(plan_id=record.id, limit=20)
            ],
            "presets": sorted(PRESETS),
            # A profile the request gave, named like a preset or not: the
            # form offers it, selected, rather than the preset of its name.
            "own_profile": plan["hardware"]["name"] not in PRESETS
            or profile_from_request(record),
            "needs_token": bool(service.settings.tokens),
            "form_error": form_error,
        },
        status,
    )


@router.get(
    "/plans/{plan_id}",
    response_class=HTMLResponse,
    responses=_html_responses(404),
    summary="Dashboard: a plan's layout, charts, tables and dimension graph",
)
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
    if devices is not None and not (devices.isascii() and devices.isdigit()):
        raise RequestError(f"device count {devices!r} is not a whole number")
    mesh = form.get("mesh_shape", "").strip() or None
    return PlanRequest(
        graph=json.loads(graph_json),
        mesh_shape=None if devices else mesh,
        num_devices=None if devices is None else int(devices),
        hardware=hardware,
        objective=form.get("objective", plan["objective"]),
        top_k=max(1, len(plan["candidates"])),
        time_limit_s=float(plan["solver"]["time_limit_s"]),
    )


@router.post(
    "/plans/{plan_id}/try",
    response_class=HTMLResponse,
    responses=_html_responses(303, 401, 404, 413, 415, 422, 429),
    openapi_extra=_FORM_BODY,
    summary="Dashboard: plan the same graph on another mesh or hardware",
)
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


def _elapsed(job: JobRecord) -> float:
    """Seconds since the job was made; a finished job's run stops at its last
    update."""
    end = job.updated_at if job.finished else time.time()
    return max(0.0, end - job.created_at)


def _job_page(
    request: Request,
    service: PlannerService,
    job: JobRecord,
    message: str = "",
    status: int = 200,
) -> Response:
    finished = job.finished
    return _page(
        request,
        "job.html",
        {
            "job": job_dict(job),
            "finished": finished,
            "elapsed_s": _elapsed(job),
            "needs_token": bool(service.settings.tokens),
            "message": message,
        },
        status,
    )


@router.get(
    "/jobs/{job_id}",
    response_class=HTMLResponse,
    responses=_html_responses(303, 404),
    summary="Dashboard: a job's progress, elapsed time and cancel button",
)
def job_page(job_id: str, request: Request, service: ServiceDep) -> Response:
    job = service.store.get_job(job_id)
    if job is None:
        return _not_found(request, "job", job_id)
    if job.status == JobStatus.DONE and job.plan_id:
        return RedirectResponse(
            result_path(job_kind(job), job.plan_id), status_code=303
        )
    return _job_page(request, service, job)


@router.post(
    "/jobs/{job_id}/cancel",
    response_class=HTMLResponse,
    responses=_html_responses(303, 401, 404, 409, 413, 415, 429),
    openapi_extra=_FORM_BODY,
    summary="Dashboard: cancel a queued or running job (the form's token)",
)
async def cancel_from_page(
    job_id: str, request: Request, service: ServiceDep, form: FormBody
) -> Response:
    job = await run_in_threadpool(service.store.get_job, job_id)
    if job is None:
        return _not_found(request, "job", job_id)
    if not form.authorized:
        return _job_page(
            request, service, job, "a valid API token is needed to cancel", 401
        )
    try:
        cancelled = await run_in_threadpool(service.cancel, job_id)
    except JobFinished as e:
        latest = await run_in_threadpool(service.store.get_job, job_id)
        return _job_page(request, service, latest or job, str(e), 409)
    if cancelled is None:
        return _not_found(request, "job", job_id)
    return RedirectResponse(f"/jobs/{job_id}", status_code=303)
