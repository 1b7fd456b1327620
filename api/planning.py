"""Client requests -> checked, canonical plan specs with a content hash.

Strings and dicts from the wire are parsed here, once (mesh shapes, hardware,
limits); the rest of the service passes :class:`PlanSpec` objects.  Two
requests that mean the same thing (``"x:2;y:4"`` and ``{"x": 2, "y": 4}``,
keys in another order) get the same :attr:`PlanSpec.request_hash`, which is
what the store caches plans under.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api.learned import BASE, REFITTED, REQUEST, Fit, ProfileUsed
from api.schemas import PlanRequest
from api.settings import Settings
from cost_models.hardware import PRESETS, HardwareProfile
from layout_planner.errors import PlannerError
from layout_planner.options import SERVER_CHOSEN, PlanOptions
from layout_planner.plan import FORMAT_VERSION as PLAN_FORMAT_VERSION
from layout_planner.plan import mesh_text
from layout_planner.program import Objective
from mtf_core.errors import MtfError
from mtf_core.graph import Graph
from mtf_core.serialization import LoadedGraph, graph_from_dict
from mtf_core.shapes import Shape, convert_to_shape

#: Bump when the planner's answers change for the same request (new cost model).
CACHE_VERSION = 1


class RequestError(MtfError, ValueError):
    """A request is well-formed JSON but asks for something invalid (HTTP 422)."""


#: ``(preset name, backend) -> (refitted profile, measurements)`` or None:
#: what the store's measurements teach (``LearnedProfiles.profile``).
Learned = Callable[[str, str], Fit | None]


@dataclass(frozen=True)
class PlanSpec:
    """One plan request, checked and canonical: the graph, the mesh and the
    :class:`~layout_planner.options.PlanOptions`."""

    graph_json: str  # canonical: sorted keys, no spaces
    graph_hash: str
    graph_name: str
    num_operations: int
    mesh_shape: str | None  # canonical 'x:2,y:4'
    num_devices: int | None
    options: PlanOptions
    request_hash: str
    profile: ProfileUsed

    #: What a job of this spec makes (``JobOut.kind``).
    kind = "plan"

    @property
    def hardware_name(self) -> str:
        return self.options.hardware.name

    def describe(self) -> dict[str, Any]:
        """The request without the graph (for job rows and the dashboard)."""
        opts = self.options
        return {
            "kind": self.kind,
            "graph_name": self.graph_name,
            "graph_hash": self.graph_hash,
            "num_operations": self.num_operations,
            "mesh_shape": None
            if self.mesh_shape is None
            else mesh_text(self.mesh_shape),
            "num_devices": self.num_devices,
            "hardware": self.hardware_name,
            "objective": opts.objective.value,
            "memory_limit_bytes": opts.memory_limit_bytes,
            "top_k": opts.top_k,
            "time_limit_s": opts.time_limit_s,
            "max_mesh_dims": opts.max_mesh_dims,
            "profile": self.profile.to_dict(),
        }

    def task(self, solver_threads: int) -> dict[str, Any]:
        """What a worker process needs to solve it (plain, picklable data;
        ``api.worker_main.solve_task`` reads it)."""
        return {
            "graph_json": self.graph_json,
            "mesh_shape": self.mesh_shape,
            "num_devices": self.num_devices,
            "options": self.options.replace(num_workers=solver_threads).to_dict(),
        }


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_mesh(value: str | Mapping[str, int], settings: Settings) -> Shape:
    """A mesh shape from ``'x:2;y:4'`` or ``{"x": 2, "y": 4}``, within limits."""
    if isinstance(value, Mapping):
        for name, size in value.items():
            if isinstance(size, bool) or not isinstance(size, int):
                raise RequestError(
                    f"mesh_shape axis {name!r} has size {size!r}; expected an integer"
                )
        text = ";".join(f"{k}:{v}" for k, v in value.items())
    else:
        text = value
    try:
        mesh = convert_to_shape(text)
    except MtfError as e:
        raise RequestError(f"mesh_shape {value!r} is invalid: {e}") from None
    if len(mesh) == 0:
        raise RequestError(f"mesh_shape {value!r} has no axes; expected e.g. 'x:2;y:4'")
    if len(mesh) > settings.max_mesh_axes:
        raise RequestError(
            f"mesh_shape {value!r} has {len(mesh)} axes; this service allows at "
            f"most {settings.max_mesh_axes}"
        )
    if mesh.size > settings.max_num_devices:
        raise RequestError(
            f"mesh_shape {value!r} has {mesh.size} devices; this service allows at "
            f"most {settings.max_num_devices}"
        )
    return mesh


def parse_hardware(value: str | Mapping[str, Any]) -> HardwareProfile:
    """A preset name or a profile dict.  Never a path: the service reads no
    file a client names (``cost_models.get_hardware`` would)."""
    if isinstance(value, str):
        if value not in PRESETS:
            raise RequestError(
                f"unknown hardware {value!r}; expected one of {sorted(PRESETS)} "
                "or a profile object"
            )
        return PRESETS[value]
    try:
        return HardwareProfile.from_dict(value)
    except (MtfError, TypeError, ValueError) as e:
        raise RequestError(f"hardware profile is invalid: {e}") from None


def choose_profile(
    hardware: str | Mapping[str, Any],
    backend: str,
    use_measurements: bool,
    learned: Learned | None,
) -> tuple[HardwareProfile, ProfileUsed]:
    """The profile to plan with: a preset named by the request, refitted from
    its measurements on ``backend`` when the store has some and
    ``use_measurements``; a profile object as given."""
    hw = parse_hardware(hardware)
    if not isinstance(hardware, str):
        return hw, ProfileUsed(hw.name, backend, REQUEST, 0, use_measurements)
    fit = learned(hardware, backend) if learned and use_measurements else None
    if fit is None:
        return hw, ProfileUsed(hw.name, backend, BASE, 0, use_measurements)
    return fit[0], ProfileUsed(hw.name, backend, REFITTED, fit[1], use_measurements)


def _graph_doc_info(graph: Mapping[str, Any], settings: Settings) -> tuple[int, str]:
    """Cheap checks before hashing: the op count and the graph's name."""
    ops = graph.get("operations")
    n = len(ops) if isinstance(ops, list) else 0
    if n > settings.max_graph_operations:
        raise RequestError(
            f"graph has {n} operations; this service allows at most "
            f"{settings.max_graph_operations} (max_graph_operations)"
        )
    meta = graph.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return n, name if isinstance(name, str) and name else "graph"


