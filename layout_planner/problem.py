"""A planning problem: the graph's cost and memory as tables over dim sets.

Built in phases from one request (graph, mesh shape, hardware, outputs):

1. ``_collect``: from the :class:`~layout_planner.analysis.GraphAnalysis`
   (dimension graph, cost units, memory model; shared between mesh shapes),
   each dim name's allowed mesh axes and the x variables.
2. ``_price_units``: units are grouped by their *free* dims (the ones some
   axis may split) and by signature (units with equal signatures cost the same
   under every layout, e.g. the same op in every layer).  For every local
   assignment of a dim set, one representative per signature is priced with
   ``cost_models.unit_cost`` and multiplied by its count.  An assignment the
   lowering rejects (``LayoutError``) is marked invalid.  So the tables, and
   the integer program, grow with the number of distinct dim sets and
   signatures, not with depth.
3. ``_memory_rows``: each live set becomes a row "unsplit bytes per table of
   tensor dims" plus a constant; duplicates are dropped (the solver adds a
   row to its model only when an answer breaks it).
4. :meth:`program`: every table is hosted by a maximal one, and the integer
   program (:mod:`layout_planner.program`) is written out as plain data.

The tables also price any full layout in microseconds (:meth:`table_cost`),
which the explanations use; the exact, independent price of a layout is
always ``cost_models.evaluate``.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from cost_models.collectives import collective_buffer_bytes
from cost_models.gc_pause import gc_paused
from cost_models.hardware import HardwareProfile, LinkSpec
from cost_models.layout_cache import CachedLayoutContext
from cost_models.memory import MemoryModel
from cost_models.units import CostUnit, UnitClass, UnitCost, UnitPricer
from layout_planner.analysis import GraphAnalysis, unique_rows
from layout_planner.dim_graph import assignment_codes
from layout_planner.errors import PlannerError
from layout_planner.program import (
    PS_PER_S,
    DimsetSpec,
    IntegerProgram,
    Objective,
)
from layout_planner.tables import (
    BuildStats,
    DimsetTable,
    PricedTable,
    TableCost,
    invalid_cost,
    orbit_images,
)
from mtf_core import dtypes
from mtf_core.comm import LayoutContext
from mtf_core.errors import LayoutError
from mtf_core.graph import Graph, Tensor
from mtf_core.layout import LayoutRules
from mtf_core.shapes import Shape

# The longest time whose picoseconds a float holds.
_MAX_FLOAT_S = sys.float_info.max / PS_PER_S

# The numbers of a table's assignments (:meth:`LayoutProblem._hosts`) stay
# below this, or its projections are looked up one by one.
_MAX_CODE = 2**62

# Collectives of a layout change (mtf_core.comm.plan_layout_change).
_LAYOUT_CHANGES = frozenset({"alltoall", "allconcat"})


@dataclass(frozen=True)
class _TableUnits:
    """One table's units as :meth:`LayoutProblem._price_entry` prices them:
    ``compute[i]``: unit ``i``'s compute seconds per entry, when its pricer
    gives them table-wide (None per entry it cannot vouch for), else None;
    ``once[i]``: whether that compute runs once per step; ``rest``: the
    units without table-wide compute, in order."""

    units: tuple[CostUnit, ...]
    counts: list[int]
    compute: list[list[float | None] | None]
    once: list[bool]
    rest: tuple[CostUnit, ...]


class LayoutProblem:
    """One request's dimension graph, cost tables and memory rows."""

    def __init__(
        self,
        graph: Graph,
        mesh_shape: Shape,
        hardware: HardwareProfile,
        outputs: Sequence[Tensor] = (),
        analysis: GraphAnalysis | None = None,
        pricer: UnitPricer | None = None,
        per_batch_weight: int = 1,
        table_memo: dict[Hashable, PricedTable] | None = None,
    ) -> None:
        """``analysis``: a :class:`GraphAnalysis` of ``graph`` and ``outputs``
        to reuse (the mesh-shape search shares one); made here if None.
        ``pricer``: a :class:`UnitPricer` of this mesh and hardware to price
        the units with (problems of one mesh may share one); made if None.
        ``table_memo``: priced tables shared by the problems that share
        ``pricer`` (whose units cost the same under equal signatures, as
        ``layout_planner.scale_stages.SignaturePricer``'s do): a table of the same dims,
        assignments and units (signatures and counts, in order) as one
        priced before is copied from it.
        ``per_batch_weight``: how many times the time objective counts the
        per-micro-batch part of the step (a pipeline's ``m + p - 1`` slots),
        against once for its once-per-step part (:meth:`weighted_time_s`)."""
        if (
            isinstance(per_batch_weight, bool)
            or not isinstance(per_batch_weight, int)
            or per_batch_weight < 1
        ):
            raise PlannerError(
                f"per_batch_weight must be an integer >= 1, got {per_batch_weight!r}"
            )
        self.per_batch_weight = per_batch_weight
        #: Bytes every live set holds besides the graph's own, as (unsplit
        #: bytes per memory-row column, bytes no layout splits): a
        #: pipeline's other micro-batches in flight (:meth:`row_vector`).
        #: The program's memory rows count them; the tables' peak does not.
        self.also_held: tuple[np.ndarray, int] | None = None
        #: A term of the time objective besides the tables' times, as
        #: (table index, seconds per assignment of that table): see
        #: :meth:`add_time`.
        self.extra_time: tuple[int, np.ndarray] | None = None
        #: A layout for the solver to try first (:attr:`IntegerProgram.x_hint`:
        #: each rule whose dim and mesh axis this problem has), or None.
        self.hint: LayoutRules | None = None
        self._given_pricer = pricer
        self._table_memo = table_memo
        self.graph = graph
        self.mesh_shape = mesh_shape
        self.hw = hardware
        self.outputs = list(outputs)
        t0 = time.perf_counter()
        if analysis is None:
            analysis = GraphAnalysis(graph, self.outputs)
        elif analysis.graph is not graph or analysis.outputs != self.outputs:
            raise PlannerError(
                "analysis was made for another graph or other outputs; make a "
                "GraphAnalysis(graph, outputs) of this one"
            )
        self.analysis = analysis
        with gc_paused():
            self._collect()
            t1 = time.perf_counter()
            self._price_units()
            t2 = time.perf_counter()
            self._memory_rows()
            t3 = time.perf_counter()
        self.stats = BuildStats(
            num_ops=len(graph.operations),
            num_units=sum(c.count for c in self.unit_classes),
            num_signatures=self._num_signatures,
            num_dims=len(self.dim_graph.names),
            num_free_dims=len(self.free_dims),
            num_dimsets=len(self.tables),
            num_assignments=sum(len(t.assignments) for t in self.tables),
            num_unit_pricings=self._num_pricings,
            num_live_sets=len(self.memory.steps),
            num_memory_rows=len(self.rows),
            collect_s=t1 - t0,
            price_s=t2 - t1,
            memory_s=t3 - t2,
        )

    # -- phase 1 ---------------------------------------------------------------------
    def _collect(self) -> None:
        self.dim_graph = self.analysis.dim_graph
        self.unit_classes: list[UnitClass] = self.analysis.unit_classes
        self.memory: MemoryModel = self.analysis.memory
        self.allowed = {
            n: self.dim_graph.allowed_axes(n, self.mesh_shape)
            for n in self.dim_graph.names
        }
        self.free_dims = [n for n in self.dim_graph.names if self.allowed[n]]
        self.x_index: dict[tuple[str, int], int] = {}
        for n in self.free_dims:
            for a in self.allowed[n]:
                self.x_index[(n, a)] = len(self.x_index)
        self.tables: list[DimsetTable] = []
        self.table_of: dict[tuple[str, ...], int] = {}

    def free(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(n for n in names if self.allowed.get(n)))

    def _table(self, dims: tuple[str, ...]) -> DimsetTable:
        i = self.table_of.get(dims)
        if i is not None:
            return self.tables[i]
        assignments = self.dim_graph.local_assignments(dims, self.allowed)
        sizes = [d.size for d in self.mesh_shape]
        n = len(assignments)
        table = DimsetTable(
            dims=dims,
            assignments=assignments,
            factor=[
                math.prod(sizes[a] for a in asg if a is not None) for asg in assignments
            ],
            time_s=[0.0] * n,
            compute_s=[0.0] * n,
            comm_s=[{} for _ in range(n)],
            buffer_bytes=[0] * n,
            invalid=[None] * n,
            once_s=[0.0] * n,
            index={asg: k for k, asg in enumerate(assignments)},
        )
        self.table_of[dims] = len(self.tables)
        self.tables.append(table)
        return table

    # -- phase 2 ---------------------------------------------------------------------
    def _price_units(self) -> None:
        # Per table (free dims): each signature's first unit and how many
        # units have it, in order of first appearance (the order the float
        # sums below add them in).
        groups: dict[tuple[str, ...], dict[Hashable, tuple[CostUnit, int]]] = {}
        for cls in self.unit_classes:
            unit = cls.unit
            key = unit.signature if unit.signature is not None else id(unit)
            group = groups.setdefault(self.free(unit.dim_names), {})
            first, count = group.get(key, (unit, 0))
            group[key] = (first, count + cls.count)
        self._num_signatures = sum(len(g) for g in groups.values())
        self._num_pricings = 0
        self._pricer = self._given_pricer or UnitPricer(self.mesh_shape, self.hw)
        # Entries of different tables that split the same dims over the same
        # axes price under one context (and its memoized slices).
        self._contexts: dict[tuple[tuple[str, int], ...], LayoutContext] = {}
        # Per unit cost (by identity, kept alive beside it): its largest
        # collective buffer and how many of its collectives change a layout.
        self._buffers: dict[int, tuple[UnitCost, int, int]] = {}
        perms = self._axis_permutations()
        memo = self._table_memo
        for dims in sorted(groups):
            table = self._table(dims)
            by_sig = list(groups[dims].values())
            table.num_units = sum(count for _, count in by_sig)
            memo_key: Hashable = None
            if memo is not None and all(u.signature is not None for u, _ in by_sig):
                signed = tuple((u.signature, count) for u, count in by_sig)
                memo_key = (dims, tuple(table.assignments), signed)
                known = memo.get(memo_key)
                if known is not None:
                    known.fill(table)
                    continue
            entries = self._entries(table, by_sig)
            images = orbit_images(table, perms)
            for k in range(len(table.assignments)):
                if k not in images:
                    self._price_entry(table, k, entries)
            if images and not self._copy_images(table, images, entries):
                for k in images:  # not symmetric after all: price them all
                    self._price_entry(table, k, entries)
            if memo is not None and memo_key is not None:
                memo[memo_key] = PricedTable.of(table)

    def _entries(
        self, table: DimsetTable, by_sig: Sequence[tuple[CostUnit, int]]
    ) -> _TableUnits:
        """What pricing ``table``'s entries needs of its units: each unit's
        count, compute per entry where the pricer gives it for the whole
        table (``UnitPricer.table_compute``), and the other units."""
        units = tuple(u for u, _ in by_sig)
        compute = [
            self._pricer.table_compute(u, table.dims, table.assignments) for u in units
        ]
        return _TableUnits(
            units=units,
            counts=[count for _, count in by_sig],
            compute=compute,
            once=[bool(u.once and u.once[0]) for u in units],
            # One sequence for every entry: the pricer may remember what it
            # looks up for them by its identity.
            rest=tuple(u for u, c in zip(units, compute) if c is None),
        )

    def _price_entry(self, table: DimsetTable, k: int, entries: _TableUnits) -> None:
        """Prices assignment ``k`` of ``table``: every signature's unit, times
        its count, in order (compute-only units from their table-wide times,
        unless one of them cannot vouch for ``k``)."""
        comm: dict[str, float] = {}
        compute = 0.0
        once = 0.0
        buffer = 0
        ordered = False
        buffers = self._buffers
        fast = entries.compute
        if all(c is None or c[k] is not None for c in fast):
            units = entries.rest
        else:
            units = entries.units
            fast = [None] * len(units)
        priced = None
        if units:
            split = tuple(
                (d, a)
                for d, a in zip(table.dims, table.assignments[k])
                if a is not None
            )
            ctx = self._contexts.get(split)
            if ctx is None:
                ctx = self._contexts[split] = self.context(dict(split))
            try:
                priced = iter(self._pricer.costs(units, ctx, split))
            except LayoutError as e:
                table.invalid[k] = str(e)
                return
        self._num_pricings += len(entries.units)
        for c, count, is_once in zip(fast, entries.counts, entries.once):
            if c is not None:
                seconds = c[k]
                assert seconds is not None
                compute += count * seconds
                if is_once:
                    once += count * seconds
                continue
            assert priced is not None
            uc = next(priced)
            compute += count * uc.compute_s
            once += count * uc.once_s
            for axis, sec in uc.comm_s_by_axis:
                comm[axis] = comm.get(axis, 0.0) + count * sec
            known = buffers.get(id(uc))
            if known is None or known[0] is not uc:
                known = buffers[id(uc)] = (uc, *self._buffer_and_moves(uc))
            buffer = max(buffer, known[1])
            # A layout change of several steps goes axis by axis in mesh
            # order, and each step's bytes depend on the steps before: its
            # cost is not the same under a permutation of the axes.
            ordered = ordered or known[2] > 1
        if ordered:
            table.ordered.add(k)
        table.invalid[k] = None
        table.compute_s[k] = compute
        table.comm_s[k] = comm
        table.time_s[k] = compute + sum(comm.values())
        table.once_s[k] = once
        table.buffer_bytes[k] = buffer

    def _buffer_and_moves(self, uc: UnitCost) -> tuple[int, int]:
        """``uc``'s largest collective buffer and how many of its collectives
        change a layout."""
        buffer = moves = 0
        for c in uc.collectives:
            buffer = max(buffer, collective_buffer_bytes(c, self.mesh_shape))
            moves += c.kind in _LAYOUT_CHANGES
        return buffer, moves

    def _axis_permutations(self) -> list[tuple[int, ...]]:
        """The permutations of mesh axes (other than the identity) that only
        exchange interchangeable axes: one size (> 1) and one link.  Every
        collective's time reads only its axes' sizes and slowest link, and
        every compute time only the sizes, so a unit costs the same under an
        assignment and under its image (with comm keys renamed): an orbit is
        priced once (:meth:`_copy_images` checks one image per table), unless
        a unit changes a layout in several steps under it."""
        mesh = self.mesh_shape
        classes: dict[tuple[int, LinkSpec], list[int]] = {}
        for i, d in enumerate(mesh):
            if d.size > 1:
                link = self.hw.link_for_axis(d.name, mesh)
                classes.setdefault((d.size, link), []).append(i)
        movable = [axes for axes in classes.values() if len(axes) > 1]
        if not movable:
            return []
        perms: list[tuple[int, ...]] = [tuple(range(len(mesh)))]
        for axes in movable:
            grown = []
            for base in perms:
                for order in itertools.permutations(axes):
                    p = list(base)
                    for src, dst in zip(axes, order):
                        p[src] = dst
                    grown.append(tuple(p))
            perms = grown
        return [p for p in perms if p != tuple(range(len(mesh)))]

    def _copy_images(
        self,
        table: DimsetTable,
        images: dict[int, tuple[int, tuple[int, ...]]],
        entries: _TableUnits,
    ) -> bool:
        """Fills each image ``k -> (canonical, perm)`` from its canonical
        entry (comm keys renamed by ``perm``); an image of an invalid entry
        is priced itself (its reason names its own axes).  Returns False,
        having filled nothing, if one image priced directly disagrees."""
        names = [d.name for d in self.mesh_shape]
        order = {n: i for i, n in enumerate(names)}

        def rename(key: str, perm: tuple[int, ...]) -> str:
            moved = [names[perm[order[a]]] for a in key.split(",")]
            return ",".join(sorted(moved, key=order.__getitem__))

        check = next(
            (
                k
                for k, (c, _) in images.items()
                if not table.invalid[c] and c not in table.ordered
            ),
            None,
        )
        if check is not None:
            canon, perm = images[check]
            self._price_entry(table, check, entries)
            want = {rename(a, perm): v for a, v in table.comm_s[canon].items()}
            got = table.comm_s[check]
            if (
                table.invalid[check] is not None
                or table.compute_s[check] != table.compute_s[canon]
                or table.buffer_bytes[check] != table.buffer_bytes[canon]
                or set(got) != set(want)
                or any(abs(got[a] - want[a]) > 1e-12 * abs(want[a]) for a in want)
            ):
                return False
        for k, (canon, perm) in images.items():
            if k == check:
                continue
            if table.invalid[canon] is not None or canon in table.ordered:
                self._price_entry(table, k, entries)
                continue
            table.compute_s[k] = table.compute_s[canon]
            table.comm_s[k] = {
                rename(a, perm): v for a, v in table.comm_s[canon].items()
            }
            # The same floats summed in the canonical's order: images are
            # exactly as fast, which the symmetry breaking relies on.
            table.time_s[k] = table.time_s[canon]
            table.once_s[k] = table.once_s[canon]
            table.buffer_bytes[k] = table.buffer_bytes[canon]
        if check is not None:
            table.time_s[check] = table.time_s[images[check][0]]
        return True

    def context(self, assignment: Mapping[str, int | None]) -> LayoutContext:
        """A LayoutContext for ``{dim: mesh axis index or None}``."""
        return CachedLayoutContext(self.mesh_shape, self.rules_for(assignment))

    def rules_for(self, assignment: Mapping[str, int | None]) -> LayoutRules:
        return LayoutRules(
            (d, self.mesh_shape[a].name) for d, a in assignment.items() if a is not None
        )

    def add_time(
        self, names: Iterable[str], seconds: Callable[[LayoutContext], float]
    ) -> None:
        """Counts ``seconds(ctx)`` in the time objective: a cost outside the
        graph that reads the layout of ``names`` only (a pipeline's
        stage-to-stage sends).  It is priced under every assignment of the
        free dims among ``names`` and added to the program's times and to
        :meth:`weighted_time_s` (as :attr:`TableCost.extra_s`), not to the
        tables' own times.  Where no layout splits any of ``names`` it is the
        same for every layout and is left out.  Replaces an earlier term."""
        dims = self.free(names)
        if not dims:
            self.extra_time = None
            return
        table = self._table(dims)
        priced = [seconds(self.context(dict(zip(dims, a)))) for a in table.assignments]
        for s in priced:
            if not (math.isfinite(s) and s >= 0):
                raise PlannerError(
                    f"an objective term over {dims} costs {s!r} s; expected a "
                    "finite number of seconds >= 0"
                )
        self.extra_time = (self.table_of[dims], np.asarray(priced, dtype=float))

    # -- phase 3 ---------------------------------------------------------------------
    def _memory_rows(self) -> None:
        """The analysis's live-set rows, with tensor classes merged by free
        dims (one column per table, plus a constant column for tensors no
        layout splits); duplicate rows dropped."""
        a = self.analysis
        columns: dict[int, int] = {}  # table index -> column
        target = []
        for names in a.tensor_classes:
            dims = self.free(names)
            if dims:
                self._table(dims)
                target.append(columns.setdefault(self.table_of[dims], len(columns)))
            else:
                target.append(-1)
        n = len(columns)
        mapping = np.zeros((len(a.tensor_classes), n + 1), dtype=np.int64)
        for c, col in enumerate(target):
            mapping[c, n if col < 0 else col] = 1
        matrix = a.live_rows @ mapping
        matrix = unique_rows(matrix) if len(matrix) else matrix
        self.row_classes = sorted(columns, key=columns.__getitem__)
        self.rows = matrix[:, :n]
        self.row_constants = matrix[:, n]

    def row_vector(
        self, counts: Mapping[tuple[Shape, str], int]
    ) -> tuple[np.ndarray, int]:
        """Buffers counted per (shape, dtype) (``MemoryModel.counts_by_class``)
        as a memory row: unsplit bytes per column (``row_classes``) and the
        bytes no layout splits.  Per device under an assignment, it is what
        the counted buffers' slices take, like every row."""
        column = {t: c for c, t in enumerate(self.row_classes)}
        out = np.zeros(len(self.row_classes), dtype=np.int64)
        constant = 0
        for (shape, dtype), n in counts.items():
            nbytes = n * shape.size * dtypes.size_bytes(dtype)
            dims = self.free(shape.dimension_names)
            if dims:
                out[column[self.table_of[dims]]] += nbytes
            else:
                constant += nbytes
        return out, constant

    # -- the integer program -------------------------------------------------------------
    def program(self, objective: Objective, capacity_bytes: int) -> IntegerProgram:
        """The integer program for ``objective`` under ``capacity_bytes``.

        Every table is hosted by a maximal table (one whose dims no other
        table's dims strictly contain): the program has one dim set per
        maximal table, carrying the summed costs of the tables it hosts.
        """
        hosts = self._hosts()
        dim_id = {d: i for i, d in enumerate(self.free_dims)}
        dim_x = tuple(
            tuple(self.x_index[(d, a)] for a in self.allowed[d]) for d in self.free_dims
        )
        conflicts = []
        for a, b in self.dim_graph.tensor_conflicts():
            for axis in set(self.allowed.get(a, ())) & set(self.allowed.get(b, ())):
                conflicts.append((self.x_index[(a, axis)], self.x_index[(b, axis)]))
        dimsets = []
        for h in hosts:
            host = self.tables[h.table]
            time_s = np.zeros(len(host.assignments))
            buffer = np.zeros(len(host.assignments), dtype=np.int64)
            invalid = np.zeros(len(host.assignments), dtype=bool)
            for t, proj in h.members:
                table = self.tables[t]
                time_s += self._weighted(table)[proj]
                if self.extra_time is not None and self.extra_time[0] == t:
                    time_s += self.extra_time[1][proj]
                buffer = np.maximum(buffer, np.asarray(table.buffer_bytes)[proj])
                invalid |= np.asarray([r is not None for r in table.invalid])[proj]
            if not (time_s < _MAX_FLOAT_S).all():  # inf and NaN too
                hw = self.hw
                raise PlannerError(
                    f"a layout of this graph could take {time_s.max():.3g} s on "
                    f"hardware {hw.name!r} (peak_flops {hw.peak_flops:g}, "
                    f"hbm_bandwidth_bytes_per_s {hw.hbm_bandwidth_bytes_per_s:g}), "
                    "more picoseconds than a float holds; expected smaller dims or "
                    "a profile with realistic rates and link bandwidths"
                )
            # Each dim's x variable per axis code (-1: unsplit), as columns.
            choices = np.full(h.codes.shape, -1, dtype=np.int64)
            for p, d in enumerate(host.dims):
                xs = np.full(len(self.mesh_shape) + 1, -1, dtype=np.int64)
                for axis in self.allowed[d]:
                    xs[axis + 1] = self.x_index[(d, axis)]
                choices[:, p] = xs[h.codes[:, p]]
            scaled = np.rint(time_s * PS_PER_S)  # round() as Python rounds
            time_ps = (
                tuple(scaled.astype(np.int64).tolist())
                if (scaled < 2.0**62).all()
                else tuple(int(round(t * PS_PER_S)) for t in time_s)
            )
            dimsets.append(
                DimsetSpec(
                    dims=tuple(dim_id[d] for d in host.dims),
                    choices=tuple(
                        tuple(row) for row in cast("list[list[int]]", choices.tolist())
                    ),
                    time_ps=time_ps,
                    buffer_bytes=tuple(buffer.tolist()),
                    invalid=tuple(invalid.tolist()),
                )
            )
        host_of: dict[int, tuple[int, np.ndarray]] = {}
        for k, h in enumerate(hosts):
            for t, proj in h.members:
                host_of[t] = (k, proj)
        tensor_classes = []
        for t in self.row_classes:
            k, proj = host_of[t]
            factors = np.asarray(self.tables[t].factor, dtype=np.int64)[proj]
            tensor_classes.append((k, tuple(int(f) for f in factors)))
        labels = [""] * len(self.x_index)
        for (name, axis), i in self.x_index.items():
            labels[i] = f"{name}@{self.mesh_shape[axis].name}"
        precedence = []
        for first, second in self.interchangeable_axes(hosts, dimsets):
            for k, name in enumerate(self.free_dims):
                if (name, second) in self.x_index:
                    earlier = tuple(
                        self.x_index[(e, first)]
                        for e in self.free_dims[:k]
                        if (e, first) in self.x_index
                    )
                    precedence.append((self.x_index[(name, second)], earlier))
        rows, constants = self.rows, self.row_constants
        if self.also_held is not None:
            held, held_constant = self.also_held
            rows, constants = rows + held, constants + held_constant
        return IntegerProgram(
            num_x=len(self.x_index),
            x_labels=tuple(labels),
            dim_x=dim_x,
            conflicts=tuple(sorted(set(conflicts))),
            dimsets=tuple(dimsets),
            tensor_classes=tuple(tensor_classes),
            row_bytes=rows,
            row_constants=constants,
            capacity_bytes=int(capacity_bytes),
            objective=objective,
            precedence=tuple(precedence),
            x_hint=None if self.hint is None else self._x_hint(self.hint),
        )

    def _x_hint(self, rules: LayoutRules) -> tuple[bool, ...]:
        names = self.mesh_shape.dimension_names
        axis_of = dict(rules)
        hint = [False] * len(self.x_index)
        for (d, a), i in self.x_index.items():
            hint[i] = axis_of.get(d) == names[a]
        return tuple(hint)

    def _weighted(self, table: DimsetTable) -> np.ndarray:
        """The table's time as the objective counts it (per-micro-batch part
        ``per_batch_weight`` times)."""
        time_s = np.asarray(table.time_s)
        w = self.per_batch_weight
        if w == 1:
            return time_s
        once = np.asarray(table.once_s)
        weighted: np.ndarray = (time_s - once) * w + once
        return weighted

    def weighted_time_s(self, cost: TableCost) -> float:
        """``cost``'s time as the time objective counts it: the per-micro-batch
        part ``per_batch_weight`` times, the once-per-step part once, and the
        term of :meth:`add_time`."""
        w = self.per_batch_weight
        if w == 1:
            return cost.time_s + cost.extra_s
        return (cost.time_s - cost.once_s) * w + cost.once_s + cost.extra_s

    def _hosts(self) -> list[_Host]:
        """The maximal tables, each with the tables it hosts (itself included)
        and, per hosted table, the index of the restricted assignment for each
        of the host's assignments."""
        dims = [frozenset(t.dims) for t in self.tables]
        maximal = sorted(
            (i for i, d in enumerate(dims) if not any(d < e for e in dims)),
            key=lambda i: (len(dims[i]), self.tables[i].dims),
        )

        # Assignments as arrays of axis index + 1 (0: unsplit), and each table
        # entry's number in a mixed radix of those: a host assignment's
        # restriction to a hosted table is then a search among its numbers.
        radix = len(self.mesh_shape) + 1
        codes = [assignment_codes(tuple(table.assignments)) for table in self.tables]
        hosts = {i: _Host(i, [], codes[i]) for i in maximal}
        for t, d in enumerate(dims):
            h = next(i for i in maximal if d <= dims[i])
            host = self.tables[h]
            pos = [host.dims.index(n) for n in self.tables[t].dims]
            if radix ** len(pos) >= _MAX_CODE:  # numbers too large for int64
                index = self.tables[t].index
                proj = np.fromiter(
                    (index[tuple(asg[p] for p in pos)] for asg in host.assignments),
                    dtype=np.int64,
                    count=len(host.assignments),
                )
                hosts[h].members.append((t, proj))
                continue
            weights = radix ** np.arange(len(pos), dtype=np.int64)
            own = codes[t] @ weights
            order = np.argsort(own, kind="stable")
            wanted = codes[h][:, pos] @ weights
            proj = order[np.searchsorted(own[order], wanted)]
            assert (own[proj] == wanted).all()  # each restriction is an entry
            hosts[h].members.append((t, proj))
        return [hosts[i] for i in maximal]

    def interchangeable_axes(
        self, hosts: Sequence[_Host], dimsets: Sequence[DimsetSpec]
    ) -> list[tuple[int, int]]:
        """Pairs ``(a, b)``, ``a < b``, of mesh axes of one size and one link
        whose swap maps every table entry (integer time, buffer, validity) to
        an equal one, so the program is symmetric under the swap; each axis is
        paired with the next such axis (a chain a < b < c gives two pairs)."""
        mesh = self.mesh_shape
        links = [self.hw.link_for_axis(d.name, mesh) for d in mesh]
        pairs = []
        for a in range(len(mesh)):
            for b in range(a + 1, len(mesh)):
                if (
                    mesh[a].size == mesh[b].size > 1
                    and links[a] == links[b]
                    and self._symmetric(a, b, hosts, dimsets)
                ):
                    pairs.append((a, b))
                    break
        return pairs

    def _symmetric(
        self, a: int, b: int, hosts: Sequence[_Host], dimsets: Sequence[DimsetSpec]
    ) -> bool:
        swap = {a: b, b: a}
        for table, spec in zip((self.tables[h.table] for h in hosts), dimsets):
            for k, asg in enumerate(table.assignments):
                other = table.index.get(
                    tuple(None if x is None else swap.get(x, x) for x in asg)
                )
                if (
                    other is None
                    or spec.time_ps[k] != spec.time_ps[other]
                    or spec.buffer_bytes[k] != spec.buffer_bytes[other]
                    or spec.invalid[k] != spec.invalid[other]
                ):
                    return False
        return True

    # -- layouts <-> x values ----------------------------------------------------------------
    def assignment_from_x(self, x: Sequence[bool]) -> dict[str, int | None]:
        out: dict[str, int | None] = {d: None for d in self.free_dims}
        for (d, a), i in self.x_index.items():
            if x[i]:
                out[d] = a
        return out

    def assignment_from_rules(self, rules: LayoutRules) -> dict[str, int | None]:
        """``{dim: axis or None}`` for ``rules``: every free dim, plus any other
        dim of the graph a rule splits (:meth:`table_cost` says why that is
        invalid).  Rules naming dims the graph lacks, or axes the mesh lacks,
        split nothing and are ignored."""
        names = self.mesh_shape.dimension_names
        out: dict[str, int | None] = {d: None for d in self.free_dims}
        for d, m in rules:
            if d in self.allowed and m in names:
                out[d] = names.index(m)
        return out

    def table_cost(self, assignment: Mapping[str, int | None]) -> TableCost:
        """Prices a full layout from the tables (exact up to float summation
        order; ``invalid`` says why the lowering would reject it)."""
        for d, a in assignment.items():
            if a is not None and a not in self.allowed.get(d, ()):
                why = self.dim_graph.why_whole(d, self.mesh_shape) or (
                    f"mesh axis {self.mesh_shape[a].name} does not divide it"
                )
                return invalid_cost(
                    f"{d!r} cannot be split over {self.mesh_shape[a].name!r}: {why}"
                )
        full = {d: assignment.get(d) for d in self.free_dims}
        for one, other in self.dim_graph.tensor_conflicts():
            axis = full.get(one)
            if axis is not None and axis == full.get(other):
                return invalid_cost(
                    f"{one!r} and {other!r} share tensor "
                    f"{self.dim_graph.meeting_place(one, other)} and cannot both be "
                    f"split over {self.mesh_shape[axis].name!r}"
                )
        compute = 0.0
        once = 0.0
        comm: dict[str, float] = {}
        buffer = 0
        picks = []
        for table in self.tables:
            k = table.index[tuple(full[d] for d in table.dims)]
            if table.invalid[k] is not None:
                return invalid_cost(table.invalid[k])
            picks.append(k)
            compute += table.compute_s[k]
            once += table.once_s[k]
            for key, s in table.comm_s[k].items():
                comm[key] = comm.get(key, 0.0) + s
            buffer = max(buffer, table.buffer_bytes[k])
        factors = np.array(
            [self.tables[t].factor[picks[t]] for t in self.row_classes], dtype=np.int64
        )
        peak = (
            int(((self.rows // factors).sum(axis=1) + self.row_constants).max())
            if len(self.rows)
            else 0
        )
        comm_items = tuple(sorted(comm.items()))
        extra = 0.0
        if self.extra_time is not None:
            t, seconds = self.extra_time
            extra = float(seconds[picks[t]])
        return TableCost(
            time_s=compute + sum(s for _, s in comm_items),
            compute_s=compute,
            comm_s_by_axis=comm_items,
            peak_bytes=peak + buffer,
            invalid=None,
            once_s=once,
            extra_s=extra,
        )

    def largest_tensors(
        self, assignment: Mapping[str, int | None], k: int = 5
    ) -> list[tuple[str, str, str, int]]:
        """The ``k`` biggest tensors (name, shape, kind, bytes per device) of the
        largest live set under ``assignment``: what to name when nothing fits."""
        ctx = self.context({d: a for d, a in assignment.items() if a is not None})
        return [
            (t.name, str(t.shape), t.kind, b)
            for t, b in self.memory.largest_in_peak(ctx, k)
        ]


@dataclass(frozen=True)
class _Host:
    """A maximal table and the tables it hosts, with their projections;
    ``codes[a, p]``: the mesh axis index + 1 (0: unsplit) that the table's
    assignment ``a`` gives its dim ``p``."""

    table: int
    members: list[tuple[int, np.ndarray]]
    codes: np.ndarray
