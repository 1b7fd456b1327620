"""``/v1/measurements``: measured steps of stored plans, and the profiles they refit.

A training run reports a plan's measured step time (``mtf-train --report``,
or any client): the service stores it next to what the plan predicted, and
refits the plan's hardware profile from every measurement made on it
(``cost_models.calibration.refit``: least squares on the per-op-class rates,
starting from the base profile's own rates).  ``GET
/v1/measurements/profile?hardware=NAME`` gives the refitted profile, and a
plan or scale-plan request that names that hardware is planned with it by
default (:mod:`api.learned`; ``use_measurements: false`` opts out).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from api.deps import JsonBody, ServiceDep, json_request_body, parse_body
from api.learned import (
    FEATURES,
    MAX_MEASURED_FACTOR,
    MAX_REFIT_ROWS,
    MAX_STEP_S,
    MIN_STEP_S,
    GraphMissing,
    graph_doc,
    named_like_a_preset,
    plausible,
    refit_profile,
)
from api.routes import error_responses
from api.store.base import MeasurementRecord, PlanRecord, Store, StoreUnavailable
from cost_models.calibration import predict_s
from cost_models.costs import evaluate
from cost_models.hardware import HardwareProfile
from mtf_core.errors import MtfError

router = APIRouter(prefix="/v1", tags=["measurements"])

_ID = r"^[A-Za-z0-9_\-]{1,64}$"


class MeasurementIn(BaseModel):
    """A measured step of a stored plan."""

    model_config = ConfigDict(extra="forbid")

    plan_id: str = Field(pattern=_ID, description="The plan (GET /v1/plans).")
    step_s: float = Field(
        ge=MIN_STEP_S,
        le=MAX_STEP_S,
        allow_inf_nan=False,
        strict=True,  # a number: not true, not "0.01"
        description="Measured seconds per step (1e-6 to 1e6), within a factor "
        f"of {MAX_MEASURED_FACTOR:g} of the plan's prediction.",
    )
    backend: Literal["placement", "spmd"] = "placement"
    steps: int = Field(1, ge=1, le=10**9, strict=True, description="Steps timed.")
    profile: Annotated[
        dict[
            Annotated[str, Field(max_length=64)],
            Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False, strict=True)],
        ],
        Field(max_length=64),
    ] = Field(
        default_factory=dict,
        description="Optional per-op profile: seconds per op class or op type.",
    )
    source: str = Field("", max_length=200, description="Who measured (free text).")


class MeasurementOut(BaseModel):
    id: str
    plan_id: str
    hardware: str
    backend: str
    measured_s: float
    predicted_s: float
    error: float = Field(description="predicted / measured - 1")
    created_at: float
    detail: dict[str, Any]


class MeasurementPosted(MeasurementOut):
    refit_predicted_s: float = Field(
        description="The plan's step time under the profile refitted with this "
        "and earlier measurements of the same hardware."
    )
    refit_measurements: int = Field(
        description="How many measurements that refit used (the newest "
        f"{MAX_REFIT_ROWS} of this hardware and backend whose plan is stored)."
    )


class MeasurementList(BaseModel):
    measurements: list[MeasurementOut]


def record_dict(m: MeasurementRecord) -> dict[str, Any]:
    return {
        "id": m.id,
        "plan_id": m.plan_id,
        "hardware": m.hardware,
        "backend": m.backend,
        "measured_s": m.measured_s,
        "predicted_s": m.predicted_s,
        "error": m.predicted_s / m.measured_s - 1.0,
        "created_at": m.created_at,
        "detail": m.detail,
    }


def _plan_hardware(plan: PlanRecord) -> HardwareProfile:
    return HardwareProfile.from_dict(plan.plan["hardware"])


def _predict(store: Store, plan: PlanRecord, hw: HardwareProfile) -> float:
    try:
        if hw.rates is not None:
            return predict_s(FEATURES.of(store, plan), hw.rates)
        doc = graph_doc(store, plan)
    except GraphMissing as e:
        raise HTTPException(404, str(e)) from None
    from mtf_core.serialization import graph_from_dict

    loaded = graph_from_dict(doc)
    p = plan.plan
    cost = evaluate(
        loaded.graph, p["mesh_shape"], p["layout_rules"], hw, loaded.outputs
    )
    return cost.time_s


def _post(store: Store, body: MeasurementIn) -> dict[str, Any]:
    plan = store.get_plan(body.plan_id)
    if plan is None:
        raise HTTPException(404, f"no plan {body.plan_id!r}")
    if named_like_a_preset(plan):
        name = plan.summary["hardware"]
        raise HTTPException(
            422,
            f"plan {plan.id} was made with a hardware profile its request gave, "
            f"named {name!r} like the preset; its measurements cannot refit that "
            f"preset: measure a plan made with hardware {name!r} (the name), or "
            "give the profile a name of its own",
        )
    hw = _plan_hardware(plan).for_backend(body.backend)
    predicted = _predict(store, plan, hw)
    if not plausible(body.step_s, predicted):
        raise HTTPException(
            422,
            f"step_s {body.step_s:g} s is {body.step_s / predicted:.3g} times plan "
            f"{plan.id}'s predicted step ({predicted:.3g} s on {hw.name}); expected "
            f"a step within a factor of {MAX_MEASURED_FACTOR:g} of the prediction "
            "(a step of that plan, measured on that hardware, in seconds)",
        )
    record = MeasurementRecord(
        id=uuid.uuid4().hex,
        plan_id=plan.id,
        hardware=hw.name,
        backend=body.backend,
        measured_s=body.step_s,
        predicted_s=predicted,
        created_at=time.time(),
        detail={
            "mesh_shape": plan.plan["mesh_shape"],
            "layout_rules": plan.plan["layout_rules"],
            "steps": body.steps,
            "profile": body.profile,
            "source": body.source,
        },
    )
    store.put_measurement(record)
    fitted = refit_profile(store, hw.name, body.backend)
    assert fitted is not None, "a measurement was just stored"
    return {
        **record_dict(record),
        "refit_predicted_s": _predict(store, plan, fitted[0]),
        "refit_measurements": fitted[1],
    }


@router.post(
    "/measurements",
    response_model=MeasurementPosted,
    status_code=201,
    responses=error_responses(400, 401, 404, 413, 415, 422, 429, 503),
    openapi_extra=json_request_body(MeasurementIn),
    summary="Report a plan's measured step time",
)
async def post_measurement(raw: JsonBody, service: ServiceDep) -> dict[str, Any]:
    """Stores a measured step of a stored plan (a ``MeasurementIn``) next to
    the plan's prediction on its hardware profile, and answers with the
    prediction of the profile refitted from every measurement of that
    hardware and backend."""
    body = await parse_body(MeasurementIn, raw)
    try:
        out = await run_in_threadpool(_post, service.store, body)
    except MtfError as e:
        raise HTTPException(422, f"cannot price plan {body.plan_id}: {e}") from None
    # Plans asked for from now on, on this replica, are made with it (if the
    # store is busy now, the next heartbeat reads it).
    with contextlib.suppress(StoreUnavailable):
        await run_in_threadpool(service.refresh_measurements)
    return out


@router.get(
    "/measurements",
    response_model=MeasurementList,
    responses=error_responses(422, 503),
    summary="Measured steps",
)
def list_measurements(
    service: ServiceDep,
    plan_id: Annotated[str | None, Query(pattern=_ID)] = None,
    hardware: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Newest first, of one plan and/or one hardware profile."""
    rows = service.store.list_measurements(plan_id, hardware, limit)
    return {"measurements": [record_dict(m) for m in rows]}


@router.get(
    "/measurements/profile",
    responses=error_responses(404, 422, 503),
    summary="A hardware profile refitted from measured steps",
)
def measured_profile(
    service: ServiceDep,
    hardware: Annotated[str, Query(min_length=1, max_length=64)],
    backend: Literal["placement", "spmd"] = "placement",
) -> dict[str, Any]:
    """The profile ``hardware`` with its per-op-class rates refitted from the
    measurements reported for it on ``backend``: send it as a plan request's
    ``hardware`` to plan with what was measured."""
    try:
        fitted = refit_profile(service.store, hardware, backend)
    except MtfError as e:
        raise HTTPException(422, f"cannot refit {hardware!r}: {e}") from None
    if fitted is None:
        raise HTTPException(
            404, f"no measurements of hardware {hardware!r} on backend {backend!r}"
        )
    return fitted[0].to_dict()
