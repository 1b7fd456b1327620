"""The scale planner's search on representative stage graphs.

:func:`layout_planner.choices.plan_transformer` tries meshes ``pp x dp x tp``
and recomputation options; each trial lays out a stage of ``n = L / pp``
identical layers.  Its exhaustive form builds, analyses, solves and
evaluates the ``n``-layer graph in every trial.  This search prices the
same trials from graphs of 2, 3 and 4 layers (:mod:`layout_planner.stacked`,
through the stages of :mod:`layout_planner.scale_stages`):

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
trials.  The passes take each mesh's results from a source
(:mod:`layout_planner.scale_sources`): this process, or forked workers that
compute them ahead.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cost_models.hardware import HardwareProfile
from cost_models.pipeline import (
    PipelineCost,
    PipelineSpec,
)
from layout_planner.baselines import plan_cost
from layout_planner.errors import PlannerError, SolverError
from layout_planner.plan import LayoutPlan
from layout_planner.program import SolveParams
from layout_planner.recompute_program import NothingFitsError, solve_with_recomputation
from layout_planner.scale_bounds import copy_rates, flops_bound_s, recompute_bound_s
from layout_planner.scale_plan import (
    ScaleChoice,
    ScaleError,
    ScalePlan,
    ScaleTrial,
    weight_sharding,
)
from layout_planner.scale_sources import (
    Ahead,
    FreeResult,
    InProcess,
    Mesh,
    Result,
    Slower,
    Source,
    refined_first,
)
from layout_planner.scale_stages import (
    Checked,
    Outcome,
    Stage,
    Stages,
    price_step,
    solve_stage,
)
from layout_planner.scale_workers import (
    UnsafeFork,
    fork_is_safe,
    fresh_helpers_possible,
    watched_fork_possible,
)
from mtf_core.layout import LayoutRules, convert_to_layout_rules
from mtf_core.models import TransformerConfig
from mtf_core.models.base import ModelGraph
from mtf_core.shapes import convert_to_shape

#: Relative tolerance between the representative's step time and the full
#: stage graph's (the same float terms, summed in another order).
REL_TOL = 1e-9


_log = logging.getLogger(__name__)


def process_kind(many: bool) -> str:
    """How a search runs in this process (:func:`search`'s ``attempt``;
    ``many``: more than one worker and mesh): on forked workers watched for
    a stall where their CPU time can be read (beside a running TensorFlow
    too), else on forked workers where a fork is safe unwatched, else on
    fresh helpers, else in one process (and with one worker)."""
    if not many:
        return "one"
    if watched_fork_possible():
        return "watched"
    if fork_is_safe():
        return "forked"
    return "fresh" if fresh_helpers_possible() else "one"


class NothingFaster(ScaleError):
    """A search given an incumbent step found none faster; ``trials`` are
    the trials it ran."""

    def __init__(self, message: str, trials: tuple[ScaleTrial, ...]) -> None:
        super().__init__(message)
        self.trials = trials


class ScaleVerificationError(PlannerError):
    """The full stage graph prices the chosen layout differently from its
    representative (a bug: the layers did not stack as assumed)."""


#: Bytes per device for the solve that ignores the capacity (CP-SAT's sums
#: must stay within 64 bits).
_UNLIMITED = 2**50

#: How much each recomputation option recomputes, per block class.
_LEVEL = {"none": 0, "scores": 1, "block": 2}


def _solve_options(
    stages: Stages,
    options: Sequence[ScaleChoice],
    hw: HardwareProfile,
    params: SolveParams,
    limits: Mapping[ScaleChoice, int],
    smallest_peak: bool = True,
    max_step_s: float | None = None,
    jointly: bool = False,
) -> tuple[ScaleChoice, LayoutPlan]:
    """The fastest (option, layout) of ``options`` (one mesh), each option
    under its ``limits`` bytes per device: one CP-SAT solve, the option a
    decision of the program
    (:func:`~layout_planner.recompute_program.solve_with_recomputation`;
    ``smallest_peak=False``: where no option fits, it raises
    ``NothingFitsError`` instead of finding the smallest peak; with
    ``max_step_s`` too, it raises that where none fits within that step,
    which the program proves far sooner than its optimum).  ``jointly``:
    through that program even for one option."""
    if len(options) == 1 and not jointly:
        c = options[0]
        # The last layout this process found (most often of a mesh with
        # the same axes) takes CP-SAT near this one's: GPT-3's free layouts
        # solve in half the time (docs/scale.md, "Planning time").
        plan = solve_stage(stages.stage(c, hw), limits[c], params, stages.last_layout)
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
        max_time_s=max_step_s,
    )
    return got.key, got.plan


def _trial(
    stages: Stages,
    options: Sequence[ScaleChoice],
    spec: PipelineSpec,
    hw: HardwareProfile,
    params: SolveParams,
    limit: int | None = None,
    smallest_peak: bool = True,
    max_step_s: float | None = None,
    jointly: bool = False,
) -> Outcome:
    """The fastest fitting (option, layout) of ``options`` on their mesh,
    each under ``limit`` bytes per device (the hardware's capacity if None;
    ``smallest_peak``, ``max_step_s`` and ``jointly``: see
    :func:`_solve_options`).

    The program's objective is the pipelined step (``m + p - 1`` times the
    per-micro-batch part, plus the once-per-step part), so it weighs a
    stored weight's gather in every micro-batch against a slots-only
    weight's once per step itself; its memory rows hold what the ``k - 1``
    other micro-batches in flight keep (``LayoutProblem.also_held``), so its
    answer fits exactly when some layout of the options does."""
    first = hw.memory_bytes if limit is None else limit
    choice, plan = _solve_options(
        stages,
        options,
        hw,
        params,
        {c: first for c in options},
        smallest_peak,
        max_step_s,
        jointly,
    )
    stage = stages.stage(choice, hw)
    parts = stage.parts(plan.layout_rules)
    priced = price_step(
        parts, plan.layout_rules, choice, spec, stages.stage_config(choice, 1), hw
    )
    trial = ScaleTrial(
        choice,
        priced.step_time_s,
        priced.peak_memory_bytes,
        priced.fits,
        str(plan.layout_rules),
    )
    return Outcome(trial, plan, priced)


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
    stages: Stages,
    options: Sequence[ScaleChoice],
    spec: PipelineSpec,
    hw: HardwareProfile,
    params: SolveParams,
) -> tuple[Outcome | None, float]:
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

    ``workers > 1`` lays meshes out ahead on that many processes
    (:class:`Ahead`, :func:`process_kind`); the passes take their results in
    the order above, so the trials and the plan are the same for any number
    and kind of workers.  Should a forked worker stall or die
    (:class:`~layout_planner.scale_workers.UnsafeFork`), the passes run
    again on helpers started as fresh interpreters.
    """
    start = time.perf_counter()
    jobs = SearchJobs(
        cfg,
        hw,
        builder,
        optimizer,
        schedule,
        tuple((a, f) for a, f in recompute),
        SolveParams(time_limit_s, 0, 0, 1, presolve=False),
        flops,
        devices,
        exhaustive,
        encoder_decoder,
    )
    new_stages, mesh_options, fewer = jobs.new_stages, jobs.mesh_options, jobs.fewer

    def attempt(
        how: str,
    ) -> tuple[list[ScaleTrial], Outcome | None, Checked | None, Stages | None]:
        """The passes (and the winner's check, where a worker ran it ahead)
        with results from processes of kind ``how``: "watched" (forked,
        watched for a stall), "forked", "fresh" (helpers started as fresh
        interpreters, this process working too) or "one"."""
        source: Source
        if how == "one":
            source = InProcess(meshes, jobs.run, new_stages())
        else:
            source = Ahead(
                meshes,
                jobs.run,
                new_stages,
                workers - 1 if how == "fresh" else workers,
                check_ahead=verify,
                incumbent_s=incumbent_s,
                joint_programs=joint_programs,
                fewer=fewer if fewer_micro_batches else None,
                local=new_stages() if how == "fresh" else None,
                watch=how == "watched",
            )
        checked: Checked | None = None
        with source:
            refine = None
            if fewer_micro_batches:

                def refine(
                    best: Outcome, trials: list[ScaleTrial], done: float
                ) -> Outcome:
                    return _fewer_rounds(
                        best, fewer, mesh_options, source, trials, progress, done
                    )

            trials, best = _passes(
                meshes,
                mesh_options,
                source,
                progress,
                incumbent_s,
                joint_programs,
                refine,
            )
            if verify and best is not None:
                if progress is not None:
                    progress(
                        f"checking {best.trial.choice} on its full stage graph", 1.0
                    )
                if isinstance(source, Ahead):
                    # A worker left idle near the end priced the fastest
                    # fitting trial on its full stage graph, if it is the
                    # winner.
                    checked = source.checked(best.trial.choice, best.trial.layout_rules)
        return trials, best, checked, source.stages

    how = process_kind(workers > 1 and len(meshes) > 1)
    try:
        trials, best, checked, stages = attempt(how)
    except UnsafeFork as e:
        # Nothing of the stalled attempt is kept: the same passes again,
        # on helpers that share no state (or lock) with this process.
        _log.warning("%s; searching again with helpers started afresh", e)
        if progress is not None:
            progress(
                "a forked worker stalled or died: searching again with fresh helpers",
                0.0,
            )
        trials, best, checked, stages = attempt(
            "fresh" if fresh_helpers_possible() else "one"
        )
    if best is None and incumbent_s < math.inf:
        raise NothingFaster(
            f"no trial beats the step of {incumbent_s:.6g} s ({len(trials)} trials)",
            tuple(trials),
        )
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
        on = stages if stages is not None else new_stages()
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


