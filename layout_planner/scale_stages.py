"""A scale search's stage graphs and the programs that lay them out.

Each process of a search (:mod:`layout_planner.scale_search`) keeps one
:class:`Stages`: the small stage graphs it built, once per (micro-batch
size, recomputation, layers), their analyses and stacks
(:mod:`layout_planner.stacked`), and one :class:`SignaturePricer` per mesh,
whose unit prices the search's meshes share.  A :class:`Stage` is one
trial's stage: the integer program of its ``n`` layers, priced from those
graphs, and what a layout's pipelined step needs from it
(:class:`StepParts`).  :meth:`Stage.evaluated` prices a layout on the
stage's own full graph instead, the independent price the winner is
checked against.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cost_models.costs import Cost, evaluate
from cost_models.hardware import HardwareProfile
from cost_models.layout_cache import CachedLayoutContext
from cost_models.memory import MemoryModel, memory_model
from cost_models.pipeline import (
    HeldBytes,
    PipelineCost,
    PipelineSpec,
    StepSplit,
    pipeline_cost,
    send_time_s,
    split_step,
)
from cost_models.units import CostUnit, UnitCost, UnitPricer
from layout_planner.analysis import GraphAnalysis
from layout_planner.plan import LayoutPlan
from layout_planner.plan_mesh import plan_problem
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams
from layout_planner.scale_plan import (
    ScaleChoice,
    ScaleTrial,
    boundary_shape,
    stage_config_for,
)
from layout_planner.stacked import (
    DIRECT_LAYERS,
    LayerStack,
    StackedAnalysis,
    StackingError,
)
from layout_planner.tables import PricedTable
from mtf_core.comm import LayoutContext
from mtf_core.errors import LayoutError
from mtf_core.graph import Operation
from mtf_core.layout import LayoutRules
from mtf_core.models import TransformerConfig
from mtf_core.models.base import ModelGraph
from mtf_core.shapes import Shape, convert_to_shape


class SharedUnitCosts:
    """Unit costs shared by the :class:`SignaturePricer` of every mesh of a
    search (on one hardware profile), by two small integers: one for the
    unit's signature and dims, one for the name, size and link of each axis
    splitting them.  A table entry looks its units up under its one axes
    id, and two integers hash and compare without walking signatures and
    axis tuples at each of a search's hundred thousand lookups."""

    def __init__(self) -> None:
        self.costs: dict[tuple[int, int], UnitCost] = {}
        self._units: dict[tuple[Hashable, frozenset[str]], int] = {}
        self._axes: dict[tuple[tuple[str, str], ...], int] = {}

    def unit_id(self, unit: CostUnit) -> int:
        """The id of ``unit``'s signature and dims (equal for units that cost
        the same under every layout)."""
        return self._units.setdefault(
            (unit.signature, unit.dim_names), len(self._units)
        )

    def axes_id(self, on_axes: tuple[tuple[str, str], ...]) -> int:
        """The id of ``on_axes``: (dim name, axis as its name, size and
        link) pairs."""
        return self._axes.setdefault(on_axes, len(self._axes))