def plan_options(req: PlanRequest, hw: HardwareProfile | None = None) -> PlanOptions:
    """The request's plan parameters as :class:`PlanOptions`: the one place the
    wire schema becomes the planner's value type (the client sends
    ``PlanOptions.to_request_dict()``, so the two round-trip).  ``hw``: the
    profile to plan with (default: the request's, as given)."""
    hw = parse_hardware(req.hardware) if hw is None else hw
    limit = req.memory_limit_bytes
    if req.max_memory_fraction is not None:
        if limit is not None:
            raise RequestError(
                "give at most one of memory_limit_bytes and max_memory_fraction"
            )
        limit = max(1, int(hw.memory_bytes * req.max_memory_fraction))
    try:
        return PlanOptions(
            hardware=hw,
            objective=Objective.parse(req.objective),
            memory_limit_bytes=limit,
            top_k=req.top_k,
            time_limit_s=req.time_limit_s,
            max_mesh_dims=req.max_mesh_dims,
        )
    except PlannerError as e:
        raise RequestError(str(e)) from None


def plan_spec(
    req: PlanRequest, settings: Settings, learned: Learned | None = None
) -> PlanSpec:
    """Checks everything but the graph's contents, and hashes the request.

    A preset named by the request is refitted from its measurements
    (``learned``) unless ``req.use_measurements`` is false; the hash covers
    the profile used and, for a refitted one, how many measurements it was
    fitted on, so that a plan made before new measurements is not the
    answer after them."""
    if (req.mesh_shape is None) == (req.num_devices is None):
        raise RequestError(
            "give exactly one of mesh_shape (e.g. 'x:2;y:4') and num_devices "
            f"(got mesh_shape={req.mesh_shape!r}, num_devices={req.num_devices!r})"
        )
    mesh = None if req.mesh_shape is None else str(parse_mesh(req.mesh_shape, settings))
    if req.num_devices is not None and req.num_devices > settings.max_num_devices:
        raise RequestError(
            f"num_devices is {req.num_devices}; this service allows at most "
            f"{settings.max_num_devices}"
        )
    if req.max_mesh_dims > settings.max_mesh_axes:
        raise RequestError(
            f"max_mesh_dims is {req.max_mesh_dims}; this service allows at most "
            f"{settings.max_mesh_axes}"
        )
    if req.top_k > settings.max_top_k:
        raise RequestError(
            f"top_k is {req.top_k}; this service allows at most {settings.max_top_k}"
        )
    if (
        not math.isfinite(req.time_limit_s)
        or req.time_limit_s > settings.max_time_limit_s
    ):
        raise RequestError(
            f"time_limit_s is {req.time_limit_s!r}; this service allows at most "
            f"{settings.max_time_limit_s:g} s"
        )
    hw, profile = choose_profile(
        req.hardware, req.backend, req.use_measurements, learned
    )
    options = plan_options(req, hw)
    n_ops, name = _graph_doc_info(req.graph, settings)
    try:
        graph_json = canonical_json(req.graph)
    except ValueError as e:  # NaN or Infinity smuggled in as numbers
        raise RequestError(f"graph is not plain JSON: {e}") from None
    graph_hash = sha256(graph_json)
    key = {
        "cache_version": CACHE_VERSION,
        "plan_format": PLAN_FORMAT_VERSION,
        "graph": graph_hash,
        "mesh_shape": mesh,
        "num_devices": req.num_devices,
        **options.to_dict(),
        "max_mesh_dims": req.max_mesh_dims if req.num_devices is not None else None,
    }
    for chosen in SERVER_CHOSEN:  # the service's own choices, not the request's
        del key[chosen]
    if profile.source == REFITTED:  # (base profiles keep the hashes they had)
        key["refitted_from_measurements"] = profile.measurements
    return PlanSpec(
        graph_json=graph_json,
        graph_hash=graph_hash,
        graph_name=name,
        num_operations=n_ops,
        mesh_shape=mesh,
        num_devices=req.num_devices,
        options=options,
        request_hash=sha256(canonical_json(key)),
        profile=profile,
    )