@dataclasses.dataclass(frozen=True)
class SearchJobs:
    """What the search's processes run: lay out a mesh free, run its joint
    program, check a layout on its full stage graph.  Plain data and
    module-level functions, so that a helper started as a fresh interpreter
    can be sent it (:mod:`layout_planner.scale_workers`)."""

    cfg: TransformerConfig
    hw: HardwareProfile
    builder: Callable[..., ModelGraph]
    optimizer: str
    schedule: str
    recompute: tuple[tuple[str, str], ...]
    params: SolveParams
    flops: float
    devices: int
    exhaustive: bool = False
    encoder_decoder: bool = False

    def new_stages(self) -> Stages:
        return Stages(self.cfg, self.builder, self.optimizer, direct=self.exhaustive)

    def mesh_options(self, mesh: Mesh) -> list[ScaleChoice]:
        pp, tp, dp, m = mesh.stages, mesh.tensor, mesh.data, mesh.micro_batches
        sp = mesh.sequence
        return [
            ScaleChoice(pp, dp, tp, m, self.schedule, a, f, sp)
            for a, f in self.recompute
        ]

    def run(self, stages: Stages, task: tuple[str, Any]) -> Result:
        kind, what = task
        if kind == "check":
            return self._check(stages, what)
        if kind == "free":
            return self._lay_out(stages, what)
        return self._joint(stages, what)

    def fewer(self, choice: ScaleChoice, step_s: float) -> list[Mesh]:
        return _fewer_meshes(
            self.cfg, choice, self.hw, self.flops, self.schedule, step_s
        )

    def _lay_out(self, stages: Stages, mesh: Mesh) -> FreeResult:
        try:
            free, bound = _free_trial(
                stages, self.mesh_options(mesh), mesh.spec, self.hw, self.params
            )
        except (PlannerError, SolverError) as e:
            return FreeResult(None, 0.0, str(e))
        return FreeResult(free, bound, None)

    def _joint(
        self, stages: Stages, task: tuple[Mesh, float, float]
    ) -> Outcome | Slower | str:
        mesh, cutoff_s, bound_s = task
        every = self.mesh_options(mesh)
        # An option whose least step (the free bound and what its
        # recomputation adds) exceeds the limit is not even built (without a
        # limit none does, and the copies' graphs are not made for it).
        options = (
            every
            if math.isinf(cutoff_s)
            else [
                c
                for c in every
                if not _beyond(bound_s + self._extra(mesh, c), cutoff_s)
            ]
        )
        if not options:  # run ahead under a limit below the mesh's bound
            return Slower(cutoff_s, f"no option's bound is {cutoff_s:.6g} s or less")
        try:
            # Where nothing fits, the trial says so; the smallest peak (a
            # memory-objective program per option) is not worth its time.
            return _trial(
                stages,
                options,
                mesh.spec,
                self.hw,
                self.params,
                smallest_peak=False,
                max_step_s=cutoff_s,
                jointly=len(every) > 1,
            )
        except NothingFitsError as e:
            limit = math.inf if e.max_time_s is None else e.max_time_s
            return Slower(limit, str(e))
        except (PlannerError, SolverError) as e:
            return str(e)

    @functools.cached_property
    def _copy_rates(self) -> dict[tuple[str, str], float]:
        """Each option's recomputed copy per sequence and layer
        (:func:`~layout_planner.scale_bounds.copy_rates`), made in each
        process the first time a joint program asks."""
        one = [ScaleChoice(1, 1, 1, 1, self.schedule, a, f) for a, f in self.recompute]
        nested = _least(one)
        if nested is None:
            return {}
        least = (nested.recompute_attention, nested.recompute_ffn)
        return copy_rates(
            self.cfg,
            self.builder,
            self.optimizer,
            least,
            self.recompute,
            self.hw,
            self.encoder_decoder,
        )

    def _extra(self, mesh: Mesh, c: ScaleChoice) -> float:
        rate = self._copy_rates.get((c.recompute_attention, c.recompute_ffn), 0.0)
        return recompute_bound_s(
            rate, self.cfg, mesh.stages, mesh.micro_batches, self.devices // mesh.stages
        )

    def _check(self, stages: Stages, task: tuple[ScaleChoice, str]) -> Checked | str:
        choice, rules = task
        try:
            return _full_evaluation(
                stages, choice, convert_to_layout_rules(rules), self.hw
            )
        except Exception as e:  # a guess's failure is the parent's to find again
            return f"{type(e).__name__}: {e}"


