"""The scale planner's search on representative stage graphs.

:func:`layout_planner.choices.plan_transformer` tries meshes ``pp x dp x tp``
and recomputation options; each trial lays out a stage of ``n = L / pp``
identical layers.  Its exhaustive form builds, analyses, solves and
evaluates the ``n``-layer graph in every trial.  This module prices the same
trials from graphs of 2, 3 and 4 layers (:mod:`layout_planner.stacked`):

* the integer program of the ``n``-layer stage (unit counts and memory rows)
  is extrapolated exactly, so CP-SAT picks the layout it would pick on the
  full stage graph;
* the pipeline's inputs for a layout (``cost_models.pipeline``: the
  once-per-step work, what each other micro-batch in flight holds) are
  affine in the layers: ``f(n) = f(2) + (n - 2) (f(3) - f(2))``, from
  ``evaluate`` of the 2- and 3-layer graphs; step time and peak come from the
  extrapolated program's tables;
* small graphs are built and analysed once per (micro-batch, recomputation)
  and reused by every mesh that shares them (a micro-batch size's stack
  resized from another's needs its 2-layer graph only,
  :meth:`~layout_planner.stacked.LayerStack.resized`); stages of at most
  :data:`~layout_planner.stacked.DIRECT_LAYERS` layers, and stages whose
  layers do not stack (an encoder-decoder's decoder reads the encoder output
  in every layer), are planned on their own graph.

Only the winning trial's full stage graph is built: ``evaluate`` prices its
layout, and :class:`ScaleVerificationError` is raised if that price is not
the representative's (step time within float rounding, bytes exactly).

On each mesh the least-recomputing option is laid out with no memory limit
and kept if it fits (recomputation only adds work); otherwise recomputation
and layout are one CP-SAT program (:mod:`layout_planner.recompute_program`).
``exhaustive=True`` runs the same search with every stage on its own full
graph, which ``tests/test_scale_search.py`` checks returns the same plan and
trials.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

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
from layout_planner.baselines import plan_cost
from layout_planner.errors import PlannerError, SolverError
from layout_planner.plan import LayoutPlan
from layout_planner.plan_mesh import plan_problem
from layout_planner.problem import LayoutProblem, PricedTable
from layout_planner.program import Objective, SolveParams
from layout_planner.recompute_program import solve_with_recomputation
from layout_planner.scale_bounds import flops_bound_s
from layout_planner.scale_plan import (
    ScaleChoice,
    ScaleError,
    ScalePlan,
    ScaleTrial,
    boundary_shape,
    stage_config_for,
    weight_sharding,
)
from layout_planner.scale_workers import WorkerError, Workers, fork_is_safe
from layout_planner.stacked import (
    DIRECT_LAYERS,
    LayerStack,
    StackedAnalysis,
    StackingError,
)
from mtf_core.comm import LayoutContext
from mtf_core.errors import LayoutError
from mtf_core.graph import Operation
from mtf_core.layout import LayoutRules, convert_to_layout_rules
from mtf_core.models import TransformerConfig
from mtf_core.models.base import ModelGraph
from mtf_core.shapes import Shape, convert_to_shape

#: Relative tolerance between the representative's step time and the full
#: stage graph's (the same float terms, summed in another order).
REL_TOL = 1e-9


class NothingFaster(ScaleError):
    """A search given an incumbent step found none faster; ``trials`` are
    the trials it ran."""

    def __init__(self, message: str, trials: tuple[ScaleTrial, ...]) -> None:
        super().__init__(message)
        self.trials = trials


class ScaleVerificationError(PlannerError):
    """The full stage graph prices the chosen layout differently from its
    representative (a bug: the layers did not stack as assumed)."""


class _SignaturePricer(UnitPricer):
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
        shared: dict[tuple[object, ...], UnitCost] | None = None,
    ) -> None:
        super().__init__(mesh_shape, hw)
        #: Layouts the lowering rejects, by the key of ``shared`` (their
        #: messages name this mesh).
        self._rejected: dict[tuple[object, ...], LayoutError] = {}
        #: Tables priced with this pricer (``LayoutProblem``'s ``table_memo``):
        #: a mesh's recomputation options share most of them.
        self.tables: dict[Hashable, PricedTable] = {}
        self._shared = {} if shared is None else shared
        # Each axis as one string (its hash is computed once, where a
        # LinkSpec's is computed at every lookup): equal strings are equal
        # (name, size, link), as float reprs round-trip.
        self._axes = [
            repr((d.name, d.size, hw.link_for_axis(d.name, mesh_shape)))
            for d in mesh_shape
        ]
        #: ``split`` -> the same pairs with each axis as its string.
        self._splits: dict[tuple[tuple[str, int], ...], tuple[object, ...]] = {}

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
        on_axes = self._splits.get(split)
        if on_axes is None:
            axes = self._axes
            on_axes = self._splits[split] = tuple((n, axes[a]) for n, a in split)
        key = (unit.signature, unit.dim_names, on_axes)
        got = self._shared.get(key)
        if got is None:
            rejected = self._rejected.get(key)
            if rejected is not None:
                raise rejected
            try:
                got = self._shared[key] = super().cost(
                    unit, CachedLayoutContext.wrap(ctx)
                )
            except LayoutError as e:  # its message names this mesh
                self._rejected[key] = e
                raise
        return got


class _Graph:
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
class _Derived:
    """A 3-layer stage graph not built (:meth:`_Stages._new_stack`): what one
    micro-batch holds in it, derived from other graphs' (:func:`_held_resized`)."""

    held: HeldBytes


def _held_resized(ref2: HeldBytes, ref3: HeldBytes, two: HeldBytes) -> HeldBytes | None:
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
class _Parts:
    """A layout's stage step cut as the pipeline needs it."""

    time_s: float
    once_s: float
    peak_bytes: int
    held_bytes: int