#: An operation's points (the product of the sizes of the distinct dims of its
#: inputs and outputs: an einsum's multiply-adds) must be at most this.  The
#: cost model counts flops in floats: an einsum of two rank-16 tensors of
#: 2**33-sized dims (2**1056 points) overflowed one (a 500 from /v1/evaluate,
#: a 503 from /v1/plans).  No graph the planner takes comes near it: 2**128
#: flops take 10**18 s at the largest peak_flops a profile may have.
MAX_OP_POINTS = 2**128


def check_op_points(graph: Graph) -> None:
    """RequestError naming the first operation over :data:`MAX_OP_POINTS`."""
    for op in graph.operations:
        sizes = {d.name: d.size for t in (*op.inputs, *op.outputs) for d in t.shape}
        points = math.prod(sizes.values())
        if points > MAX_OP_POINTS:
            raise RequestError(
                f"operation {op.name!r} ({op.op_type}) spans {len(sizes)} dims "
                f"whose sizes multiply to about 2**{points.bit_length() - 1}; this "
                f"service prices operations of at most "
                f"2**{MAX_OP_POINTS.bit_length() - 1} points (the product of the "
                "sizes of its inputs' and outputs' dims); expected smaller dims"
            )


def load_graph(doc: Mapping[str, Any], settings: Settings) -> LoadedGraph:
    """Rebuilds the client's graph under the service's limits (SerializationError,
    a ValueError naming the field, for anything wrong)."""
    loaded = graph_from_dict(doc, limits=settings.graph_limits)
    if not loaded.graph.operations:
        raise RequestError("the graph has no operations; nothing to plan")
    check_op_points(loaded.graph)
    meshes = {op.mesh.name for op in loaded.graph.operations}
    if len(meshes) > 1:
        raise RequestError(
            f"the graph uses {len(meshes)} meshes ({sorted(meshes)}); the planner "
            "plans one mesh"
        )
    return loaded