def _passes(
    meshes: Sequence[Mesh],
    mesh_options: Callable[[Mesh], list[ScaleChoice]],
    source: Source,
    progress: Callable[[str, float], None] | None,
    incumbent_s: float = math.inf,
    joint_programs: bool = True,
    refine: Callable[[Outcome, list[ScaleTrial], float], Outcome] | None = None,
) -> tuple[list[ScaleTrial], Outcome | None]:
    """The two passes of :func:`search`, taking each mesh's results from
    ``source``: the trials, in order, and the fastest fitting outcome faster
    than ``incumbent_s`` (a step found elsewhere).  A mesh is skipped when
    its bound is no better than the best step found or the incumbent;
    without ``joint_programs``, the second pass is not run.

    ``refine(best, trials, done)`` (the fewer-micro-batch rounds, which add
    their trials to ``trials`` and report progress at the fraction ``done``)
    runs on the first pass's best before the second pass where
    :func:`refined_first` says so (a faster step prunes more of the second
    pass), and on the best after the second pass unless it refined that
    one already."""
    trials: list[ScaleTrial] = []
    best: tuple[tuple[float, int, int, int], Outcome] | None = None
    # The recomputation options, in one order on every mesh (a tie's rank).
    order = []
    if meshes:
        order = [
            (o.recompute_attention, o.recompute_ffn) for o in mesh_options(meshes[0])
        ]

    def beaten(bound: float) -> bool:
        return bound >= (incumbent_s if best is None else best[0][0])

    def consider(outcome: Outcome) -> None:
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
    if refine is not None and best is not None and refined_first(best[1].trial):
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
        # Only a step at most the best so far can count: the program is
        # asked for nothing slower, which it rules out far sooner than it
        # proves its optimum.  Whatever limit a result was found under (at
        # least this one), the trial says the same (joint_trial).
        limit = incumbent_s if best is None else best[0][0]
        outcome = source.joint(index[i], limit, bound)
        trial = joint_trial(options[0], outcome, limit)
        trials.append(trial)
        if isinstance(outcome, Outcome) and trial is outcome.trial:
            consider(outcome)
    if refine is not None and best is not None and best[1] is not refined:
        consider(refine(best[1], trials, 1.0))
    return trials, None if best is None else best[1]


