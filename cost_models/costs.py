"""The independent evaluator: what one layout of a graph costs on some hardware.

:func:`evaluate` walks the ops in lowering (graph) order, asks each op which
collectives it issues (:meth:`mtf_core.graph.Operation.communication`, the same
:mod:`mtf_core.comm` plans the lowering executes), simulates the pending
allreduces exactly as the lowering defers them (:mod:`cost_models.deferred`),
and prices everything with the alpha-beta formulas of
:mod:`cost_models.collectives`, the roofline of :mod:`cost_models.op_costs`
and the live sets of :mod:`cost_models.memory`.

``time_s = compute_s + comm_s``: nothing overlaps (ops run one after another
and every collective blocks).  See docs/cost-model.md for formulas and units.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> x = mtf.zeros(m, "batch:8,d:4"); w = mtf.zeros(m, "d:4,h:2")
>>> y = mtf.einsum([x, w], output_shape="batch:8,h:2")
>>> cost = evaluate(g, "model:4", "d:model", "cpu-host", outputs=[y])
>>> [(c.kind, c.mesh_axes, c.bytes_per_device) for c in cost.collectives]
[('allreduce', ('model',), 64)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_models.deferred import DeferredAllreduces
from cost_models.gc_pause import gc_paused
from cost_models.hardware import CostModelError, HardwareProfile
from cost_models.layout_cache import LayoutSizes, layout_context
from cost_models.memory import (
    PARAM,
    SLOT,
    MemoryModel,
    max_collective_buffer_bytes,
    memory_model,
)
from cost_models.op_costs import op_compute
from cost_models.profiles import get_hardware
from cost_models.units import (
    CostUnit,
    UnitCost,
    comm_by_axis,
    cost_units,
    unit_cost,
)
from mtf_core.comm import CollectiveSpec
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.layout import LayoutRulesLike
from mtf_core.liveness import output_list, step_operations
from mtf_core.shapes import ShapeLike

__all__ = [
    "Cost",
    "StepTotals",
    "CostUnit",
    "UnitCost",
    "cost_units",
    "evaluate",
    "layout_context",
    "memory_model",
    "unit_cost",
]


class StepTotals:
    """Totals derived from a step's compute, per-axis communication and memory;
    shared by :class:`Cost` and the planner's own cost record."""

    compute_s: float
    comm_s_by_axis: tuple[tuple[str, float], ...]
    peak_memory_bytes: int
    memory_capacity_bytes: int

    @property
    def comm_s(self) -> float:
        return sum(s for _, s in self.comm_s_by_axis)

    @property
    def time_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes


@dataclass(frozen=True)
class Cost(StepTotals):
    """Step time, communication and memory of one layout (seconds, bytes).

    ``collectives`` are the collectives the lowering issues, in its order
    (deferred allreduces where they are forced); ``collective_ops`` names the
    op each one is issued while lowering (``"<export>"`` for exported outputs).
    ``comm_s_by_axis`` is keyed like the lowering's counters: an axis name, or
    ``"a,b"`` for one collective over several axes.
    """

    compute_s: float
    comm_s_by_axis: tuple[tuple[str, float], ...]
    flops_per_device: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    collectives: tuple[CollectiveSpec, ...]
    collective_ops: tuple[str, ...]
    param_bytes_per_device: int
    slot_bytes_per_device: int
    activation_peak_bytes: int
    collective_buffer_bytes: int
    mesh_shape: str = ""
    layout_rules: str = ""
    hardware: str = ""

    def comm_s_on(self, axis: str) -> float:
        """Seconds of collectives keyed exactly ``axis`` (0.0 if none)."""
        return dict(self.comm_s_by_axis).get(axis, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mesh_shape": self.mesh_shape,
            "layout_rules": self.layout_rules,
            "hardware": self.hardware,
            "time_s": self.time_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "comm_s_by_axis": dict(self.comm_s_by_axis),
            "flops_per_device": self.flops_per_device,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "param_bytes_per_device": self.param_bytes_per_device,
            "slot_bytes_per_device": self.slot_bytes_per_device,
            "activation_peak_bytes": self.activation_peak_bytes,
            "collective_buffer_bytes": self.collective_buffer_bytes,
            "collectives": [
                {
                    "kind": c.kind,
                    "mesh_axes": list(c.mesh_axes),
                    "bytes_per_device": c.bytes_per_device,
                    "reduction": c.reduction,
                    "op": op,
                }
                for c, op in zip(self.collectives, self.collective_ops)
            ],
        }


