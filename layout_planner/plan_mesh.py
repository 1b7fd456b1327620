"""Planning on one mesh shape: solve, verify, assemble.

:func:`plan_problem` is what :func:`layout_planner.planner.auto_layout` and the
mesh-shape search (:mod:`layout_planner.mesh_search`) call for each mesh
shape; it runs three steps, each its own function:

* :func:`solve_problem`: the integer program through CP-SAT (in process, or
  in the worker; :mod:`layout_planner.solver_process`), and the layout it
  chose (when nothing fits, the layout with the smallest peak instead),
  priced from the tables by :func:`price_solution`;
* :func:`verify_plan`: the same layout priced by ``cost_models.evaluate``,
  which must agree with the planner's tables;
* :func:`assemble_plan`: candidates, baselines, explanations and solver
  statistics, as a :class:`~layout_planner.plan.LayoutPlan`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from cost_models.costs import Cost, evaluate
from layout_planner import solver_process
from layout_planner.baselines import baselines, plan_cost
from layout_planner.errors import PlannerError, PlanVerificationError
from layout_planner.explain import explain_dims
from layout_planner.plan import (
    Candidate,
    LayoutPlan,
    PlanCost,
    SolverStats,
    fmt_bytes,
)
from layout_planner.problem import LayoutProblem
from layout_planner.program import (
    PS_PER_S,
    Objective,
    ProgramResult,
    Solution,
    SolveParams,
    SolveStatus,
    workers_for,
)
from mtf_core.graph import Graph, Tensor
from mtf_core.layout import LayoutRulesLike
from mtf_core.liveness import output_list
from mtf_core.shapes import Shape, convert_to_shape

# Relative tolerance between the solver's float sums and evaluate()'s: the two
# add the same float terms in a different order.
_REL_TOL = 1e-9


# -- argument checks -------------------------------------------------------------------
def check_mesh_shape(mesh_shape: object) -> Shape:
    try:
        mesh = convert_to_shape(mesh_shape)
    except ValueError as e:
        raise PlannerError(
            f"mesh shape {mesh_shape!r} is invalid ({e}); expected e.g. 'x:2;y:4' or "
            "a device count"
        ) from None
    if len(mesh) == 0:
        raise PlannerError(
            f"mesh shape {mesh_shape!r} has no axes; expected e.g. 'x:2;y:4'"
        )
    return mesh


def check_graph(graph: Graph, outputs: Sequence[Tensor]) -> Graph:
    if not isinstance(graph, Graph):
        raise PlannerError(f"graph {graph!r} is not an mtf.Graph")
    if not graph.operations:
        raise PlannerError("the graph has no operations; nothing to plan")
    meshes = sorted({op.mesh.name for op in graph.operations})
    if len(meshes) > 1:
        raise PlannerError(
            f"the graph uses {len(meshes)} meshes ({meshes}); the planner lays out "
            "one mesh at a time"
        )
    output_list(outputs, graph, error=PlannerError)
    return graph


# -- planning one mesh shape ----------------------------------------------------------------
@dataclass(frozen=True)
class Solved:
    """What :func:`solve_problem` found: the solver's result and the layout."""

    result: ProgramResult
    where: str  # "inprocess" | "subprocess"
    params: SolveParams  # as used (workers chosen)
    assignment: dict[str, int | None]  # {free dim: mesh axis index or None}
    status: SolveStatus
    wall_s: float  # solver seconds (with the smallest-peak fallback, if any)
    reason: str | None  # why there is no layout, if there is none


def plan_problem(
    problem: LayoutProblem,
    objective: Objective,
    params: SolveParams,
    verify: bool = True,
    extras: bool = True,
) -> LayoutPlan:
    """Solves ``problem`` and assembles the plan.  Without ``extras`` (the mesh
    search's trials) no baselines or explanations are computed."""
    t0 = time.perf_counter()
    early = _EarlyEvaluation(problem) if verify and params.top_k > 1 else None
    solved = solve_problem(problem, objective, params, early.start if early else None)
    cost, reason = price_solution(problem, solved)
    if (
        objective is Objective.MEMORY
        and solved.status is SolveStatus.OPTIMAL
        and not cost.fits
    ):
        # The smallest peak, proven, does not fit: nothing does, which the
        # time objective calls infeasible too.
        solved = replace(solved, status=SolveStatus.INFEASIBLE)
    rules = problem.rules_for(solved.assignment)
    evaluation = None
    if verify:
        best = solved.result.solutions[0].x if solved.result.solutions else None
        done = early.result(best) if early is not None else None
        evaluation = verify_plan(problem, rules, cost, done)
    plan = assemble_plan(problem, objective, solved, cost, reason, evaluation, extras)
    elapsed = time.perf_counter() - t0 + plan.solver.build_time_s
    return _with_plan_time(plan, elapsed)