def _beyond(bound_s: float, limit_s: float) -> bool:
    """Whether a step of at least ``bound_s`` is surely slower than
    ``limit_s`` (beyond the float and picosecond rounding of either)."""
    return bound_s > limit_s * (1 + 1e-9) + 1e-9


def joint_trial(
    least: ScaleChoice, got: Outcome | Slower | str, limit_s: float
) -> ScaleTrial:
    """The trial of a joint program whose result ``got`` was found under a
    step limit of at least ``limit_s`` (the best fitting step before it):
    its own trial where it takes at most ``limit_s``, else one saying that
    no (option, layout) that fits does.  That is the same for any limit the
    result was found under, so the trials do not depend on what a process
    computing ahead knew."""
    if isinstance(got, str):
        return ScaleTrial(least, None, None, False, "", got)
    if isinstance(got, Outcome):
        step = got.trial.step_time_s
        if step is not None and step <= limit_s:
            return got.trial
    elif got.limit_s < limit_s:
        raise PlannerError(  # pragma: no cover - the sources ask again
            f"a joint program limited to {got.limit_s:.6g} s cannot say what "
            f"beats {limit_s:.6g} s"
        )
    elif limit_s == math.inf:
        return ScaleTrial(least, None, None, False, "", got.message)
    return ScaleTrial(
        least,
        None,
        None,
        False,
        "",
        f"no recomputation option fits at a step of {limit_s:.6g} s or less "
        "(the step to beat: the fastest fitting one before it, or the one given)",
    )