class SignaturePricer(UnitPricer):
    """A :class:`UnitPricer` that remembers each unit's cost by its signature
    and the layout of its own dims: units of equal signature cost the same
    under every layout (``cost_models.signatures``), so the stage graphs of
    one mesh (keep, recompute scores, recompute blocks; 2, 3 or 4 layers)
    price each shared unit once.  Layouts the lowering rejects raise again.

    ``shared``: costs by signature and by the name, size and link of each
    axis splitting the unit's dims, shared by the pricers of every mesh of a
    search: a unit reads nothing else of the mesh (its slices are its dims'
    sizes over those axes, and its collectives run over them), so meshes
    that agree on those axes (the same tensor axis under another pipeline,
    a weight's optimizer ops under any micro-batch) price it once."""

    def __init__(
        self,
        mesh_shape: Shape,
        hw: HardwareProfile,
        shared: SharedUnitCosts | None = None,
    ) -> None:
        super().__init__(mesh_shape, hw)
        #: Layouts the lowering rejects, by the key of ``shared`` (their
        #: messages name this mesh).
        self._rejected: dict[tuple[int, int], LayoutError] = {}
        #: Tables priced with this pricer (``LayoutProblem``'s ``table_memo``):
        #: a mesh's recomputation options share most of them.
        self.tables: dict[Hashable, PricedTable] = {}
        self._shared = SharedUnitCosts() if shared is None else shared
        # Each axis as one string: equal strings are equal (name, size,
        # link), as float reprs round-trip.
        self._axes = [
            repr((d.name, d.size, hw.link_for_axis(d.name, mesh_shape)))
            for d in mesh_shape
        ]
        #: ``split`` -> the shared id of its pairs with each axis as its string.
        self._splits: dict[tuple[tuple[str, int], ...], int] = {}
        #: Per sequence of units given to :meth:`costs` (by identity, kept
        #: alive beside it): each unit's shared id, None without a signature.
        self._unit_ids: dict[int, tuple[Sequence[CostUnit], list[int | None]]] = {}

    def cost(
        self,
        unit: CostUnit,
        ctx: LayoutContext,
        split: tuple[tuple[str, int], ...] | None = None,
    ) -> UnitCost:
        if unit.signature is None:
            return super().cost(unit, ctx)
        if split is None:  # the tables pass it; read it off the context
            axes_of = CachedLayoutContext.wrap(ctx).split_axes
            split = tuple(
                (n, axes_of[n]) for n in sorted(unit.dim_names) if n in axes_of
            )
        key = (self._shared.unit_id(unit), self._split_id(split))
        got = self._shared.costs.get(key)
        return self._price(key, unit, ctx) if got is None else got

    def costs(
        self,
        units: Sequence[CostUnit],
        ctx: LayoutContext,
        split: tuple[tuple[str, int], ...] | None = None,
    ) -> list[UnitCost]:
        if split is None:
            return super().costs(units, ctx, split)
        known = self._unit_ids.get(id(units))
        if known is None or known[0] is not units:
            ids = [
                None if u.signature is None else self._shared.unit_id(u) for u in units
            ]
            known = self._unit_ids[id(units)] = (units, ids)
        on = self._split_id(split)
        shared = self._shared.costs
        out = []
        for unit, uid in zip(units, known[1]):
            if uid is None:
                out.append(UnitPricer.cost(self, unit, ctx))
                continue
            key = (uid, on)
            got = shared.get(key)
            out.append(self._price(key, unit, ctx) if got is None else got)
        return out

    def _split_id(self, split: tuple[tuple[str, int], ...]) -> int:
        got = self._splits.get(split)
        if got is None:
            axes = self._axes
            got = self._splits[split] = self._shared.axes_id(
                tuple((n, axes[a]) for n, a in split)
            )
        return got

    def _price(
        self, key: tuple[int, int], unit: CostUnit, ctx: LayoutContext
    ) -> UnitCost:
        """Prices ``unit`` (not known under ``key``) and shares its cost."""
        rejected = self._rejected.get(key)
        if rejected is not None:
            raise rejected
        try:
            got = self._shared.costs[key] = UnitPricer.cost(
                self, unit, CachedLayoutContext.wrap(ctx)
            )
        except LayoutError as e:  # its message names this mesh
            self._rejected[key] = e
            raise
        return got


class StageGraph:
    """One built stage graph and what pricing a layout on it needs (its
    analysis is made only when a trial plans on it: the winner's full stage
    graph is only evaluated)."""

    def __init__(self, model: ModelGraph) -> None:
        self.model = model
        ops = model.graph.operations
        self.first_update = next(
            i for i, op in enumerate(ops) if op.name == "global_step"
        )
        # The forward ends at the loss, the last stage's head starts at its
        # final norm (cost_models.pipeline.held_bytes_per_micro_batch).
        self.first_backward = 1 + next(
            i for i, op in enumerate(ops) if op is model.loss.operation
        )
        self.head_start = next(
            (i for i, op in enumerate(ops) if op.name == "final_norm_scale"),
            self.first_backward,
        )

    @functools.cached_property
    def analysis(self) -> GraphAnalysis:
        # The optimizer's update runs once per step: the tables say how much
        # of a layout's time that is (the pipeline weighs the rest m + p - 1
        # times).
        return GraphAnalysis(
            self.model.graph, [self.model.loss], once_from=self.first_update
        )

    @functools.cached_property
    def held(self) -> HeldBytes:
        """What one micro-batch holds between its passes, under any layout."""
        return HeldBytes(
            self.model.graph, self.memory, self.first_backward, self.head_start
        )

    @functools.cached_property
    def memory(self) -> MemoryModel:
        if "analysis" in self.__dict__:
            return self.analysis.memory
        return memory_model(self.model.graph, [self.model.loss])


