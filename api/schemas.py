"""Request and response bodies (pydantic models; they are the OpenAPI schema).

Every number a client sends is checked here, at the schema, to be finite and
in a range the cost model and the solver handle (:data:`RANGES`): no
``1e400``, ``NaN`` or ``1e-300`` bandwidth reaches the planner, and a boolean
is not an integer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

from api.store.base import JobStatus
from cost_models.hardware import PRESETS
from layout_planner.options import DEFAULT_TIME_LIMIT_S

#: What each number of a request may be: (smallest, largest).  Wide enough for
#: any real machine and model, narrow enough that the cost model's seconds
#: and bytes stay finite and the solver's integer scaling holds.
RANGES: dict[str, tuple[float, float]] = {
    "peak_flops": (1e6, 1e20),
    "memory_bytes": (1, 2**50),
    "hbm_bandwidth_bytes_per_s": (1e6, 1e16),
    "bandwidth_bytes_per_s": (1e3, 1e15),
    "latency_s": (0.0, 1.0),
    "devices_per_host": (1, 2**20),
    "seconds_per_unit": (0.0, 1e3),
    "mesh_axis_size": (1, 2**20),
    "num_devices": (1, 2**20),
    "time_limit_s": (0.001, 3600.0),
    "top_k": (1, 100),
    "max_mesh_dims": (1, 8),
}


def _float(name: str, **kw: Any) -> Any:
    lo, hi = RANGES[name]
    # strict: a JSON number (an integer too), not true or "0.5"
    return Field(ge=lo, le=hi, allow_inf_nan=False, strict=True, **kw)


def _int(name: str, **kw: Any) -> Any:
    lo, hi = RANGES[name]
    return Field(ge=int(lo), le=int(hi), strict=True, **kw)


_NAME = r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$"
AxisName = Annotated[str, Field(pattern=_NAME, max_length=64)]
AxisSize = Annotated[int, _int("mesh_axis_size")]
DimName = Annotated[str, Field(min_length=1, max_length=128)]


class LinkIn(BaseModel):
    """A link a mesh axis runs over (``LinkSpec.to_dict()``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    bandwidth_bytes_per_s: float = _float("bandwidth_bytes_per_s")
    latency_s: float = _float("latency_s")


Rate = Annotated[float, _float("seconds_per_unit")]


class CalibrationIn(BaseModel):
    """Fitted per-op-class rates per backend (``Calibration.to_dict()``)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["placement", "spmd"]
    coefficients: dict[
        Literal["placement", "spmd"],
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Rate], Field(max_length=64)
        ],
    ]


class HardwareIn(BaseModel):
    """A whole hardware profile (``HardwareProfile.to_dict()``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    peak_flops: float = _float("peak_flops")
    memory_bytes: int = _int("memory_bytes")
    hbm_bandwidth_bytes_per_s: float = _float("hbm_bandwidth_bytes_per_s")
    default_link: LinkIn
    axis_links: dict[AxisName, LinkIn] = Field(default_factory=dict, max_length=16)
    devices_per_host: int | None = _int("devices_per_host", default=None)
    intra_host_link: LinkIn | None = None
    inter_host_link: LinkIn | None = None
    calibration: CalibrationIn | None = None
    measured: dict[str, Any] | None = Field(
        None,
        description="What a calibration measured (profile files written by "
        "mtf-planner calibrate have it); not used for planning, not stored.",
    )


def _profile_dict(value: str | HardwareIn) -> str | dict[str, Any]:
    # The service reads profiles as the dicts HardwareProfile.from_dict takes.
    if isinstance(value, HardwareIn):
        d = value.model_dump(exclude={"measured"})
        if d["calibration"] is None:
            del d["calibration"]
        return d
    return value


def _kind(value: object) -> str | None:
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict | BaseModel):
        return "object"
    return None


def _by_json_type(expected: str) -> Discriminator:
    """Tells a ``Tag("string") | Tag("object")`` union apart by the JSON type,
    so that an error names only the branch the client meant
    (``mesh_shape.object.x``), not every branch."""
    return Discriminator(
        _kind,
        custom_error_type="string_or_object",
        custom_error_message=f"expected {expected}",
    )


if TYPE_CHECKING:
    # What a validated field holds: a preset name, or the profile as the dict
    # HardwareProfile.from_dict takes (``_profile_dict``).  The preset names
    # exist only at run time, so a type checker sees a string.
    Hardware = str | dict[str, Any]
else:
    PresetName = Literal[tuple(sorted(PRESETS))]
    Hardware = Annotated[
        Annotated[PresetName, Tag("string")] | Annotated[HardwareIn, Tag("object")],
        _by_json_type("a hardware preset name or a profile object (GET /v1/hardware)"),
        AfterValidator(_profile_dict),
    ]
MeshShapeIn = Annotated[
    Annotated[str, Field(min_length=1, max_length=512), Tag("string")]
    | Annotated[
        dict[AxisName, AxisSize], Field(min_length=1, max_length=8), Tag("object")
    ],
    _by_json_type(
        'a mesh shape: a string like \'x:2;y:4\' or an object like {"x": 2, "y": 4}'
    ),
]
LayoutRulesIn = Annotated[
    Annotated[str, Field(max_length=4096), Tag("string")]
    | Annotated[dict[DimName, AxisName], Field(max_length=256), Tag("object")],
    _by_json_type(
        "layout rules: a string like 'batch:x;d_ff:y' or an object like "
        '{"batch": "x"}'
    ),
]

LEARNED_DOC = (
    "Plan a preset named in 'hardware' with its profile refitted from the "
    "measured steps the service stores (POST /v1/measurements) on 'backend', "
    "when it has any; false: the preset as shipped.  The answer's 'profile' "
    "says which was used."
)
BACKEND_DOC = (
    "The lowering backend the plan will run on: whose measurements refit the "
    "profile (see use_measurements)."
)
Backend = Literal["placement", "spmd"]

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
    mesh_shape: MeshShapeIn | None = Field(None, description=_MESH_DOC)
    num_devices: int | None = _int(
        "num_devices",
        default=None,
        description="A device count: the mesh shape is searched too.",
    )
    hardware: Hardware = Field("cpu-host", description=_HW_DOC)
    objective: Literal["time", "memory"] = "time"
    memory_limit_bytes: int | None = _int(
        "memory_bytes",
        default=None,
        description="Per-device bytes; overrides the hardware's capacity.",
    )
    max_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        strict=True,
        description="Plan for this fraction of device memory.",
    )
    top_k: int = _int("top_k", default=5, description="How many ranked candidates.")
    time_limit_s: float = _float(
        "time_limit_s",
        default=DEFAULT_TIME_LIMIT_S,
        description="Solver wall-clock budget.",
    )
    max_mesh_dims: int = _int(
        "max_mesh_dims",
        default=2,
        description="With num_devices: at most this many mesh axes.",
    )
    use_measurements: bool = Field(True, strict=True, description=LEARNED_DOC)
    backend: Backend = Field("placement", description=BACKEND_DOC)