def _in_layers(values: Sequence[Any], layers: int) -> Any:
    """A stage's value from its own graph's (``[v]``), or from its 2- and
    3-layer graphs' (``[v2, v3]``: affine in the layers)."""
    if len(values) == 1:
        return values[0]
    two, three = values
    return two + (layers - 2) * (three - two)


class _Stage:
    """One trial's stage on ``mesh_shape``: pricing a layout from the tables
    of ``problem`` (the stacked program of ``layers`` layers, with
    ``graphs`` of 2 and 3 layers, the 3-layer one perhaps :class:`_Derived`;
    or the stage's own graph's program, with ``graphs`` of one), or with
    ``evaluate`` on the stage's own graph."""

    def __init__(
        self,
        mesh_shape: Shape,
        hw: HardwareProfile,
        graphs: Sequence[_Graph | _Derived],
        layers: int,
        problem: LayoutProblem | None = None,
    ) -> None:
        self.mesh_shape = mesh_shape
        self.hw = hw
        self.graphs = list(graphs)
        self.layers = layers
        self.problem = problem

    def parts(self, rules: LayoutRules) -> _Parts:
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
        held = _in_layers([g.held(ctx) for g in self.graphs], self.layers)
        return _Parts(table.time_s, table.once_s, table.peak_bytes, held)

    def evaluated(self, rules: LayoutRules) -> tuple[_Parts, Cost]:
        """The layout's parts from ``evaluate`` of the stage's own graph (the
        independent price the representative is checked against)."""
        (g,) = self.graphs
        assert isinstance(g, _Graph)
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
        return _Parts(cost.time_s, split.once_s, cost.peak_memory_bytes, held), cost


class _Stages:
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
        self._stages: dict[tuple[ScaleChoice, int], _Stage] = {}
        self._graphs: dict[tuple[int, str, str, int], _Graph] = {}
        self._stacked: dict[tuple[int, str, str, int], StackedAnalysis | None] = {}
        self._stacks: dict[tuple[int, str, str, int], LayerStack | None] = {}
        # The first stack made of each recomputation option, and its choice.
        self._references: dict[tuple[str, str], tuple[LayerStack, ScaleChoice]] = {}
        # 3-layer graphs not built (their stacks resized without them).
        self._derived: dict[tuple[int, str, str, int], _Derived] = {}
        self._pricers: dict[tuple[str, str], _SignaturePricer] = {}
        # Unit costs shared by every mesh's pricer, per profile (kept alive
        # beside its id).
        self._unit_costs: dict[
            int, tuple[HardwareProfile, dict[tuple[object, ...], UnitCost]]
        ] = {}
        self.built_layers = 0
        #: The layout of the last stage solved alone, a hint for the next.
        self.last_layout: LayoutRules | None = None

    def stage_config(self, choice: ScaleChoice, layers: int) -> TransformerConfig:
        return stage_config_for(self.cfg, choice, layers)

    def graph(self, choice: ScaleChoice, layers: int) -> _Graph:
        key = self._key(choice, layers)
        got = self._graphs.get(key)
        if got is None:
            model = self.builder(
                self.stage_config(choice, layers), optimizer=self.optimizer
            )
            self.built_layers += layers
            got = self._graphs[key] = _Graph(model)
        return got

    def _key(self, choice: ScaleChoice, layers: int) -> tuple[int, str, str, int]:
        return (
            self.cfg.batch // choice.micro_batches,
            choice.recompute_attention,
            choice.recompute_ffn,
            layers,
        )

    def stage(self, choice: ScaleChoice, hw: HardwareProfile) -> _Stage:
        key = (choice, id(hw))  # one search prices on one profile
        got = self._stages.get(key)
        if got is None:
            got = self._stages[key] = self._stage(choice, hw)
        return got

    def _stage(self, choice: ScaleChoice, hw: HardwareProfile) -> _Stage:
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
            shared = self._unit_costs.setdefault(id(hw), (hw, {}))[1]
            pricer = _SignaturePricer(mesh, hw, shared)
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
            columns = _in_layers([v for v, _ in held], n)
            constant = _in_layers([c for _, c in held], n)
            problem.also_held = ((k - 1) * columns, (k - 1) * constant)
        return _Stage(mesh, hw, graphs, n, problem)

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

    def _three(self, choice: ScaleChoice) -> _Graph | _Derived:
        """``choice``'s 3-layer stage graph, or what of it was derived."""
        derived = self._derived.get(self._key(choice, 3))
        return self.graph(choice, 3) if derived is None else derived

    def _new_stack(self, choice: ScaleChoice) -> LayerStack | None:
        """The stack of ``choice``'s stage; from the stack of another
        micro-batch size with its recomputation where one was made
        (:meth:`LayerStack.resized`: no 4-layer graph, and no 3-layer graph
        where its rows and held buffers are the reference's scaled exactly:
        what :meth:`_three` gives is then :class:`_Derived`)."""
        two = self.graph(choice, 2)
        analysis = two.analysis  # before its held buffers: one memory model
        recompute = (choice.recompute_attention, choice.recompute_ffn)
        like = self._references.get(recompute)
        if like is not None:
            reference, of = like
            ref2, ref3 = (self.graph(of, k).held for k in (2, 3))
            held = _held_resized(ref2, ref3, two.held)
            if held is not None:
                try:
                    stack = reference.resized(analysis)
                except StackingError:
                    pass  # with its 3-layer graph below
                else:
                    self._derived[self._key(choice, 3)] = _Derived(held)
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