@dataclass(frozen=True)
class DerivedGraph:
    """A 3-layer stage graph not built (:meth:`Stages._new_stack`): what one
    micro-batch holds in it, derived from other graphs' (:func:`held_resized`)."""

    held: HeldBytes


def held_resized(ref2: HeldBytes, ref3: HeldBytes, two: HeldBytes) -> HeldBytes | None:
    """What one micro-batch holds in the 3-layer graph of a stage whose
    2-layer graph holds ``two``, where ``ref2`` and ``ref3`` are what it
    holds in the stage's 2- and 3-layer graphs at another micro-batch size:
    ``ref3``'s counts, each class with the shape that ``two`` gives its dim
    names.  None unless ``two`` holds ``ref2``'s classes (by dim names and
    dtype), as many of each, and each class of ``ref3`` is one of ``ref2``'s
    (the same sizes: none depends on the layers)."""

    def by_names(
        counts: Mapping[tuple[Shape, str], int],
    ) -> dict[tuple[tuple[str, ...], str], tuple[Shape, int]]:
        return {
            (tuple(shape.dimension_names), dtype): (shape, n)
            for (shape, dtype), n in counts.items()
        }

    old, new = by_names(ref2.counts), by_names(two.counts)
    if (
        len(old) != len(ref2.counts)
        or len(new) != len(two.counts)
        or {k: n for k, (_, n) in old.items()} != {k: n for k, (_, n) in new.items()}
    ):
        return None
    out = {}
    for (shape, dtype), n in ref3.counts.items():
        key = (tuple(shape.dimension_names), dtype)
        if key not in old or old[key][0] != shape:
            return None
        out[(new[key][0], dtype)] = n
    return HeldBytes.of_counts(out)


@dataclass(frozen=True)
class StepParts:
    """A layout's stage step cut as the pipeline needs it."""

    time_s: float
    once_s: float
    peak_bytes: int
    held_bytes: int


def in_layers(values: Sequence[Any], layers: int) -> Any:
    """A stage's value from its own graph's (``[v]``), or from its 2- and
    3-layer graphs' (``[v2, v3]``: affine in the layers)."""
    if len(values) == 1:
        return values[0]
    two, three = values
    return two + (layers - 2) * (three - two)


class Stage:
    """One trial's stage on ``mesh_shape``: pricing a layout from the tables
    of ``problem`` (the stacked program of ``layers`` layers, with
    ``graphs`` of 2 and 3 layers, the 3-layer one perhaps :class:`DerivedGraph`;
    or the stage's own graph's program, with ``graphs`` of one), or with
    ``evaluate`` on the stage's own graph."""

    def __init__(
        self,
        mesh_shape: Shape,
        hw: HardwareProfile,
        graphs: Sequence[StageGraph | DerivedGraph],
        layers: int,
        problem: LayoutProblem | None = None,
    ) -> None:
        self.mesh_shape = mesh_shape
        self.hw = hw
        self.graphs = list(graphs)
        self.layers = layers
        self.problem = problem

    def parts(self, rules: LayoutRules) -> StepParts:
        """The layout's parts from the program's tables (time, its
        once-per-step part and peak, all extrapolated exactly for a stacked
        stage) and from the graphs' held buffers (affine in the layers).
        Raises LayoutError for a layout the lowering rejects."""
        problem = self.problem
        assert problem is not None
        table = problem.table_cost(problem.assignment_from_rules(rules))
        if table.invalid is not None:
            raise LayoutError(table.invalid)
        ctx = LayoutContext.make(self.mesh_shape, rules)
        held = in_layers([g.held(ctx) for g in self.graphs], self.layers)
        return StepParts(table.time_s, table.once_s, table.peak_bytes, held)

    def evaluated(self, rules: LayoutRules) -> tuple[StepParts, Cost]:
        """The layout's parts from ``evaluate`` of the stage's own graph (the
        independent price the representative is checked against)."""
        (g,) = self.graphs
        assert isinstance(g, StageGraph)
        ctx = LayoutContext.make(self.mesh_shape, rules)
        seconds: dict[Operation, float] = {}
        cost = evaluate(
            g.model.graph,
            self.mesh_shape,
            rules,
            self.hw,
            [g.model.loss],
            g.memory,
            op_seconds=seconds,
        )
        split = split_step(g.model.graph, cost, ctx, self.hw, g.first_update, seconds)
        held = g.held(ctx)
        return StepParts(cost.time_s, split.once_s, cost.peak_memory_bytes, held), cost