def solve_problem(
    problem: LayoutProblem,
    objective: Objective,
    params: SolveParams,
    on_best: Callable[[Solution], None] | None = None,
) -> Solved:
    """Runs CP-SAT on ``problem``'s integer program.  If the time objective
    finds nothing that fits, solves for the smallest peak instead, so the plan
    can say by how much nothing fits.  ``on_best``: see
    :func:`layout_planner.cpsat.solve_program`."""
    capacity = problem.hw.memory_bytes
    program = problem.program(objective, capacity)
    if params.num_workers == 0:
        params = replace(params, num_workers=workers_for(program, os.cpu_count() or 1))
    result, where = solver_process.solve(program, params, on_best)
    reason: str | None = None
    status = result.status
    wall = result.wall_time_s
    if result.solutions:
        assignment = problem.assignment_from_x(result.solutions[0].x)
        status = result.solutions[0].status
    elif status is SolveStatus.INFEASIBLE and objective is Objective.TIME:
        # Nothing fits: find the layout with the smallest peak, to say by how much.
        fallback, _ = solver_process.solve(
            problem.program(Objective.MEMORY, capacity),
            replace(params, top_k=1),
        )
        wall += fallback.wall_time_s
        assignment = (
            problem.assignment_from_x(fallback.solutions[0].x)
            if fallback.solutions
            else {}
        )
    else:
        assignment = {}
        reason = (
            f"the solver found no layout within {params.time_limit_s:g} s "
            f"(status {status.value}); raise time_limit_s"
        )
    return Solved(result, where, params, assignment, status, wall, reason)


def price_solution(
    problem: LayoutProblem, solved: Solved
) -> tuple[PlanCost, str | None]:
    """The chosen layout priced from the tables (checked against the solver's
    own sums), and why it is not a usable plan, if it is not."""
    capacity = problem.hw.memory_bytes
    table = problem.table_cost(solved.assignment)
    if table.invalid:  # pragma: no cover - only with no solution at all
        table = problem.table_cost({})
    cost = plan_cost(table, capacity)
    _check_against_solver(problem, solved.result, cost, problem.weighted_time_s(table))
    reason = solved.reason
    if not cost.fits and reason is None:
        reason = nothing_fits_reason(problem, solved.assignment, cost)
    return cost, reason


def verify_plan(
    problem: LayoutProblem,
    rules: LayoutRulesLike,
    cost: PlanCost,
    evaluation: Cost | None = None,
) -> Cost:
    """``cost_models.evaluate``'s price of ``rules`` (``evaluation``, if it was
    computed already); raises :class:`PlanVerificationError` unless it equals
    the planner's ``cost``."""
    if evaluation is None:
        evaluation = _evaluate(problem, rules)
    check_cost(cost, evaluation, f"plan {rules}")
    return evaluation


def _evaluate(problem: LayoutProblem, rules: LayoutRulesLike) -> Cost:
    return evaluate(
        problem.graph,
        problem.mesh_shape,
        rules,
        problem.hw,
        problem.outputs,
        memory=problem.memory,
    )


class _EarlyEvaluation:
    """``evaluate()`` of the best layout, run in a thread as soon as CP-SAT
    has found it, while CP-SAT (which releases the GIL) ranks the other
    candidates: on two cores, verifying costs little more than the ranking.
    Reads the graph and the memory model only, which nothing else touches
    meanwhile."""

    def __init__(self, problem: LayoutProblem) -> None:
        self.problem = problem
        self.x: tuple[bool, ...] | None = None
        self._thread: threading.Thread | None = None
        self._cost: Cost | None = None
        self._error: BaseException | None = None

    def start(self, best: Solution) -> None:
        self.x = best.x
        rules = self.problem.rules_for(self.problem.assignment_from_x(best.x))

        def run() -> None:
            try:
                self._cost = _evaluate(self.problem, rules)
            except BaseException as e:  # raised again in the planning thread
                self._error = e

        self._thread = threading.Thread(target=run, name="plan-verify", daemon=True)
        self._thread.start()

    def result(self, best: tuple[bool, ...] | None) -> Cost | None:
        """The evaluation of layout ``best``, if that is the one evaluated."""
        if self._thread is None:
            return None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._cost if best is not None and best == self.x else None


