"""Cost units: the graph's cost cut into pieces that each read few dim names.

The planner's integer program prices every piece under every local assignment
of its dims, so pieces must be small and exact.  Two kinds:

* ``"op"`` (one per op): the op's compute time and its own collectives that run
  at once (layout changes, max/min allreduces, ...).  Reads the layout of the
  op's dim names only.
* ``"deferred"`` (one per group of ops linked by possibly-pending values): the
  deferred allreduce(SUM)s.  Whether ``a@b + c@d`` reduces once or twice, and
  over which axes, depends on the layout of every producer in the group, so
  its ``dim_names`` is the union of the producers' and sum-propagators' dims;
  the consumers that force the sums are in ``ops`` (their order matters) but
  their dims are not read.

For every valid layout, summing :func:`unit_cost` over :func:`cost_units`
gives exactly :func:`cost_models.costs.evaluate`'s compute time and
communication per axis (the collectives too, as a multiset).

Made with ``once_from`` (an op index: the first op of the optimizer's
update), each unit also knows which of its time runs once per step rather
than once per micro-batch, as :func:`cost_models.pipeline.split_step` cuts
an evaluated step: the compute of ops from ``once_from`` on, and the
collectives those ops issue or force and those issued at a reduce-scatter
(:attr:`UnitCost.once_s`).  Once-ness is part of a unit's signature, so an
optimizer op never shares a class with a forward op of the same shape.

Units whose ``signature`` is equal cost the same under every layout (same op
types and attributes, same shapes and dtypes, same wiring), so the planner can
price one and reuse it.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from cost_models.collectives import axes_key, collective_time_s
from cost_models.deferred import DeferredAllreduces, may_defer, static_deferral
from cost_models.entry_compute import compute_only, compute_seconds
from cost_models.gc_pause import gc_paused
from cost_models.hardware import CostModelError, HardwareProfile
from cost_models.layout_cache import CachedLayoutContext, LayoutSizes
from cost_models.op_costs import hbm_tensors, op_compute
from cost_models.signatures import Signature, Signer
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.liveness import step_operations
from mtf_core.shapes import Shape

#: Collectives issued at this op type run once per step (a stored weight's
#: gradient is reduce-scattered once, after the micro-batches).
_REDUCE_SCATTER = "ReduceScatter"
#: Marks the signature of an op that runs once per step.
_ONCE = "once"


class UnitKind(StrEnum):
    """What a cost unit prices: ops (their compute and collectives) or a
    deferred allreduce (issued when a reader forces it)."""

    OP = "op"
    DEFERRED = "deferred"


OP = UnitKind.OP
DEFERRED = UnitKind.DEFERRED


@dataclass(frozen=True)
class CostUnit:
    """Ops priced together, and the dim names whose layout their cost reads."""

    ops: tuple[Operation, ...]
    dim_names: frozenset[str]
    kind: UnitKind = UnitKind.OP
    exported: tuple[Tensor, ...] = ()  # deferred units: outputs forced at the end
    signature: Hashable = field(default=None, compare=False)
    #: Per op of ``ops``: whether it runs once per step (``once_from``); empty
    #: when every op runs once per micro-batch.
    once: tuple[bool, ...] = ()

    def __repr__(self) -> str:
        names = ",".join(op.name for op in self.ops[:4])
        more = "..." if len(self.ops) > 4 else ""
        return f"CostUnit({self.kind}: {names}{more}; dims {sorted(self.dim_names)})"


class UnitCost(NamedTuple):
    """What one unit costs under one layout (a named tuple: a search makes
    tens of thousands, and a frozen dataclass's construction costs several
    times a tuple's)."""

    compute_s: float
    comm_s_by_axis: tuple[tuple[str, float], ...]
    collectives: tuple[CollectiveSpec, ...]
    flops_per_device: float = 0.0
    #: The part of ``compute_s + comm_s`` that runs once per step (see the
    #: module docstring); the rest runs once per micro-batch.
    once_s: float = 0.0

    @property
    def comm_s(self) -> float:
        return sum(s for _, s in self.comm_s_by_axis)


def comm_by_axis(
    collectives: Sequence[CollectiveSpec], ctx: LayoutContext, hw: HardwareProfile
) -> tuple[tuple[str, float], ...]:
    """Seconds per axes key (``"model"``, or ``"batch,model"`` for a collective
    over both), sorted by key; collectives summed in the order given."""
    out: dict[str, float] = {}
    for c in collectives:
        key = axes_key(c)
        out[key] = out.get(key, 0.0) + collective_time_s(c, ctx.mesh_shape, hw)
    return tuple(sorted(out.items()))


def unit_cost(unit: CostUnit, ctx: LayoutContext, hw: HardwareProfile) -> UnitCost:
    """Cost of ``unit`` under ``ctx``; reads only the layout of ``unit.dim_names``.

    To price many units under many layouts of one mesh, keep one
    :class:`UnitPricer`: it gives the same answers, faster.
    """
    return UnitPricer(ctx.mesh_shape, hw).cost(unit, ctx)


class UnitPricer:
    """Prices cost units under many layouts of one mesh on one hardware profile.

    :meth:`cost` is :func:`unit_cost`; what it remembers between calls is
    what cannot change: each op's flops and sorted dim names, whether it may
    defer, each collective's time, and each op's collectives under each
    assignment of the op's *own* dims (an op reads nothing else of the
    layout), which the deferred units of a table ask for again and again.
    """

    def __init__(self, mesh_shape: Shape, hw: HardwareProfile) -> None:
        self.mesh_shape = mesh_shape
        self.hw = hw
        self._statics: dict[Operation, tuple[float, tuple[str, ...], bool]] = {}
        self._comm: dict[tuple[Operation, tuple[int | None, ...]], list[CollectiveSpec]]
        self._comm = {}
        self._times: dict[CollectiveSpec, float] = {}
        # The units of one layout are priced one after the other.
        self._sizes: tuple[LayoutContext | None, LayoutSizes | None] = (None, None)
        self._tensors: dict[Operation, tuple[int, tuple[Tensor, ...]]] = {}

    def cost(
        self,
        unit: CostUnit,
        ctx: LayoutContext,
        split: tuple[tuple[str, int], ...] | None = None,
    ) -> UnitCost:
        """What ``unit`` costs under ``ctx`` (a layout of this pricer's mesh).
        ``split``: the (dim name, mesh axis) pairs of ``ctx`` for the unit's
        dims that it splits, in name order, where the caller has them (a
        pricer that remembers costs may key them by it; this one ignores
        it)."""
        if ctx.mesh_shape is not self.mesh_shape and ctx.mesh_shape != self.mesh_shape:
            raise CostModelError(
                f"layout for mesh [{ctx.mesh_shape}] given to a pricer of mesh "
                f"[{self.mesh_shape}]"
            )
        ctx = CachedLayoutContext.wrap(ctx)
        if unit.kind == OP:
            (op,) = unit.ops
            flops, names, defers = self._op_statics(op)
            specs = self._communication(op, names, ctx)
            if not defers and any(s.pending for s in specs):
                raise CostModelError(
                    f"{op.op_type} {op.name} leaves an allreduce pending, but "
                    "cost_models.deferred.may_defer does not know that op type "
                    "defers; teach it, or the cost units would miss that allreduce"
                )
            issued = [s for s in specs if not s.pending]
            flops_pd, seconds = self._compute(op, ctx, flops)
            by_axis = self._by_axis(issued)
            once = 0.0
            if unit.once and unit.once[0]:
                once = seconds + self._seconds(issued)
            elif op.op_type == _REDUCE_SCATTER:
                once = self._seconds(issued)
            return UnitCost(seconds, by_axis, tuple(issued), flops_pd, once)
        if unit.kind != DEFERRED:
            raise CostModelError(
                f"unknown cost unit kind {unit.kind!r}; expected op or deferred"
            )
        sim = DeferredAllreduces(ctx)
        forced_all: list[CollectiveSpec] = []
        once_s = 0.0
        for i, op in enumerate(unit.ops):
            _, names, defers = self._op_statics(op)
            own = (
                [s for s in self._communication(op, names, ctx) if s.pending]
                if defers
                else []
            )
            forced = [r.spec for r in sim.step(op, own) if r.forced]
            forced_all.extend(forced)
            if forced and (
                (unit.once and unit.once[i]) or op.op_type == _REDUCE_SCATTER
            ):
                once_s += self._seconds(forced)
        for t in unit.exported:
            forced_all.extend(sim.force(t))
        return UnitCost(
            0.0, self._by_axis(forced_all), tuple(forced_all), once_s=once_s
        )

    def costs(
        self,
        units: Sequence[CostUnit],
        ctx: LayoutContext,
        split: tuple[tuple[str, int], ...] | None = None,
    ) -> list[UnitCost]:
        """:meth:`cost` of each of ``units`` under ``ctx``, in order: the units
        of one table entry, whose dims ``split`` splits as :meth:`cost` says
        (a subclass may look up what they share once for all of them)."""
        return [self.cost(u, ctx, split) for u in units]

    def table_compute(
        self,
        unit: CostUnit,
        dims: Sequence[str],
        assignments: Sequence[tuple[int | None, ...]],
    ) -> list[float | None] | None:
        """For an op unit that costs its compute alone under every layout
        (:func:`cost_models.entry_compute.compute_only`) on a roofline
        profile: its ``compute_s`` under each assignment of ``dims`` (mesh
        axis indices; ``unit``'s other dims unsplit), as :meth:`cost` gives
        it, or None where :meth:`cost` must decide (it raises the lowering's
        error there).  None for any other unit.  Its ``once_s`` is that time
        where ``unit.once`` says it runs once per step, else 0."""
        if unit.kind != OP or self.hw.rates is not None:
            return None
        (op,) = unit.ops
        if not compute_only(op):
            return None
        flops, _, _ = self._op_statics(op)
        sizes = [d.size for d in self.mesh_shape]
        return compute_seconds(
            op, flops, self._hbm_tensors(op), self.hw, sizes, dims, assignments
        )

    def _op_statics(self, op: Operation) -> tuple[float, tuple[str, ...], bool]:
        got = self._statics.get(op)
        if got is None:
            got = self._statics[op] = (
                op.flops(),
                tuple(sorted(op.all_dim_names)),
                may_defer(op),
            )
        return got

    def _compute(
        self, op: Operation, ctx: CachedLayoutContext, flops: float
    ) -> tuple[float, float]:
        """``op_compute(op, ctx, hw)``; on a roofline profile with the
        tensors whose bytes it counts kept per op (they do not depend on the
        layout) and sizes from ``ctx``'s memos."""
        if self.hw.rates is not None:  # the op's features, by a LayoutSizes
            if self._sizes[0] is not ctx:
                self._sizes = (ctx, LayoutSizes(ctx))
            return op_compute(op, ctx, self.hw, self._sizes[1], flops)
        return op_compute(op, ctx, self.hw, None, flops, self._hbm_tensors(op))

    def _hbm_tensors(self, op: Operation) -> tuple[int, tuple[Tensor, ...]]:
        """:func:`~cost_models.op_costs.hbm_tensors` of ``op``, kept per op
        (they do not depend on the layout)."""
        tensors = self._tensors.get(op)
        if tensors is None:
            tensors = self._tensors[op] = hbm_tensors(op)
        return tensors

    def _communication(
        self, op: Operation, names: tuple[str, ...], ctx: CachedLayoutContext
    ) -> list[CollectiveSpec]:
        # Errors (layouts the lowering rejects) are not remembered: raised again.
        key = (op, tuple(map(ctx.split_axes.get, names)))
        specs = self._comm.get(key)
        if specs is None:
            specs = self._comm[key] = list(op.communication(ctx))
        return specs

    def _time(self, c: CollectiveSpec) -> float:
        seconds = self._times.get(c)
        if seconds is None:
            seconds = self._times[c] = collective_time_s(c, self.mesh_shape, self.hw)
        return seconds

    def _seconds(self, collectives: Sequence[CollectiveSpec]) -> float:
        return sum(self._time(c) for c in collectives)

    def _by_axis(
        self, collectives: Sequence[CollectiveSpec]
    ) -> tuple[tuple[str, float], ...]:
        # comm_by_axis, with each collective's time looked up once.
        if not collectives:
            return ()
        out: dict[str, float] = {}
        for c in collectives:
            key = axes_key(c)
            out[key] = out.get(key, 0.0) + self._time(c)
        return tuple(sorted(out.items()))


def cost_units(
    graph: Graph, outputs: Sequence[Tensor] = (), once_from: int | None = None
) -> list[CostUnit]:
    """The graph's cost units: one ``op`` unit per op of the step
    (:func:`mtf_core.liveness.step_operations`, graph order), then one
    ``deferred`` unit per group of ops linked by possibly-pending values.
    ``once_from``: the index in ``graph.operations`` of the first op that
    runs once per step (see the module docstring)."""
    with gc_paused():
        ops, sigs, signer, once = _signed_ops(graph, outputs, once_from)
        unit_sigs: dict[Signature, Signature] = {}
        units = []
        for op in ops:
            sig = sigs[op]
            unit_sig = unit_sigs.get(sig)
            if unit_sig is None:
                unit_sig = unit_sigs[sig] = signer.intern((OP, sig))
            units.append(
                CostUnit(
                    (op,),
                    op.all_dim_names,
                    OP,
                    signature=unit_sig,
                    once=(True,) if op in once else (),
                )
            )
        return units + _deferred_units(ops, outputs, sigs, signer, once)


@dataclass(frozen=True)
class UnitClass:
    """Cost units with one signature and one dim set: they cost the same under
    every layout, so one ``unit`` (the first in graph order) stands for
    ``count`` of them."""

    unit: CostUnit
    count: int


def cost_unit_classes(
    graph: Graph,
    outputs: Sequence[Tensor] = (),
    once_from: int | None = None,
    op_signatures: dict[Operation, Signature] | None = None,
) -> list[UnitClass]:
    """:func:`cost_units` grouped into classes of equal signature and dims, in
    order of their first unit; without making one ``CostUnit`` per op (a deep
    graph has tens of thousands of ops and a few hundred classes).
    ``op_signatures``, if given, receives each step op's signature
    (:meth:`Signer.op`'s, whether or not the op runs once per step)."""
    with gc_paused():
        return _unit_classes(graph, outputs, once_from, op_signatures)


def _unit_classes(
    graph: Graph,
    outputs: Sequence[Tensor],
    once_from: int | None,
    op_signatures: dict[Operation, Signature] | None = None,
) -> list[UnitClass]:
    ops, sigs, signer, once = _signed_ops(graph, outputs, once_from, op_signatures)
    firsts: dict[tuple[frozenset[str], Signature], Operation] = {}
    counts: dict[tuple[frozenset[str], Signature], int] = {}
    for op in ops:
        key = (op.all_dim_names, sigs[op])
        if key in counts:
            counts[key] += 1
        else:
            firsts[key] = op
            counts[key] = 1
    classes = []
    unit_sigs: dict[Signature, Signature] = {}
    for key, op in firsts.items():
        sig = key[1]
        unit_sig = unit_sigs.get(sig)
        if unit_sig is None:
            unit_sig = unit_sigs[sig] = signer.intern((OP, sig))
        unit = CostUnit(
            (op,), key[0], OP, signature=unit_sig, once=(True,) if op in once else ()
        )
        classes.append(UnitClass(unit, counts[key]))
    deferred: dict[tuple[frozenset[str], Hashable], list[CostUnit]] = {}
    for unit in _deferred_units(ops, outputs, sigs, signer, once):
        deferred.setdefault((unit.dim_names, unit.signature), []).append(unit)
    classes.extend(UnitClass(us[0], len(us)) for us in deferred.values())
    return classes


def _signed_ops(
    graph: Graph,
    outputs: Sequence[Tensor],
    once_from: int | None = None,
    op_signatures: dict[Operation, Signature] | None = None,
) -> tuple[list[Operation], dict[Operation, Signature], Signer, set[Operation]]:
    """The step's ops, their signatures, the signer, and the ops that run
    once per step (their signatures say so); ``op_signatures`` receives the
    signatures before that."""
    ops = list(step_operations(graph, outputs))  # raises for a foreign output
    signer = Signer()
    sigs = {op: signer.op(op) for op in ops}
    if op_signatures is not None:
        op_signatures.update(sigs)
    once: set[Operation] = set()
    if once_from is not None:
        if not 0 <= once_from <= len(graph.operations):
            raise CostModelError(
                f"once_from {once_from} is outside the graph's "
                f"{len(graph.operations)} ops"
            )
        once = set(graph.operations[once_from:]) & set(ops)
        for op in once:
            sigs[op] = signer.intern((_ONCE, sigs[op]))
    return ops, sigs, signer, once


def _deferred_units(
    ops: list[Operation],
    outputs: Sequence[Tensor],
    sigs: dict[Operation, Signature],
    signer: Signer,
    once: Collection[Operation] = (),
) -> list[CostUnit]:
    """One ``deferred`` unit per group of ops linked by possibly-pending
    values (union-find over each op and the carriers it reads while they may
    still be pending), in order of their first op."""
    static = static_deferral(ops)
    parent: dict[Operation, Operation] = {}

    def find(op: Operation) -> Operation:
        parent.setdefault(op, op)
        while parent[op] is not op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    for op, live_inputs in static.reads.items():
        for t in live_inputs:
            a, b = find(t.operation), find(op)
            if a is not b:
                parent[b] = a
    exported = [t for t in dict.fromkeys(outputs) if t in static.carriers]
    for t in exported:
        find(t.operation)
    groups: dict[Operation, list[Operation]] = {}
    for op in ops:  # graph order within each group
        if op in parent:
            groups.setdefault(find(op), []).append(op)
    units = []
    for members in groups.values():
        member_set = set(members)
        dims: set[str] = set()
        for op in members:
            if (
                op in static.producers
                or op in static.propagators
                # A consumer that reduce-scatters reads its own output layout.
                or hasattr(op, "consume_pending")
            ):
                dims.update(op.all_dim_names)
        ex = tuple(t for t in exported if t.operation in member_set)
        flags = tuple(op in once for op in members)
        units.append(
            CostUnit(
                tuple(members),
                frozenset(dims),
                DEFERRED,
                ex,
                signature=signer.group(members, ex, sigs, DEFERRED),
                once=flags if any(flags) else (),
            )
        )
    return units