class Stages:
    """Stage graphs built once per (micro-batch, recomputation, layers), and
    their analyses, shared by the trials of one search."""

    def __init__(
        self,
        cfg: TransformerConfig,
        builder: Callable[..., ModelGraph],
        optimizer: str,
        direct: bool = False,
    ) -> None:
        self.cfg = cfg
        self.builder = builder
        self.optimizer = optimizer
        #: Every stage on its own full graph (no representatives).
        self.direct = direct
        self._stages: dict[tuple[ScaleChoice, int], Stage] = {}
        self._graphs: dict[tuple[int, str, str, int], StageGraph] = {}
        self._stacked: dict[tuple[int, str, str, int], StackedAnalysis | None] = {}
        self._stacks: dict[tuple[int, str, str, int], LayerStack | None] = {}
        # The first stack made of each recomputation option, and its choice.
        self._references: dict[tuple[str, str], tuple[LayerStack, ScaleChoice]] = {}
        # 3-layer graphs not built (their stacks resized without them).
        self._derived: dict[tuple[int, str, str, int], DerivedGraph] = {}
        self._pricers: dict[tuple[str, str], SignaturePricer] = {}
        # Unit costs shared by every mesh's pricer, per profile (kept alive
        # beside its id).
        self._unit_costs: dict[int, tuple[HardwareProfile, SharedUnitCosts]] = {}
        self.built_layers = 0
        #: The layout of the last stage solved alone, a hint for the next.
        self.last_layout: LayoutRules | None = None

    def stage_config(self, choice: ScaleChoice, layers: int) -> TransformerConfig:
        return stage_config_for(self.cfg, choice, layers)

    def graph(self, choice: ScaleChoice, layers: int) -> StageGraph:
        key = self._key(choice, layers)
        got = self._graphs.get(key)
        if got is None:
            model = self.builder(
                self.stage_config(choice, layers), optimizer=self.optimizer
            )
            self.built_layers += layers
            got = self._graphs[key] = StageGraph(model)
        return got

    def _key(self, choice: ScaleChoice, layers: int) -> tuple[int, str, str, int]:
        return (
            self.cfg.batch // choice.micro_batches,
            choice.recompute_attention,
            choice.recompute_ffn,
            layers,
        )

    def stage(self, choice: ScaleChoice, hw: HardwareProfile) -> Stage:
        key = (choice, id(hw))  # one search prices on one profile
        got = self._stages.get(key)
        if got is None:
            got = self._stages[key] = self._stage(choice, hw)
        return got

    def _stage(self, choice: ScaleChoice, hw: HardwareProfile) -> Stage:
        n = self.cfg.num_layers // choice.stages
        mesh = convert_to_shape(choice.stage_mesh)
        stacked = (
            self._stacked_analysis(choice, n)
            if n > DIRECT_LAYERS and not self.direct
            else None
        )
        g = self.graph(choice, n if stacked is None else 2)
        pricer = self._pricers.get((choice.stage_mesh, hw.name))
        if pricer is None or pricer.hw != hw:
            shared = self._unit_costs.setdefault(id(hw), (hw, SharedUnitCosts()))[1]
            pricer = SignaturePricer(mesh, hw, shared)
            self._pricers[(choice.stage_mesh, hw.name)] = pricer
        # The objective is the pipelined step: each micro-batch slot
        # (m + p - 1 of them) runs the per-micro-batch part once.
        problem = LayoutProblem(
            g.model.graph,
            mesh,
            hw,
            [g.model.loss],
            analysis=stacked or g.analysis,
            pricer=pricer,
            per_batch_weight=choice.micro_batches + choice.stages - 1,
            table_memo=pricer.tables,
        )
        if choice.stages > 1:
            # Each slot also sends the boundary activation forward and its
            # gradient back (pipeline_cost): with them the objective is the
            # whole pipelined step, and a free layout's bound bounds it.
            slots = choice.micro_batches + choice.stages - 1
            cfg1 = self.stage_config(choice, 1)
            boundary = boundary_shape(cfg1)
            full_mesh = choice.full_mesh

            def sends(ctx: LayoutContext) -> float:
                nbytes = ctx.slice_bytes(boundary, cfg1.activation_dtype)
                return slots * 2 * send_time_s(nbytes, ("pp",), full_mesh, hw)

            problem.add_time(boundary.dimension_names, sends)
        graphs = [g] if stacked is None else [g, self._three(choice)]
        # The other micro-batches in flight hold their buffers through every
        # live set: the program's memory rows count them, so its layout fits
        # with them (the pipeline's peak, exactly as pipeline_cost adds it).
        k = PipelineSpec(choice.stages, choice.micro_batches, choice.schedule).in_flight
        if k > 1:
            held = [problem.row_vector(gr.held.counts) for gr in graphs]
            columns = in_layers([v for v, _ in held], n)
            constant = in_layers([c for _, c in held], n)
            problem.also_held = ((k - 1) * columns, (k - 1) * constant)
        return Stage(mesh, hw, graphs, n, problem)

    def _stacked_analysis(self, choice: ScaleChoice, n: int) -> StackedAnalysis | None:
        key = self._key(choice, n)
        if key not in self._stacked:
            stack = self._stack(choice)
            self._stacked[key] = None if stack is None else stack.analysis(n)
        return self._stacked[key]

    def _stack(self, choice: ScaleChoice) -> LayerStack | None:
        key = self._key(choice, 0)
        if key not in self._stacks:
            self._stacks[key] = self._new_stack(choice)
        return self._stacks[key]

    def _three(self, choice: ScaleChoice) -> StageGraph | DerivedGraph:
        """``choice``'s 3-layer stage graph, or what of it was derived."""
        derived = self._derived.get(self._key(choice, 3))
        return self.graph(choice, 3) if derived is None else derived

    def _new_stack(self, choice: ScaleChoice) -> LayerStack | None:
        """The stack of ``choice``'s stage; from the stack of another
        micro-batch size with its recomputation where one was made
        (:meth:`LayerStack.resized`: no 4-layer graph, and no 3-layer graph
        where its rows and held buffers are the reference's scaled exactly:
        what :meth:`_three` gives is then :class:`DerivedGraph`)."""
        two = self.graph(choice, 2)
        analysis = two.analysis  # before its held buffers: one memory model
        recompute = (choice.recompute_attention, choice.recompute_ffn)
        like = self._references.get(recompute)
        if like is not None:
            reference, of = like
            ref2, ref3 = (self.graph(of, k).held for k in (2, 3))
            held = held_resized(ref2, ref3, two.held)
            if held is not None:
                try:
                    stack = reference.resized(analysis)
                except StackingError:
                    pass  # with its 3-layer graph below
                else:
                    self._derived[self._key(choice, 3)] = DerivedGraph(held)
                    return stack
            try:
                return reference.resized(analysis, self.graph(choice, 3).analysis)
            except StackingError:
                pass  # stacked afresh below
        three, four = (self.graph(choice, k).analysis for k in (3, 4))
        try:
            stack = LayerStack(analysis, three, four)
        except StackingError:
            return None  # planned on its own graph
        self._references.setdefault(recompute, (stack, choice))
        return stack