def evaluate(
    graph: Graph,
    mesh_shape: ShapeLike,
    layout_rules: LayoutRulesLike,
    hardware: str | HardwareProfile | Mapping[str, Any],
    outputs: Sequence[Tensor] = (),
    memory: MemoryModel | None = None,
    op_seconds: dict[Operation, float] | None = None,
) -> Cost:
    """Prices ``layout_rules`` on ``mesh_shape`` for ``graph`` on ``hardware``.

    ``outputs`` are the tensors exported after the step (they force their
    pending allreduces, in this order, and stay alive to the end).  With
    outputs, the step is priced as a compiled step runs it: only the ops the
    outputs and the graph's updates (its ``Assign`` ops) need
    (:func:`mtf_core.liveness.step_operations`); without, every op, as
    ``Lowering(graph, ...)`` lowers them.  Pass a
    precomputed ``memory`` model to save time when evaluating many layouts.
    ``op_seconds``, if given, gets each priced op's compute seconds (for
    :func:`cost_models.pipeline.split_step`, which would price them again).
    Raises LayoutError for layouts the lowering rejects.
    """
    with gc_paused():
        return _evaluate(
            graph, mesh_shape, layout_rules, hardware, outputs, memory, op_seconds
        )


def _evaluate(
    graph: Graph,
    mesh_shape: ShapeLike,
    layout_rules: LayoutRulesLike,
    hardware: str | HardwareProfile | Mapping[str, Any],
    outputs: Sequence[Tensor],
    memory: MemoryModel | None,
    op_seconds: dict[Operation, float] | None = None,
) -> Cost:
    hw = get_hardware(hardware)
    if not isinstance(graph, Graph):
        raise CostModelError(f"graph {graph!r} is not an mtf.Graph")
    if memory is not None and not isinstance(memory, MemoryModel):
        raise CostModelError(f"memory is {memory!r}; expected a MemoryModel or None")
    outputs = output_list(outputs, graph)
    ops = step_operations(graph, outputs)
    ctx = layout_context(graph, mesh_shape, layout_rules, ops)
    sim = DeferredAllreduces(ctx)
    sizes = LayoutSizes(ctx)
    collectives: list[CollectiveSpec] = []
    names: list[str] = []
    compute_s = 0.0
    flops = 0.0
    for op in ops:
        ran = sim.step(op, op.communication(ctx))
        collectives.extend(i.spec for i in ran)
        names.extend([op.name] * len(ran))
        op_flops, op_s = op_compute(op, ctx, hw, sizes)
        compute_s += op_s
        flops += op_flops
        if op_seconds is not None:
            op_seconds[op] = op_s
    for t in outputs:
        forced = sim.force(t)
        collectives.extend(forced)
        names.extend(["<export>"] * len(forced))
    mm = memory if memory is not None else memory_model(graph, outputs)
    usage = mm.usage(ctx)
    by_kind = usage.bytes_by_kind
    buffer = max_collective_buffer_bytes(collectives, ctx)
    return Cost(
        compute_s=compute_s,
        comm_s_by_axis=comm_by_axis(collectives, ctx, hw),
        flops_per_device=flops,
        peak_memory_bytes=usage.peak_bytes + buffer,
        memory_capacity_bytes=hw.memory_bytes,
        collectives=tuple(collectives),
        collective_ops=tuple(names),
        param_bytes_per_device=by_kind[PARAM],
        slot_bytes_per_device=by_kind[SLOT],
        activation_peak_bytes=usage.activation_peak_bytes,
        collective_buffer_bytes=buffer,
        mesh_shape=str(ctx.mesh_shape),
        layout_rules=str(ctx.rules),
        hardware=hw.name,
    )