def _solve(
    stage: _Stage, limit: int, params: SolveParams, hint: LayoutRules | None = None
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


def _price(
    parts: _Parts,
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
class _Outcome:
    trial: ScaleTrial
    plan: LayoutPlan | None
    priced: PipelineCost | None


#: Bytes per device for the solve that ignores the capacity (CP-SAT's sums
#: must stay within 64 bits).
_UNLIMITED = 2**50

#: How much each recomputation option recomputes, per block class.
_LEVEL = {"none": 0, "scores": 1, "block": 2}


def _solve_options(
    stages: _Stages,
    options: Sequence[ScaleChoice],
    hw: HardwareProfile,
    params: SolveParams,
    limits: Mapping[ScaleChoice, int],
    smallest_peak: bool = True,
) -> tuple[ScaleChoice, LayoutPlan]:
    """The fastest (option, layout) of ``options`` (one mesh), each option
    under its ``limits`` bytes per device: one CP-SAT solve, the option a
    decision of the program
    (:func:`~layout_planner.recompute_program.solve_with_recomputation`;
    ``smallest_peak=False``: where no option fits, it raises
    ``NothingFitsError`` instead of finding the smallest peak)."""
    if len(options) == 1:
        c = options[0]
        # The last layout this process found (most often of a mesh with
        # the same axes) takes CP-SAT near this one's: GPT-3's free layouts
        # solve in half the time (docs/scale.md, "Planning time").
        plan = _solve(stages.stage(c, hw), limits[c], params, stages.last_layout)
        stages.last_layout = plan.layout_rules
        return c, plan
    problems = {}
    for c in options:
        problem = stages.stage(c, hw).problem
        assert problem is not None
        problems[c] = problem
    got = solve_with_recomputation(
        problems,
        params,
        capacity_bytes={c: limits[c] for c in options},
        smallest_peak=smallest_peak,
    )
    return got.key, got.plan


def _trial(
    stages: _Stages,
    options: Sequence[ScaleChoice],
    spec: PipelineSpec,
    hw: HardwareProfile,
    params: SolveParams,
    limit: int | None = None,
    smallest_peak: bool = True,
) -> _Outcome:
    """The fastest fitting (option, layout) of ``options`` on their mesh,
    each under ``limit`` bytes per device (the hardware's capacity if None;
    ``smallest_peak``: see :func:`_solve_options`).

    The program's objective is the pipelined step (``m + p - 1`` times the
    per-micro-batch part, plus the once-per-step part), so it weighs a
    stored weight's gather in every micro-batch against a slots-only
    weight's once per step itself; its memory rows hold what the ``k - 1``
    other micro-batches in flight keep (``LayoutProblem.also_held``), so its
    answer fits exactly when some layout of the options does."""
    first = hw.memory_bytes if limit is None else limit
    choice, plan = _solve_options(
        stages, options, hw, params, {c: first for c in options}, smallest_peak
    )
    stage = stages.stage(choice, hw)
    parts = stage.parts(plan.layout_rules)
    priced = _price(
        parts, plan.layout_rules, choice, spec, stages.stage_config(choice, 1), hw
    )
    trial = ScaleTrial(
        choice,
        priced.step_time_s,
        priced.peak_memory_bytes,
        priced.fits,
        str(plan.layout_rules),
    )
    return _Outcome(trial, plan, priced)


def _least(options: Sequence[ScaleChoice]) -> ScaleChoice | None:
    """The option that recomputes no more than any other in every block
    class (its graph's ops are in every other's), if there is one."""

    def level(c: ScaleChoice) -> tuple[int, int]:
        return _LEVEL[c.recompute_attention], _LEVEL[c.recompute_ffn]

    least = min(options, key=level)
    a, f = level(least)
    if all(a <= level(c)[0] and f <= level(c)[1] for c in options):
        return least
    return None


def _free_trial(
    stages: _Stages,
    options: Sequence[ScaleChoice],
    spec: PipelineSpec,
    hw: HardwareProfile,
    params: SolveParams,
) -> tuple[_Outcome | None, float]:
    """The least-recomputing option laid out with no memory limit, and a
    lower bound on every trial of the mesh.

    The program's objective is the pipelined step without its sends
    (``m + p - 1`` times the per-micro-batch part, plus the once-per-step
    part: :class:`LayoutProblem`'s ``per_batch_weight``), so its optimum
    (CP-SAT's proven bound) bounds every layout of this option from below,
    and of every other option too: recomputation only adds per-micro-batch
    work to a layout, and a memory limit only removes layouts.  If that
    layout fits, nothing on this mesh beats it.  Without a least option
    (``options`` that do not nest) there is no free trial: ``(None, 0)``."""
    least = _least(options)
    if least is None:
        return None, 0.0
    free = _trial(stages, [least], spec, hw, params, limit=_UNLIMITED)
    assert free.plan is not None
    bound = free.plan.solver.best_bound
    return free, 0.0 if bound is None else bound


@dataclass(frozen=True)
class Mesh:
    """One mesh of the search and its lower bound on the step."""

    bound_s: float
    stages: int
    tensor: int
    data: int
    micro_batches: int
    spec: PipelineSpec
    sequence: int = 1

    @property
    def sizes(self) -> tuple[int, int, int, int, int]:
        """(pp, dp, sp, tp, micro-batches): a trial's ``ScaleChoice.mesh_sizes``
        and micro-batch count."""
        return (self.stages, self.data, self.sequence, self.tensor, self.micro_batches)

    def __str__(self) -> str:
        sp = f" x sp {self.sequence}" if self.sequence > 1 else ""
        return f"pp {self.stages} x dp {self.data}{sp} x tp {self.tensor}"


def search(
    cfg: TransformerConfig,
    meshes: Sequence[Mesh],
    hw: HardwareProfile,
    builder: Callable[..., ModelGraph],
    optimizer: str,
    schedule: str,
    recompute: Sequence[tuple[str, str]],
    time_limit_s: float,
    flops: float,
    devices: int,
    verify: bool = True,
    progress: Callable[[str, float], None] | None = None,
    exhaustive: bool = False,
    encoder_decoder: bool = False,
    workers: int = 1,
    incumbent_s: float = math.inf,
    joint_programs: bool = True,
    fewer_micro_batches: bool = False,
) -> ScalePlan:
    """The search of :func:`~layout_planner.choices.plan_transformer` over
    ``meshes`` (sorted by bound), on representative stage graphs (on each
    trial's full stage graph when ``exhaustive``); the winner verified on its
    full stage graph when ``verify``; ``progress(phase, fraction)`` before
    each trial and before the check.

    Two passes, each stopping where no remaining mesh can beat the best
    fitting step found (both bounds are valid, so the answer is the fastest
    fitting trial of all meshes):

    1. in order of the flops bound (:mod:`layout_planner.scale_bounds`),
       each mesh's free trial (:func:`_free_trial`): its layout is the mesh's
       best if it fits, and its objective bounds the mesh from below if not;
    2. in order of those bounds, the meshes whose free layout did not fit:
       recomputation and layout as one program under the capacity
       (:func:`_trial`).

    ``incumbent_s``: a step found elsewhere; meshes whose bound is no
    better are skipped, and where no trial beats it :class:`NothingFaster`
    is raised (with the trials run).  Without ``joint_programs``, only the
    first pass runs: a mesh counts only where its free layout fits.
    ``fewer_micro_batches``: then, on the best mesh, fewer and larger
    micro-batches (:func:`_fewer_rounds`), by the same processes.

    ``workers > 1`` lays meshes out ahead on that many forked processes
    (:class:`_Ahead`); the passes take their results in the order above, so
    the trials and the plan are the same for any number of workers.
    """
    start = time.perf_counter()
    params = SolveParams(time_limit_s, 0, 0, 1, presolve=False)

    def new_stages() -> _Stages:
        return _Stages(cfg, builder, optimizer, direct=exhaustive)

    def mesh_options(mesh: Mesh) -> list[ScaleChoice]:
        pp, tp, dp, m = mesh.stages, mesh.tensor, mesh.data, mesh.micro_batches
        sp = mesh.sequence
        return [ScaleChoice(pp, dp, tp, m, schedule, a, f, sp) for a, f in recompute]

    def lay_out(stages: _Stages, mesh: Mesh) -> _Free:
        try:
            free, bound = _free_trial(stages, mesh_options(mesh), mesh.spec, hw, params)
        except (PlannerError, SolverError) as e:
            return _Free(None, 0.0, str(e))
        return _Free(free, bound, None)

    def joint(stages: _Stages, mesh: Mesh) -> _Outcome | str:
        try:
            # Where nothing fits, the trial says so; the smallest peak (a
            # memory-objective program per option) is not worth its time.
            return _trial(
                stages, mesh_options(mesh), mesh.spec, hw, params, smallest_peak=False
            )
        except (PlannerError, SolverError) as e:
            return str(e)

    def check(stages: _Stages, task: tuple[ScaleChoice, str]) -> _Checked | str:
        choice, rules = task
        try:
            return _full_evaluation(stages, choice, convert_to_layout_rules(rules), hw)
        except Exception as e:  # a guess's failure is the parent's to find again
            return f"{type(e).__name__}: {e}"

    def run(stages: _Stages, task: tuple[str, Any]) -> _Result:
        kind, what = task
        if kind == "check":
            return check(stages, what)
        return lay_out(stages, what) if kind == "free" else joint(stages, what)

    def fewer(choice: ScaleChoice, step_s: float) -> list[Mesh]:
        return _fewer_meshes(cfg, choice, hw, flops, schedule, step_s)

    source: _Source
    if workers > 1 and len(meshes) > 1 and fork_is_safe():
        source = _Ahead(
            meshes,
            run,
            new_stages,
            workers,
            check_ahead=verify,
            incumbent_s=incumbent_s,
            joint_programs=joint_programs,
            fewer=fewer if fewer_micro_batches else None,
        )
    else:
        source = _InProcess(meshes, run, new_stages())
    checked: _Checked | None = None
    with source:
        refine = None
        if fewer_micro_batches:

            def refine(
                best: _Outcome, trials: list[ScaleTrial], done: float
            ) -> _Outcome:
                return _fewer_rounds(
                    best, fewer, mesh_options, source, trials, progress, done
                )

        trials, best = _passes(
            meshes, mesh_options, source, progress, incumbent_s, joint_programs, refine
        )
        if best is None and incumbent_s < math.inf:
            raise NothingFaster(
                f"no trial beats the step of {incumbent_s:.6g} s "
                f"({len(trials)} trials)",
                tuple(trials),
            )
        if verify and best is not None:
            if progress is not None:
                progress(f"checking {best.trial.choice} on its full stage graph", 1.0)
            if isinstance(source, _Ahead):
                # A worker left idle near the end priced the fastest fitting
                # trial on its full stage graph, if it is the winner.
                checked = source.checked(best.trial.choice, best.trial.layout_rules)
    if best is None:
        smallest = min(
            (t for t in trials if t.peak_memory_bytes is not None),
            key=lambda t: t.peak_memory_bytes or 0,
            default=None,
        )
        where = f"{cfg.num_layers} layers on {devices} devices of {hw.name!r}"
        if smallest is None:  # nothing was laid out: say why (each reason once)
            notes = list(dict.fromkeys(t.note for t in trials if t.note))
            more = f" (and {len(notes) - 3} more)" if len(notes) > 3 else ""
            raise ScaleError(
                f"no plan for {where}: none of the {len(trials)} trials could be "
                f"laid out: {'; '.join(notes[:3])}{more}"
            )
        raise ScaleError(
            f"no plan for {where} fits in {hw.memory_bytes:,} B per device "
            f"({len(trials)} trials); the smallest peak was "
            f"{smallest.peak_memory_bytes:,} B per device ({smallest.choice})"
        )
    assert best.plan is not None and best.priced is not None
    plan, priced = best.plan, best.priced
    choice = best.trial.choice
    if verify:
        # Where the search ran in this process, its graphs (a stage of up to
        # 4 layers is one of them) are reused.
        on = source.stages if isinstance(source, _InProcess) else new_stages()
        if checked is None:
            checked = _full_evaluation(on, choice, plan.layout_rules, hw)
        plan, priced = _verified(
            choice, plan, priced, hw, checked, on.stage_config(choice, 1)
        )
    sharded, slots_only = weight_sharding(plan.layout_rules)
    return ScalePlan(
        config=cfg,
        hardware=hw,
        devices=devices,
        choice=choice,
        stage_plan=plan,
        pipeline=priced,
        model_flops=flops,
        trials=tuple(trials),
        planning_s=time.perf_counter() - start,
        sharded_classes=sharded,
        slot_sharded_classes=slots_only,
        optimizer=optimizer,
        encoder_decoder=encoder_decoder,
    )


def _passes(
    meshes: Sequence[Mesh],
    mesh_options: Callable[[Mesh], list[ScaleChoice]],
    source: _Source,
    progress: Callable[[str, float], None] | None,
    incumbent_s: float = math.inf,
    joint_programs: bool = True,
    refine: Callable[[_Outcome, list[ScaleTrial], float], _Outcome] | None = None,
) -> tuple[list[ScaleTrial], _Outcome | None]:
    """The two passes of :func:`search`, taking each mesh's results from
    ``source``: the trials, in order, and the fastest fitting outcome faster
    than ``incumbent_s`` (a step found elsewhere).  A mesh is skipped when
    its bound is no better than the best step found or the incumbent;
    without ``joint_programs``, the second pass is not run.

    ``refine(best, trials, done)`` (the fewer-micro-batch rounds, which add
    their trials to ``trials`` and report progress at the fraction ``done``)
    runs on the first pass's best before the second pass where
    :func:`_refined_first` says so (a faster step prunes more of the second
    pass), and on the best after the second pass unless it refined that
    one already."""
    trials: list[ScaleTrial] = []
    best: tuple[tuple[float, int, int, int], _Outcome] | None = None
    # The recomputation options, in one order on every mesh (a tie's rank).
    order = []
    if meshes:
        order = [
            (o.recompute_attention, o.recompute_ffn) for o in mesh_options(meshes[0])
        ]

    def beaten(bound: float) -> bool:
        return bound >= (incumbent_s if best is None else best[0][0])

    def consider(outcome: _Outcome) -> None:
        """Keeps ``outcome`` if it fits and beats the incumbent and the best."""
        nonlocal best
        if outcome.priced is None or not outcome.trial.fits:
            return
        c = outcome.trial.choice
        rank = order.index((c.recompute_attention, c.recompute_ffn))
        key = (outcome.priced.step_time_s, c.stages, c.sequence, rank)
        if key[0] < incumbent_s and (best is None or key < best[0]):
            best = (key, outcome)

    def report(phase: str, fraction: float) -> None:
        if progress is not None:
            progress(phase + source.suffix, fraction)

    index = [source.add(mesh) for mesh in meshes]  # the source's
    pending: list[tuple[float, int]] = []
    for i, mesh in enumerate(meshes):
        if beaten(mesh.bound_s):
            break  # no remaining mesh can be faster
        options = mesh_options(mesh)
        report(f"mesh {i + 1} of {len(meshes)}: {mesh}", 0.8 * i / len(meshes))
        got = source.free(index[i])
        if got.error is not None:
            trials.append(ScaleTrial(options[0], None, None, False, "", got.error))
            continue
        free = got.outcome
        if free is not None:
            trials.append(free.trial)
            if free.trial.fits:
                consider(free)
                continue
        if joint_programs:
            pending.append((max(got.bound_s, mesh.bound_s), i))
    refined = None
    if refine is not None and best is not None and _refined_first(best[1].trial):
        refined = refine(best[1], trials, 0.8)
        consider(refined)
    pending.sort()
    for j, (bound, i) in enumerate(pending):
        if beaten(bound):
            break  # no remaining mesh can be faster
        mesh, options = meshes[i], mesh_options(meshes[i])
        report(
            f"recomputation on {mesh} ({j + 1} of {len(pending)})",
            0.8 + 0.2 * j / len(pending),
        )
        outcome = source.joint(index[i])
        if isinstance(outcome, str):
            trials.append(ScaleTrial(options[0], None, None, False, "", outcome))
        else:
            trials.append(outcome.trial)
            consider(outcome)
    if refine is not None and best is not None and best[1] is not refined:
        consider(refine(best[1], trials, 1.0))
    return trials, None if best is None else best[1]


def _refined_first(trial: ScaleTrial) -> bool:
    """Whether the first pass's best ``trial`` gets its fewer micro-batches
    before the joint programs (whose bounds a faster step there prunes):
    where it has one stage, whose larger micro-batches lengthen no bubble,
    so that they are likely to be faster where they fit.  On more stages the
    round seldom wins before the joint programs (GPT-3's and Llama-2-70B on
    512 H100's did not, docs/scale.md), and it runs after them."""
    return trial.choice.stages == 1


def _fewer_rounds(
    best: _Outcome,
    fewer: Callable[[ScaleChoice, float], list[Mesh]],
    mesh_options: Callable[[Mesh], list[ScaleChoice]],
    source: _Source,
    trials: list[ScaleTrial],
    progress: Callable[[str, float], None] | None,
    done: float = 1.0,
) -> _Outcome:
    """``best`` or, on its mesh, the fastest fitting outcome with fewer,
    larger micro-batches: fewer slots to pay each micro-batch's fixed costs
    (per-op overheads, collectives' latency, a stored weight's gathers), at
    the price of a longer bubble and more held activations.

    Each round lays out free the meshes that ``fewer(choice, step)`` gives
    (:func:`_fewer_meshes`: half and a quarter as many) and goes on from the
    fewest only while the fewest wins.  A count counts only where its free
    layout (the least recomputation, the best layout without a memory
    limit) fits and beats the best step: the joint programs that would
    trade recomputation for room cost more than this refinement is worth,
    and larger micro-batches that need more recomputation seldom win.  Its
    trials are added to ``trials``; ``progress`` hears of each at the
    search's fraction ``done``."""
    report = None
    if progress is not None:

        def report(phase: str, fraction: float) -> None:
            progress(f"fewer micro-batches: {phase}", done)

    while True:
        assert best.priced is not None
        meshes = fewer(best.trial.choice, best.priced.step_time_s)
        if not meshes:
            return best
        more, winner = _passes(
            meshes,
            mesh_options,
            source,
            report,
            best.priced.step_time_s,
            joint_programs=False,
        )
        trials.extend(more)
        if winner is None:
            return best  # none faster among those whose free layout fits
        best = winner
        if winner.trial.choice.micro_batches != meshes[-1].micro_batches:
            return best


def _fewer_meshes(
    cfg: TransformerConfig,
    choice: ScaleChoice,
    hw: HardwareProfile,
    flops: float,
    schedule: str,
    step_s: float,
) -> list[Mesh]:
    """``choice``'s mesh with half and with a quarter of its micro-batches,
    in that order (the order of their bounds), as far as a count is at
    least the stages and splits the batch over the data axis; a count whose
    flops bound does not beat ``step_s`` is left out."""
    c = choice
    out = []
    for k in (c.micro_batches // 2, c.micro_batches // 4):
        if k < c.stages or cfg.batch % k or (cfg.batch // k) % c.data:
            break
        bound = flops_bound_s(flops, hw, c.devices, k, c.stages)
        if bound < step_s:
            spec = PipelineSpec(c.stages, k, schedule)
            out.append(Mesh(bound, c.stages, c.tensor, c.data, k, spec, c.sequence))
    return out


@dataclass(frozen=True)
class _Free:
    """A mesh's first-pass result: its free trial (None without a least
    option) and lower bound, or why it could not be laid out."""

    outcome: _Outcome | None
    bound_s: float
    error: str | None


#: What a source runs: ("free", mesh) lays a mesh out free, ("joint", mesh)
#: runs its joint recomputation program, on a process's stages; ("check",
#: (choice, rules)) prices a layout on its full stage graph.
_Result: TypeAlias = "_Free | _Outcome | _Checked | str"
_Run = Callable[[_Stages, tuple[str, Any]], _Result]


class _Source:
    """Where :func:`_passes` takes each mesh's results from; a mesh is known
    by its index in :attr:`meshes` (the search's, then each one :meth:`add`
    brings)."""

    suffix = ""

    def __init__(self, meshes: Sequence[Mesh]) -> None:
        self.meshes = list(meshes)
        self._index = {m: i for i, m in enumerate(self.meshes)}

    def add(self, mesh: Mesh) -> int:
        """``mesh``'s index, added at the end if it is new."""
        i = self._index.get(mesh)
        if i is None:
            i = self._index[mesh] = len(self.meshes)
            self.meshes.append(mesh)
        return i

    def free(self, i: int) -> _Free:
        got = self._result(("free", i))
        assert isinstance(got, _Free)
        return got

    def joint(self, i: int) -> _Outcome | str:
        got = self._result(("joint", i))
        assert isinstance(got, (_Outcome, str))
        return got

    def _item(self, task: tuple[str, Any]) -> tuple[str, Any]:
        """What runs for ``task``: a mesh's index becomes the mesh."""
        kind, what = task
        return task if kind == "check" else (kind, self.meshes[what])

    def _result(self, task: tuple[str, Any]) -> _Result:
        raise NotImplementedError

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _InProcess(_Source):
    """Each result computed when asked, in this process."""

    def __init__(self, meshes: Sequence[Mesh], run: _Run, stages: _Stages) -> None:
        super().__init__(meshes)
        self._run = run
        self.stages = stages

    def _result(self, task: tuple[str, Any]) -> _Result:
        return self._run(self.stages, self._item(task))


#: A fitting trial's step, its mesh's index, whether it was a free layout,
#: and the trial.
_Fit: TypeAlias = "tuple[float, int, bool, ScaleTrial]"


class _Ahead(_Source):
    """Results computed ahead on forked processes (:class:`Workers`), each
    with its own stages, while the passes wait for the one they need next.

    A worker that comes free gets, in turn: the task the passes wait for;
    the next free layout of a micro-batch size it already holds the graphs
    of, else of one no worker holds, else any; then, once every free layout
    is out, the joint program of the not-fitting mesh of lowest bound, its
    own sizes first among the next few.  A task that cannot beat the best
    fitting step known is left out: a free layout whose flops bound a
    mesh before it already reaches, a joint program whose bound any fitting
    trial reaches.  The passes would skip such a mesh too (the bounds are
    valid and sorted); should they ask for one anyway (two bounds equal to
    the last bit), it is computed then.  With nothing of that left
    (and given ``fewer``), an idle worker lays out free the meshes that
    ``fewer(choice, step)`` gives for the fastest fitting trial so far, which
    the search tries next (:func:`_fewer_rounds`) unless a later result
    beats it; then (``check_ahead``) it prices that trial on its full stage
    graph, the winner's check if no later result beats it (:meth:`checked`)."""

    def __init__(
        self,
        meshes: Sequence[Mesh],
        run: _Run,
        new_stages: Callable[[], _Stages],
        workers: int,
        check_ahead: bool = False,
        incumbent_s: float = math.inf,
        joint_programs: bool = True,
        fewer: Callable[[ScaleChoice, float], list[Mesh]] | None = None,
    ) -> None:
        super().__init__(meshes)
        self._first = len(meshes)  # the first pass's meshes
        self._fewer = fewer
        self._incumbent_s = incumbent_s
        self._joint_programs = joint_programs
        self._pool = Workers(run, new_stages, min(workers, len(meshes)))
        self.suffix = f" (on {self._pool.count} processes)"
        self._check_ahead = check_ahead
        self._done: dict[tuple[str, Any], _Result] = {}
        self._sent: set[tuple[str, Any]] = set()
        #: The :attr:`Mesh.sizes` of the meshes each worker laid out.
        self._laid: dict[int, set[tuple[int, int, int, int, int]]] = {
            w: set() for w in range(self._pool.count)
        }
        #: Each fitting trial's (step, mesh, free layout?, trial).
        self._fits: list[_Fit] = []
        #: The meshes of fewer micro-batches of a first-pass free layout (or
        #: of one of these) that the passes try before the joint programs
        #: (:func:`_refined_first`).
        self._early: set[int] = set()
        #: The fewest micro-batches of each round of them (:func:`_fewer_rounds`
        #: goes on only from these).
        self._fewest: set[int] = set()

    def __exit__(self, *exc: object) -> None:
        self._pool.close()

    def _result(self, task: tuple[str, Any]) -> _Result:
        while task not in self._done:
            self._feed(task)
            for key, got in self._pool.finished():
                self._record(key, got)
            self._drop_beaten(task)
        return self._done[task]

    def _drop_beaten(self, needed: tuple[str, Any]) -> None:
        """Replaces each worker whose job a result since beats (the passes
        will skip it: a free layout that :meth:`_beaten_before` says so of,
        a joint program whose bound a fitting trial reaches), unless the
        passes wait for it: a fresh worker runs what they need sooner."""
        best = self._best_step()
        bounds = dict((i, b) for b, i in self._joint_bounds())
        for w, task in self._pool.running().items():
            assert isinstance(task, tuple)
            kind, i = task
            if task == needed or kind == "check" or i >= self._first:
                continue
            if (kind == "free" and self._beaten_before(i)) or (
                kind == "joint" and bounds[i] >= best
            ):
                self._pool.replace(w)
                self._sent.discard(task)
                self._laid[w] = set()

    def checked(self, choice: ScaleChoice, rules: str) -> _Checked | None:
        """``rules`` of ``choice`` on its full stage graph, if a worker was
        given that or an idle worker laid out ``choice``'s mesh (it holds
        the graphs: a stage of up to 4 layers is its full graph), waiting
        for it to finish; else None."""
        task = ("check", (choice, rules))
        if task not in self._sent:
            mesh = (*choice.mesh_sizes, choice.micro_batches)
            holder = next((w for w in self._pool.idle() if mesh in self._laid[w]), None)
            if holder is None:
                return None
            self._sent.add(task)
            self._pool.submit(holder, task, task)
        while task not in self._done:
            for key, got in self._pool.finished():
                self._record(key, got)
        got = self._done[task]
        return got if isinstance(got, tuple) else None  # a str: it failed

    def _record(self, task: Hashable, got: _Result) -> None:
        assert isinstance(task, tuple)
        self._done[task] = got
        outcome = got.outcome if isinstance(got, _Free) else got
        if isinstance(outcome, _Outcome) and outcome.trial.fits:
            step = outcome.trial.step_time_s
            assert step is not None
            self._fits.append((step, task[1], task[0] == "free", outcome.trial))

    def _feed(self, needed: tuple[str, Any]) -> None:
        for w in self._pool.idle():
            task = needed if needed not in self._sent else self._next(w)
            if task is None:
                break
            self._sent.add(task)
            if task[0] != "check":
                self._laid[w].add(self.meshes[task[1]].sizes)
            self._pool.submit(w, task, self._item(task))
        if not self._pool.busy():  # pragma: no cover - needed is always sent
            raise WorkerError(f"nothing is running and {needed!r} is not done")

    def _next(self, w: int) -> tuple[str, Any] | None:
        meshes = self.meshes
        mine = self._micro_batches(w)
        held = set().union(*map(self._micro_batches, self._laid))
        frees = [
            i
            for i in range(self._first)
            if ("free", i) not in self._sent and not self._beaten_before(i)
        ]
        for pick in ("mine", "unheld", "any"):
            for i in frees:
                size = meshes[i].micro_batches
                if (
                    pick == "any"
                    or (pick == "mine" and size in mine)
                    or (pick == "unheld" and size not in held)
                ):
                    return ("free", i)
        if self._joint_programs:
            fastest = self._fastest([f for f in self._fits if self._is_early(f)])
            if fastest is not None and _refined_first(fastest[3]):
                early = self._fewer_ahead(fastest)
                if early is not None:
                    return early
        best = self._best_step()
        joints = (
            [
                i
                for bound, i in sorted(self._joint_bounds())
                if ("joint", i) not in self._sent and bound < best
            ]
            if self._joint_programs
            else []
        )
        if not joints:
            return self._ahead_of_the_passes()
        near = joints[: self._pool.count]
        own = next((i for i in near if meshes[i].micro_batches in mine), near[0])
        return ("joint", own)

    def _micro_batches(self, w: int) -> set[int]:
        """The micro-batch counts whose graphs worker ``w`` holds."""
        return {sizes[-1] for sizes in self._laid[w]}

    def _best_step(self) -> float:
        """The fastest fitting step known of the passes' meshes and of the
        fewer micro-batches they try before the joint programs (one laid
        out ahead for a trial that may not stay the best may bound a joint
        program the passes then need: it is computed when they ask), or the
        incumbent."""
        steps = [f[0] for f in self._fits if f[1] < self._first or self._is_early(f)]
        return min([*steps, self._incumbent_s])

    def _is_early(self, fit: _Fit) -> bool:
        _, i, free, _ = fit
        return (free and i < self._first) or i in self._early

    def _fastest(self, fits: Sequence[_Fit]) -> _Fit | None:
        """The fastest of ``fits`` that beats the incumbent (fewest stages,
        then sequence size, on a tie), if any."""
        return min(
            (f for f in fits if f[0] < self._incumbent_s),
            key=lambda f: (f[0], f[3].choice.stages, f[3].choice.sequence),
            default=None,
        )

    def _fewer_ahead(self, fastest: _Fit) -> tuple[str, Any] | None:
        """The next free layout not sent of the fewer micro-batches of the
        fitting trial ``fastest``, if the rounds go on from it."""
        if self._fewer is None:
            return None
        if fastest[1] >= self._first and fastest[1] not in self._fewest:
            return None  # its round's fewest did not win: the rounds end
        meshes = [self.add(mesh) for mesh in self._fewer(fastest[3].choice, fastest[0])]
        self._fewest.update(meshes[-1:])
        if self._is_early(fastest) and _refined_first(fastest[3]):
            self._early.update(meshes)  # the passes try them before the joints
        return next(
            (("free", i) for i in meshes if ("free", i) not in self._sent), None
        )

    def _ahead_of_the_passes(self) -> tuple[str, Any] | None:
        """With nothing else to run, for the fastest fitting trial so far,
        which is the search's best unless a result still to come beats it:
        the free layouts of its fewer micro-batches, then the full stage
        graph's price of it."""
        fastest = self._fastest(self._fits)
        if fastest is None:
            return None
        free = self._fewer_ahead(fastest)
        if free is not None or not self._check_ahead:
            return free
        trial = fastest[3]
        check = ("check", (trial.choice, trial.layout_rules))
        return None if check in self._sent else check

    def _beaten_before(self, i: int) -> bool:
        bound = self.meshes[i].bound_s
        return bound >= self._incumbent_s or any(
            step <= bound and t < i and free for step, t, free, _ in self._fits
        )

    def _joint_bounds(self) -> list[tuple[float, int]]:
        """(bound, mesh) of each mesh the second pass may lay out, as far as
        known: laid out free, no error, and no fitting free layout."""
        out = []
        for (kind, i), got in self._done.items():
            if kind != "free" or i >= self._first:  # fewer micro-batches: free only
                continue
            assert isinstance(got, _Free)
            if got.error is not None:
                continue
            if got.outcome is not None and got.outcome.trial.fits:
                continue
            out.append((max(got.bound_s, self.meshes[i].bound_s), i))
        return out


def price_given(
    cfg: TransformerConfig,
    choice: ScaleChoice,
    rules: LayoutRules,
    hw: HardwareProfile,
    builder: Callable[..., ModelGraph],
    optimizer: str,
    flops: float,
    encoder_decoder: bool,
) -> ScalePlan:
    """``choice`` with the stage layout ``rules`` (e.g. a published
    configuration), on its full stage graph, priced as the search prices a
    trial (:func:`_price`; the stage plan's cost is the tables' price of
    ``rules`` and its evaluation ``evaluate``'s)."""
    stages = _Stages(cfg, builder, optimizer, direct=True)
    stage = stages.stage(choice, hw)
    problem = stage.problem
    assert problem is not None
    spec = PipelineSpec(choice.stages, choice.micro_batches, choice.schedule)
    parts, cost = stage.evaluated(rules)
    priced = _price(parts, rules, choice, spec, stages.stage_config(choice, 1), hw)
    table = problem.table_cost(problem.assignment_from_rules(rules))
    solved = _solve(stage, hw.memory_bytes, SolveParams(5.0, 0, 0, 1, presolve=False))
    plan = dataclasses.replace(
        solved,
        layout_rules=rules,
        cost=plan_cost(table, hw.memory_bytes),
        evaluation=cost,
        candidates=(),
    )
    sharded, slots_only = weight_sharding(rules)
    trial = ScaleTrial(
        choice, priced.step_time_s, priced.peak_memory_bytes, priced.fits, str(rules)
    )
    return ScalePlan(
        config=cfg,
        hardware=hw,
        devices=choice.devices,
        choice=choice,
        stage_plan=plan,
        pipeline=priced,
        model_flops=flops,
        trials=(trial,),
        planning_s=0.0,
        sharded_classes=sharded,
        slot_sharded_classes=slots_only,
        optimizer=optimizer,
        encoder_decoder=encoder_decoder,
    )


#: A layout's parts and ``evaluate``'s price on a full stage graph.
_Checked = tuple[_Parts, Cost]


def _full_evaluation(
    stages: _Stages, choice: ScaleChoice, rules: LayoutRules, hw: HardwareProfile
) -> _Checked:
    """``rules`` on ``choice``'s full stage graph (built here)."""
    n = stages.cfg.num_layers // choice.stages
    full = stages.graph(choice, n)
    stage = _Stage(convert_to_shape(choice.stage_mesh), hw, [full], n)
    return stage.evaluated(rules)


def _verified(
    choice: ScaleChoice,
    plan: LayoutPlan,
    priced: PipelineCost,
    hw: HardwareProfile,
    checked: _Checked,
    stage_cfg: TransformerConfig,
) -> tuple[LayoutPlan, PipelineCost]:
    """The chosen layout priced from its full stage graph's evaluation
    ``checked`` (``stage_cfg``: one layer of its stage); raises
    :class:`ScaleVerificationError` unless the representative said the
    same."""
    parts, cost = checked
    exact = _price(
        parts,
        plan.layout_rules,
        choice,
        priced.spec,
        stage_cfg,
        hw,
    )
    same = (
        abs(exact.step_time_s - priced.step_time_s) <= REL_TOL * priced.step_time_s
        and exact.peak_memory_bytes == priced.peak_memory_bytes
        and exact.held_bytes == priced.held_bytes
    )
    if not same:
        raise ScaleVerificationError(
            f"{choice} with rules {plan.layout_rules}: the full stage graph "
            f"gives step {exact.step_time_s!r} s, peak {exact.peak_memory_bytes:,} B; "
            f"its representative gave {priced.step_time_s!r} s, "
            f"{priced.peak_memory_bytes:,} B"
        )
    return dataclasses.replace(plan, evaluation=cost), exact
