"""Bodies of ``/v1/scale-plans``: a Transformer's shape in, a scale plan out.

Every number is checked here, as :mod:`api.schemas` checks a plan request's:
integers are strict (no ``true``, no ``2.0``) and within :data:`SCALE_RANGES`,
floats are finite and in range, so a ``NaN``, ``1e400`` or ``10**30`` layer
count is a 422 naming the field and the value before anything is planned.
Names (dtypes, schedules, recomputation options) are short strings checked by
the planner, whose errors name the value and what was expected.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from api.schemas import BACKEND_DOC, LEARNED_DOC, RANGES, Backend, ProfileUsedOut

#: (smallest, largest) of each number of a scale-plan request.  The layer
#: count bounds the stage graph the planner builds (its size is linear in the
#: layers of a stage); the others only need to keep bytes and flops finite.
SCALE_RANGES: dict[str, tuple[float, float]] = {
    "num_layers": (1, 256),
    "d_model": (1, 2**17),
    "heads": (1, 1024),
    "d_kv": (1, 2**12),
    "d_ff": (1, 2**19),
    "vocab": (1, 2**22),
    "length": (1, 2**20),
    "batch": (1, 2**20),
    "experts": (0, 4096),
    "devices": (1, 4096),
    "stage_count": (1, 256),
    "tensor_size": (1, 4096),
    "sequence_size": (1, 4096),
    "micro_batches": (1, 2**20),
    "time_limit_s": RANGES["time_limit_s"],
    "memory_bytes": RANGES["memory_bytes"],
}


def _int(name: str, **kw: Any) -> Any:
    lo, hi = SCALE_RANGES[name]
    return Field(ge=int(lo), le=int(hi), strict=True, **kw)


def _name(default: str, what: str) -> Any:
    """A short name the planner checks (its error names the value)."""
    return Field(
        default,
        min_length=1,
        max_length=32,
        pattern=r"^[A-Za-z0-9_]+$",
        description=what,
    )


StageCount = Annotated[int, _int("stage_count")]
TensorSize = Annotated[int, _int("tensor_size")]
SequenceSize = Annotated[int, _int("sequence_size")]


class TransformerShape(BaseModel):
    """The model: a decoder-only LM, or an encoder-decoder (``num_layers``
    encoder and as many decoder layers)."""

    model_config = ConfigDict(extra="forbid")

    num_layers: int = _int("num_layers")
    d_model: int = _int("d_model")
    heads: int = _int("heads")
    d_kv: int = _int("d_kv")
    d_ff: int = _int("d_ff")
    vocab: int = _int("vocab")
    length: int = _int("length")
    batch: int = _int("batch", description="sequences per step (the global batch)")
    experts: int = _int(
        "experts", default=0, description="0: dense; >0: top-1 mixture of experts"
    )
    encoder_decoder: bool = Field(False, strict=True)


class RecomputeIn(BaseModel):
    """One recomputation option: per block class."""

    model_config = ConfigDict(extra="forbid")

    attention: str = Field(
        pattern=r"^[a-z]{1,16}$", description="'none', 'scores' or 'block'"
    )
    ffn: str = Field(pattern=r"^[a-z]{1,16}$", description="'none' or 'block'")


class ScalePlanRequest(BaseModel):
    """``POST /v1/scale-plans``: what to plan, and the choices to fix."""

    model_config = ConfigDict(extra="forbid")

    model: TransformerShape
    devices: int = _int("devices")
    hardware: str = Field(
        "h100-nvlink-ib", min_length=1, max_length=64, description="a preset name"
    )
    activation_dtype: str = _name(
        "bfloat16", "matmuls, activations, their gradients and collectives"
    )
    master_dtype: str = _name("float32", "weights and optimizer slots")
    optimizer: str = _name("adam", "'adam' or 'sgd'")
    stages: list[StageCount] | None = Field(
        None,
        min_length=1,  # [] would try no mesh: omit the field to search
        max_length=16,
        description="pipeline stage counts to try (default: powers of two "
        "dividing the layers and the devices)",
    )
    tensor: list[TensorSize] | None = Field(
        None, min_length=1, max_length=16, description="tensor-axis sizes to try"
    )
    sequence: list[SequenceSize] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="sequence-axis (sp) sizes to try, each dividing the length "
        "(default: [1], no sequence axis)",
    )
    micro_batches: int | None = _int("micro_batches", default=None)
    schedule: str = _name("1f1b", "'1f1b' or 'gpipe'")
    recompute: list[RecomputeIn] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="recomputation options to try, least first (default: none, "
        "attention scores, both blocks)",
    )
    memory_limit_bytes: int | None = _int("memory_bytes", default=None)
    time_limit_s: float = Field(
        5.0,
        ge=SCALE_RANGES["time_limit_s"][0],
        le=SCALE_RANGES["time_limit_s"][1],
        allow_inf_nan=False,
        strict=True,  # a number: not true
        description="CP-SAT seconds per trial (the service caps the whole run)",
    )
    use_measurements: bool = Field(True, strict=True, description=LEARNED_DOC)
    backend: Backend = Field("placement", description=BACKEND_DOC)


class ScalePlanSummary(BaseModel):
    """A stored scale plan's listing row."""

    id: str
    created_at: str
    model: str
    devices: int
    hardware: str
    mesh_shape: str
    micro_batches: int
    schedule: str
    recompute: str
    status: str
    fits: bool
    step_time_s: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    mfu: float | None
    profile: ProfileUsedOut | None = Field(
        None, description="the hardware profile used (absent on older plans)"
    )


class ScalePlanBody(BaseModel):
    """The plan (``api.scale_planning.scale_plan_dict``)."""

    status: str
    fits: bool
    devices: int
    hardware: str
    mesh: dict[str, int] = Field(description="pp, dp, sp, tp")
    mesh_shape: str
    stage_mesh: str
    stage_layout_rules: str
    stages: int
    layers_per_stage: int
    micro_batches: int
    sequences_per_micro_batch: int
    schedule: str
    in_flight: int
    dtypes: dict[str, str]
    sharded_classes: list[str]
    slot_sharded_classes: list[str]
    weight_classes: list[dict[str, Any]] = Field(
        description="per storage name: mesh axis, what sharding saves "
        "(saves_step_time_s, saves_peak_memory_bytes), the alternatives"
    )
    recompute: dict[str, Any] = Field(
        description="the chosen option and each option's step time and peak"
    )
    step: dict[str, float | int] = Field(
        description="micro_batch_work_s + sends_s + bubble_s + once_per_step_s "
        "= step_time_s"
    )
    memory: dict[str, int]
    model_flops: float
    mfu: float | None
    trials: list[dict[str, Any]]
    planning_s: float
    explain: str


class ScalePlanOut(ScalePlanSummary):
    """``POST /v1/scale-plans`` and ``GET /v1/scale-plans/{id}``."""

    cached: bool
    request_hash: str
    request: dict[str, Any]
    plan: ScalePlanBody


class ScalePlanList(BaseModel):
    plans: list[ScalePlanSummary]
    total: int