def assemble_plan(
    problem: LayoutProblem,
    objective: Objective,
    solved: Solved,
    cost: PlanCost,
    reason: str | None,
    evaluation: Cost | None,
    extras: bool = True,
) -> LayoutPlan:
    """The :class:`LayoutPlan`: the layout, its ranked candidates and, with
    ``extras``, the baselines, per-dim explanations and dimension graph."""
    capacity = problem.hw.memory_bytes
    result, params = solved.result, solved.params
    candidates = tuple(
        Candidate(
            i + 1,
            problem.rules_for(problem.assignment_from_x(s.x)),
            plan_cost(problem.table_cost(problem.assignment_from_x(s.x)), capacity),
        )
        for i, s in enumerate(result.solutions)
    )
    objective_value, bound, gap = _objective_stats(objective, result)
    stats = SolverStats(
        status=solved.status,
        objective_value=objective_value,
        best_bound=bound,
        gap=gap,
        wall_time_s=solved.wall_s,
        plan_time_s=0.0,
        build_time_s=problem.stats.collect_s
        + problem.stats.price_s
        + problem.stats.memory_s,
        num_solves=result.num_solves,
        num_variables=result.num_variables,
        num_constraints=result.num_constraints,
        num_workers=params.num_workers,
        seed=params.seed,
        time_limit_s=params.time_limit_s,
        solved_in=solved.where,
        top_k_complete=result.top_k_complete,
        verified=evaluation is not None,
        problem=asdict(problem.stats),
        memory_rows_added=result.memory_rows_added,
    )
    assignment = solved.assignment
    return LayoutPlan(
        mesh_shape=problem.mesh_shape,
        layout_rules=problem.rules_for(assignment),
        objective=objective,
        status=solved.status,
        cost=cost,
        candidates=candidates,
        baselines=baselines(problem, objective, capacity) if extras else (),
        solver=stats,
        dims=explain_dims(problem, assignment, objective, capacity) if extras else (),
        hardware=problem.hw,
        reason=reason,
        evaluation=evaluation,
        dimension_graph=problem.dim_graph.to_dict(problem.mesh_shape) if extras else {},
    )


def _with_plan_time(plan: LayoutPlan, seconds: float) -> LayoutPlan:
    return replace(plan, solver=replace(plan.solver, plan_time_s=seconds))


def _objective_stats(
    objective: Objective, result: ProgramResult
) -> tuple[float | None, float | None, float | None]:
    if not result.solutions:
        return None, None, None
    best = result.solutions[0]
    scale = 1.0 if objective is Objective.MEMORY else 1.0 / PS_PER_S
    value = best.objective * scale
    bound = best.best_bound * scale
    gap = 0.0 if value == bound else (value - bound) / abs(value) if value else 0.0
    return value, bound, max(gap, 0.0)


def _check_against_solver(
    problem: LayoutProblem, result: ProgramResult, cost: PlanCost, weighted_s: float
) -> None:
    """The tables and the integer program must agree on the chosen layout
    (``weighted_s``: its table time as the objective weighs it)."""
    if not result.solutions:
        return
    best = result.solutions[0]
    # Each dim set's time was rounded to a whole picosecond.
    slack_ps = len(problem.tables) + 1
    if abs(weighted_s * PS_PER_S - best.time_ps) > slack_ps + _REL_TOL * best.time_ps:
        raise PlanVerificationError(
            f"solver time {best.time_ps} ps != table time {weighted_s * PS_PER_S:.1f} ps "
            f"for {problem.rules_for(problem.assignment_from_x(best.x))}"
        )
    if best.peak_bytes is not None and best.peak_bytes != cost.peak_memory_bytes:
        raise PlanVerificationError(
            f"solver peak {best.peak_bytes} B != table peak {cost.peak_memory_bytes} B"
        )


def check_cost(cost: PlanCost, evaluation: Cost, what: str) -> None:
    """Raises PlanVerificationError unless the planner's price of a layout
    equals ``cost_models.evaluate``'s."""
    problems = []
    if not _close(cost.compute_s, evaluation.compute_s):
        problems.append(f"compute {cost.compute_s!r} s vs {evaluation.compute_s!r} s")
    mine = dict(cost.comm_s_by_axis)
    theirs = dict(evaluation.comm_s_by_axis)
    for axis in sorted(set(mine) | set(theirs)):
        if not _close(mine.get(axis, 0.0), theirs.get(axis, 0.0)):
            problems.append(
                f"communication over {axis!r} {mine.get(axis, 0.0)!r} s vs "
                f"{theirs.get(axis, 0.0)!r} s"
            )
    if cost.peak_memory_bytes != evaluation.peak_memory_bytes:
        problems.append(
            f"peak memory {cost.peak_memory_bytes} B vs {evaluation.peak_memory_bytes} B"
        )
    if problems:
        raise PlanVerificationError(
            f"the planner and cost_models.evaluate disagree on {what}: "
            + "; ".join(problems)
        )


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _REL_TOL * max(abs(a), abs(b)) + 1e-18


def nothing_fits_reason(
    problem: LayoutProblem, assignment: dict[str, int | None], cost: PlanCost
) -> str:
    over = cost.peak_memory_bytes - cost.memory_capacity_bytes
    biggest = problem.largest_tensors(assignment)
    listing = "; ".join(
        f"{name} [{shape}] {kind} {fmt_bytes(b)}" for name, shape, kind, b in biggest
    )
    rules = problem.rules_for(assignment)
    return (
        f"nothing fits in {fmt_bytes(cost.memory_capacity_bytes)} per device: the "
        f"layout with the smallest peak ({rules or 'nothing split'}) needs "
        f"{fmt_bytes(cost.peak_memory_bytes)} per device, {fmt_bytes(over)} "
        f"({over:,} B) over; its largest live tensors: {listing}"
    )