def _fewer_rounds(
    best: Outcome,
    fewer: Callable[[ScaleChoice, float], list[Mesh]],
    mesh_options: Callable[[Mesh], list[ScaleChoice]],
    source: Source,
    trials: list[ScaleTrial],
    progress: Callable[[str, float], None] | None,
    done: float = 1.0,
) -> Outcome:
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
    trial (:func:`price_step`; the stage plan's cost is the tables' price of
    ``rules`` and its evaluation ``evaluate``'s)."""
    stages = Stages(cfg, builder, optimizer, direct=True)
    stage = stages.stage(choice, hw)
    problem = stage.problem
    assert problem is not None
    spec = PipelineSpec(choice.stages, choice.micro_batches, choice.schedule)
    parts, cost = stage.evaluated(rules)
    priced = price_step(parts, rules, choice, spec, stages.stage_config(choice, 1), hw)
    table = problem.table_cost(problem.assignment_from_rules(rules))
    solved = solve_stage(
        stage, hw.memory_bytes, SolveParams(5.0, 0, 0, 1, presolve=False)
    )
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


def _full_evaluation(
    stages: Stages, choice: ScaleChoice, rules: LayoutRules, hw: HardwareProfile
) -> Checked:
    """``rules`` on ``choice``'s full stage graph (built here)."""
    n = stages.cfg.num_layers // choice.stages
    full = stages.graph(choice, n)
    stage = Stage(convert_to_shape(choice.stage_mesh), hw, [full], n)
    return stage.evaluated(rules)


def _verified(
    choice: ScaleChoice,
    plan: LayoutPlan,
    priced: PipelineCost,
    hw: HardwareProfile,
    checked: Checked,
    stage_cfg: TransformerConfig,
) -> tuple[LayoutPlan, PipelineCost]:
    """The chosen layout priced from its full stage graph's evaluation
    ``checked`` (``stage_cfg``: one layer of its stage); raises
    :class:`ScaleVerificationError` unless the representative said the
    same."""
    parts, cost = checked
    exact = price_step(
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