class EvaluateRequest(BaseModel):
    """One user-given layout to price and check."""

    model_config = ConfigDict(extra="forbid")

    graph: dict[str, Any] = Field(description=_GRAPH_DOC)
    mesh_shape: MeshShapeIn = Field(description=_MESH_DOC)
    layout_rules: LayoutRulesIn = Field(
        description='\'batch:x;d_ff:y\' or {"batch": "x"}.'
    )
    hardware: Hardware = Field("cpu-host", description=_HW_DOC)
    memory_limit_bytes: int | None = _int("memory_bytes", default=None)


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: a short code and a message naming the bad value."""

    error: str
    detail: str
    errors: list[dict[str, Any]] | None = None
    error_id: str | None = Field(
        None, description="5xx only: the id the service's log has the details under."
    )


class ProfileUsedOut(BaseModel):
    """Which hardware profile a plan was made with (``api.learned.ProfileUsed``)."""

    name: str
    backend: str
    source: Literal["base", "refitted", "request"] = Field(
        description="base: the preset as shipped; refitted: the preset "
        "refitted from 'measurements' measured steps on 'backend'; request: a "
        "profile object the request gave"
    )
    measurements: int = Field(ge=0)
    use_measurements: bool
    text: str


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
    profile: ProfileUsedOut | None = Field(
        None, description="the hardware profile used (absent on older plans)"
    )


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
    kind: Literal["plan", "scale"] = Field(
        description="plan: a layout plan (GET /v1/plans/{plan_id}); scale: a "
        "scale plan (GET /v1/scale-plans/{plan_id})"
    )
    result_url: str | None = Field(
        description="where the finished job's plan is (null until done)"
    )
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