def solve_stage(
    stage: Stage, limit: int, params: SolveParams, hint: LayoutRules | None = None
) -> LayoutPlan:
    """The stage's layout under ``limit`` bytes per device (what
    ``auto_layout`` would return for the stage graph, unverified); CP-SAT
    starts from ``hint``, if given (the answer is the same)."""
    problem = stage.problem
    assert problem is not None
    # The tables do not depend on the capacity or the hint: the same
    # problem, another limit (its program reads hw.memory_bytes) and hint.
    problem = copy.copy(problem)
    problem.hw = problem.hw.with_memory(limit)
    problem.hint = hint
    return plan_problem(problem, Objective.TIME, params, verify=False, extras=False)


def price_step(
    parts: StepParts,
    rules: LayoutRules,
    choice: ScaleChoice,
    spec: PipelineSpec,
    stage_cfg: TransformerConfig,
    hw: HardwareProfile,
) -> PipelineCost:
    """The pipelined step of ``rules`` whose stage step is ``parts``."""
    ctx = LayoutContext.make(choice.stage_mesh, rules)
    boundary = ctx.slice_bytes(boundary_shape(stage_cfg), stage_cfg.activation_dtype)
    return pipeline_cost(
        spec,
        StepSplit(parts.time_s - parts.once_s, parts.once_s),
        parts.peak_bytes,
        parts.held_bytes,
        hw.memory_bytes,
        boundary,
        ("pp",),
        choice.full_mesh,
        hw,
    )


@dataclass(frozen=True)
class Outcome:
    trial: ScaleTrial
    plan: LayoutPlan | None
    priced: PipelineCost | None


#: A layout's parts and ``evaluate``'s price on a full stage graph.
Checked = tuple[StepParts, Cost]
