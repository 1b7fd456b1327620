"""Request and response bodies (pydantic models; they are the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]

_GRAPH_DOC = (
    "A serialized mtf graph: the versioned JSON document of "
    "docs/graph-format.md (``mtf.graph_to_dict``)."
)
_MESH_DOC = 'Mesh shape: \'x:2;y:4\' or {"x": 2, "y": 4}.'
_HW_DOC = (
    "A hardware preset name (GET /v1/hardware) or a whole profile "
    "(HardwareProfile.to_dict())."
)


class PlanRequest(BaseModel):
    """What to plan: a graph, where (a mesh shape or a device count), on what."""

    model_config = ConfigDict(extra="forbid")

    graph: dict[str, Any] = Field(description=_GRAPH_DOC)
    mesh_shape: str | dict[str, int] | None = Field(None, description=_MESH_DOC)
    num_devices: int | None = Field(
        None, ge=1, description="A device count: the mesh shape is searched too."
    )
    hardware: str | dict[str, Any] = Field("cpu-host", description=_HW_DOC)
    objective: Literal["time", "memory"] = "time"
    memory_limit_bytes: int | None = Field(
        None, ge=1, description="Per-device bytes; overrides the hardware's capacity."
    )
    max_memory_fraction: float | None = Field(
        None, gt=0, le=1, description="Plan for this fraction of device memory."
    )
    top_k: int = Field(5, ge=1, description="How many ranked candidates.")
    time_limit_s: float = Field(10.0, gt=0, description="Solver wall-clock budget.")
    max_mesh_dims: int = Field(
        2, ge=1, description="With num_devices: at most this many mesh axes."
    )


class EvaluateRequest(BaseModel):
    """One user-given layout to price and check."""

    model_config = ConfigDict(extra="forbid")

    graph: dict[str, Any] = Field(description=_GRAPH_DOC)
    mesh_shape: str | dict[str, int] = Field(description=_MESH_DOC)
    layout_rules: str | dict[str, str] = Field(
        description='\'batch:x;d_ff:y\' or {"batch": "x"}.'
    )
    hardware: str | dict[str, Any] = Field("cpu-host", description=_HW_DOC)
    memory_limit_bytes: int | None = Field(None, ge=1)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: a short code and a message naming the bad value."""

    error: str
    detail: str
    errors: list[dict[str, Any]] | None = None


class PlanSummary(BaseModel):
    """One stored plan, as listed."""

    id: str
    created_at: str
    graph_name: str
    graph_hash: str
    mesh_shape: str
    hardware: str
    objective: str
    status: str
    layout_rules: str
    fits: bool
    time_s: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    solve_time_s: float


class PlanOut(PlanSummary):
    """A plan: the summary, whether it came from the store without solving,
    and the whole ``LayoutPlan.to_dict()``."""

    cached: bool
    request_hash: str
    plan: dict[str, Any]


class PlanList(BaseModel):
    plans: list[PlanSummary]
    total: int


class JobOut(BaseModel):
    """A solve run off the request path; ``plan_id`` once ``status`` is done."""

    id: str
    status: JobStatus
    phase: str
    progress: float = Field(ge=0, le=1)
    created_at: str
    updated_at: str
    error: str | None
    plan_id: str | None
    request: dict[str, Any]


class JobList(BaseModel):
    jobs: list[JobOut]


class EvaluateOut(BaseModel):
    """``valid`` false: ``reason`` says why the lowering rejects the layout."""

    valid: bool
    reason: str | None
    fits: bool | None
    cost: dict[str, Any] | None


class HardwareList(BaseModel):
    presets: dict[str, dict[str, Any]]


class HealthOut(BaseModel):
    status: Literal["ok", "degraded"]
    store: str
    workers: int
    workers_alive: int
    queue_depth: int
    running: int
