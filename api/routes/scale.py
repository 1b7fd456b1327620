"""``/v1/scale-plans``: a Transformer's mesh, pipeline, dtypes, sharded weights
and recomputation (:func:`layout_planner.choices.plan_transformer`), and the
dashboard's pages for them (``/scale-plans``).

A request is checked in the server (:func:`api.scale_planning.scale_spec`:
a 422 naming the value), answered from the store when the same canonical
request was planned before (``cached: true``), else planned by a job
(``kind: "scale"``) on the service's solve workers, the job machinery the
layout plans use (:meth:`api.service.PlannerService.submit`): progress per
mesh tried, cancel, one job per request across replicas, 429 when the queue
is full.  The answer waits ``sync_wait_s`` for the job, then is a 202 with
it.  A run is capped at the service's ``max_time_limit_s``: past it the
worker is stopped and the job fails saying so (a 422 ``too_slow`` to a
request still waiting: narrow ``stages``, ``tensor`` or ``recompute``).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError

from api.deps import FormBody, JsonBody, ServiceDep, json_request_body, parse_body
from api.errors import clean_validation_error, error_response, quoted
from api.planning import RequestError
from api.routes import error_responses
from api.routes.dashboard import _html_responses, _not_found, _page
from api.routes.jobs import answer_job
from api.scale_schemas import (
    SCALE_RANGES,
    ScalePlanList,
    ScalePlanOut,
    ScalePlanRequest,
)
from api.schemas import JobOut
from api.service import PlannerService, iso, job_dict, job_kind
from api.store import PlanRecord
from api.workers import QueueFull
from cost_models.hardware import PRESETS
from mtf_core.errors import MtfError

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["scale plans"])
pages = APIRouter(tags=["dashboard"])

JSON = "application/json"


def scale_body(record: PlanRecord, cached: bool) -> bytes:
    """``ScalePlanOut`` as JSON: the summary, then the stored request and plan."""
    head: dict[str, Any] = {
        "id": record.id,
        "created_at": iso(record.created_at),
        **record.summary,
        "cached": cached,
        "request_hash": record.request_hash,
    }
    text = json.dumps(head, separators=(",", ":"), allow_nan=False)
    # plan_json is '{"request":...,"plan":...}': splice its members in.
    return (text[:-1] + "," + record.plan_json[1:]).encode()


@router.post(
    "/scale-plans",
    response_model=ScalePlanOut,
    responses={
        202: {"model": JobOut, "description": "Still planning: poll the job."},
        **error_responses(400, 401, 409, 413, 415, 422, 429, 503),
    },
    # A token only when the service has tokens (MTF_PLANNER_API_TOKENS): the
    # empty requirement says a request without one may be answered.
    openapi_extra={
        **json_request_body(ScalePlanRequest),
        "security": [{}],  # added to the bearer requirement FastAPI writes
    },
    summary="Plan a Transformer at scale: mesh, pipeline, dtypes, ZeRO, recomputation",
)
async def create_scale_plan(raw: JsonBody, service: ServiceDep) -> Response:
    """The fastest fitting ``pp x dp x tp`` plan for a Transformer shape on
    ``devices`` devices (``plan_transformer``), with what each choice saves
    or costs.  The body is a ``ScalePlanRequest``.

    From the store when this request was planned before (``cached: true``);
    else a job (``kind: "scale"``, progress per mesh tried) that this answer
    waits for up to ``sync_wait_s``, then answers 202 with the job to poll
    (its ``result_url`` once done).  An identical request meanwhile joins
    that job."""
    body = await parse_body(ScalePlanRequest, raw)
    # RequestError: a 422 naming the value.  A new refit reads the store.
    if service.spec_is_cheap(body.hardware, body.backend):
        spec = service.scale_spec(body)
    else:
        spec = await run_in_threadpool(service.scale_spec, body)
    record = await run_in_threadpool(service.stored, spec)
    if record is not None:
        return Response(scale_body(record, cached=True), media_type=JSON)
    try:
        job, fut = await run_in_threadpool(service.submit, spec)
    except QueueFull as e:
        return error_response(429, str(e), headers={"Retry-After": "5"})
    out = await answer_job(
        service, job, fut, service.settings.sync_wait_s, "POST /v1/scale-plans"
    )
    if isinstance(out, Response):
        return out
    record, cached = out
    return Response(scale_body(record, cached), media_type=JSON)


@router.get(
    "/scale-plans",
    response_model=ScalePlanList,
    responses=error_responses(422),
    summary="List stored scale plans",
)
def list_scale_plans(
    service: ServiceDep,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=10**9),
) -> dict[str, object]:
    records, total = service.store.list_scale_plans(limit, offset)
    return {
        "plans": [
            {"id": r.id, "created_at": iso(r.created_at), **r.summary} for r in records
        ],
        "total": total,
    }


@router.get(
    "/scale-plans/{plan_id}",
    response_model=ScalePlanOut,
    responses=error_responses(404, 422),
    summary="Get one scale plan",
)
def get_scale_plan(plan_id: str, service: ServiceDep) -> Response:
    record = service.store.get_scale_plan(plan_id)
    if record is None:
        return error_response(404, f"there is no scale plan {quoted(plan_id)}")
    return Response(scale_body(record, cached=True), media_type=JSON)


# -- dashboard ----------------------------------------------------------------------------

#: The form's fields: (name, label, default shown).
FORM_FIELDS = (
    ("num_layers", "layers", "4"),
    ("d_model", "d_model", "1024"),
    ("heads", "heads", "16"),
    ("d_kv", "d_kv", "64"),
    ("d_ff", "d_ff", "4096"),
    ("vocab", "vocab", "32000"),
    ("length", "length", "1024"),
    ("batch", "batch", "64"),
    ("experts", "experts", "0"),
    ("devices", "devices", "8"),
)
_INTS = {name for name, _, _ in FORM_FIELDS}
_OPTIONAL = ("stages", "tensor", "sequence", "micro_batches", "memory_limit_gib")
_SCALE_FORM_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {
                    "type": "object",
                    "properties": {
                        name: {"type": "string", "maxLength": 64}
                        for name in (
                            *_INTS,
                            *_OPTIONAL,
                            "hardware",
                            "activation_dtype",
                            "master_dtype",
                            "schedule",
                            "use_measurements",
                            "token",
                        )
                    },
                }
            }
        },
    }
}


def _whole(name: str, text: str) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise RequestError(f"{name} {text!r} is not a whole number")
    return int(text)


def form_request(fields: dict[str, str]) -> ScalePlanRequest:
    """The dashboard form as a ``ScalePlanRequest`` (RequestError or
    ValidationError naming the field)."""
    model = {
        name: _whole(name, fields.get(name, default) or default)
        for name, _, default in FORM_FIELDS
        if name != "devices"
    }
    body: dict[str, Any] = {
        "model": model,
        "devices": _whole("devices", fields.get("devices", "8") or "8"),
        "hardware": fields.get("hardware") or "h100-nvlink-ib",
        "activation_dtype": fields.get("activation_dtype") or "bfloat16",
        "master_dtype": fields.get("master_dtype") or "float32",
        "schedule": fields.get("schedule") or "1f1b",
    }
    use = (fields.get("use_measurements") or "true").strip().lower()
    if use not in ("true", "false"):
        raise RequestError(f"use_measurements {use!r}; expected 'true' or 'false'")
    body["use_measurements"] = use == "true"
    for name in ("stages", "tensor", "sequence"):
        text = fields.get(name, "").strip()
        if text:
            body[name] = [_whole(name, part) for part in text.split(",")]
    if fields.get("micro_batches", "").strip():
        body["micro_batches"] = _whole("micro_batches", fields["micro_batches"])
    gib = fields.get("memory_limit_gib", "").strip()
    if gib:
        try:
            value = float(gib)
        except ValueError:
            raise RequestError(f"memory_limit_gib {gib!r} is not a number") from None
        lo, hi = SCALE_RANGES["memory_bytes"]
        nbytes = int(value * 2**30) if math.isfinite(value) else -1
        if not lo <= nbytes <= hi:
            raise RequestError(
                f"memory_limit_gib {gib!r}; expected a number of GiB from "
                f"{lo} B to {hi // 2**30} GiB"
            )
        body["memory_limit_bytes"] = nbytes
    return ScalePlanRequest.model_validate(body)


def _index(
    request: Request,
    service: PlannerService,
    form: dict[str, str] | None = None,
    form_error: str = "",
    status: int = 200,
) -> Response:
    records, total = service.store.list_scale_plans(200)
    jobs = [job_dict(j) for j in service.store.list_jobs(100) if job_kind(j) == "scale"]
    return _page(
        request,
        "scale_index.html",
        {
            "plans": [
                {"id": r.id, "created_at": iso(r.created_at), **r.summary}
                for r in records
            ],
            "total": total,
            "jobs": jobs[:10],
            "fields": FORM_FIELDS,
            "form": form or {},
            "presets": sorted(PRESETS),
            "needs_token": bool(service.settings.tokens),
            "form_error": form_error,
        },
        status,
    )


@pages.get(
    "/scale-plans",
    summary="Dashboard: stored scale plans and a form to request one",
    response_class=HTMLResponse,
)
def scale_index(request: Request, service: ServiceDep) -> Response:
    return _index(request, service)


@pages.post(
    "/scale-plans",
    responses=_html_responses(303, 401, 413, 415, 422, 429),
    openapi_extra=_SCALE_FORM_BODY,
    summary="Dashboard: plan a Transformer at scale from the form (its token)",
    response_class=HTMLResponse,
)
async def scale_from_form(
    request: Request, service: ServiceDep, form: FormBody
) -> Response:
    fields = {k: v[:64] for k, v in form.fields.items() if k != "token"}
    if not form.authorized:
        return await run_in_threadpool(
            _index, request, service, fields, "a valid API token is needed to plan", 401
        )
    try:
        spec = await run_in_threadpool(
            lambda: service.scale_spec(form_request(form.fields))
        )
        record = await run_in_threadpool(service.stored, spec)
        if record is not None:
            return RedirectResponse(f"/scale-plans/{record.id}", status_code=303)
        job, _ = await run_in_threadpool(service.submit, spec)
    except ValidationError as e:
        # As the JSON API's 422: the message names the value.
        err = clean_validation_error(e.errors(include_url=False)[0])
        message = f"{'.'.join(err['loc'])}: {err['msg']}"
        return await run_in_threadpool(_index, request, service, fields, message, 422)
    except (MtfError, ValueError) as e:
        return await run_in_threadpool(_index, request, service, fields, str(e), 422)
    except QueueFull as e:
        return await run_in_threadpool(_index, request, service, fields, str(e), 429)
    # The job's page shows its progress and forwards to the plan when done.
    return RedirectResponse(f"/jobs/{job.id}", status_code=303)


def chart_data(plan: dict[str, Any]) -> dict[str, Any]:
    """What scale.js draws: the step's parts (one stacked bar), and each
    recomputation option's step time and peak on the chosen mesh."""
    step = plan["step"]
    options = [o for o in plan["recompute"]["options"] if o["step_time_s"] is not None]
    return {
        "parts": {
            "micro-batch work": step["micro_batch_work_s"],
            "sends": step["sends_s"],
            "bubble": step["bubble_s"],
            "once per step": step["once_per_step_s"],
        },
        "step_time_s": step["step_time_s"],
        "options": [f"attention={o['attention']} ffn={o['ffn']}" for o in options],
        "option_time_s": [o["step_time_s"] for o in options],
        "option_peak_bytes": [o["peak_memory_bytes"] for o in options],
        "chosen": next((i for i, o in enumerate(options) if o["chosen"]), 0),
        "capacity": plan["memory"]["memory_capacity_bytes"],
    }


@pages.get(
    "/scale-plans/{plan_id}",
    responses=_html_responses(404),
    summary="Dashboard: a scale plan's choices, what each saves or costs, the step",
    response_class=HTMLResponse,
)
def scale_page(plan_id: str, request: Request, service: ServiceDep) -> Response:
    record = service.store.get_scale_plan(plan_id)
    if record is None:
        return _not_found(request, "scale plan", plan_id)
    doc = json.loads(record.plan_json)
    return _page(
        request,
        "scale_plan.html",
        {
            "rec": record,
            "summary": record.summary,
            "req": doc["request"],
            "plan": doc["plan"],
            "created": iso(record.created_at)[:19].replace("T", " "),
            "chart": chart_data(doc["plan"]),
        },
    )
