"""``auto_layout``: plan the layout of a graph on a mesh.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> x = mtf.zeros(m, "a:10,b:5"); y = mtf.zeros(m, "b:5,c:20")
>>> z = mtf.einsum([x, y], "a:10,c:20")
>>> plan = mtf.auto_layout(g, "m1:4,m2:2", outputs=[z], objective="memory")
>>> str(plan.layout_rules), plan.status.value
('a:m2;c:m1', 'optimal')
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from cost_models.costs import Cost, evaluate
from cost_models.hardware import HardwareProfile
from layout_planner import solver_process
from layout_planner.baselines import baselines, plan_cost
from layout_planner.errors import PlannerError, PlanVerificationError
from layout_planner.explain import explain_dims
from layout_planner.options import DEFAULT_TIME_LIMIT_S, PlanOptions, resolve_options
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
    SolveParams,
    SolveStatus,
    workers_for,
)
from mtf_core.graph import Graph, Tensor
from mtf_core.shapes import Shape, convert_to_shape

# Relative tolerance between the solver's float sums and evaluate()'s: the two
# add the same float terms in a different order.
_REL_TOL = 1e-9


def auto_layout(
    graph: Graph,
    mesh_shape: Any,
    outputs: Sequence[Tensor] = (),
    hardware: str | HardwareProfile | Mapping[str, Any] = "cpu-host",
    objective: str | Objective = "time",
    memory_limit: int | None = None,
    top_k: int = 5,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    num_workers: int | None = None,
    seed: int = 0,
    verify: bool = True,
    max_mesh_dims: int = 2,
    options: PlanOptions | None = None,
) -> LayoutPlan:
    """The best layout rules for ``graph`` on ``mesh_shape``.

    Args:
      graph: the mtf graph (a training step: loss, gradients, updates).
      mesh_shape: ``"x:2;y:4"`` (or a Shape), or an int: a device count, and
        the mesh shape is searched too (up to ``max_mesh_dims`` axes named
        x, y, z, w; see :func:`layout_planner.mesh_search.search_mesh_shape`).
      outputs: tensors exported after the step (they stay alive to the end).
      hardware: a preset name (``cost_models.PRESETS``), profile or dict.
      objective: ``"time"`` (compute + communication under the memory
        capacity) or ``"memory"`` (peak bytes per device, then time).
      memory_limit: per-device bytes; overrides the hardware's capacity.
      top_k: how many distinct layouts to rank (the plan is rank 1).
      time_limit_s: wall-clock budget for the solver (per mesh shape tried).
      num_workers: CP-SAT workers (default: one for a small program, where a
        single search proves the optimum in milliseconds, else this machine's
        cores, at most 8; see ``layout_planner.program.workers_for``).
        The answer does not depend on it when the solve is proven optimal.
      seed: CP-SAT's random seed.
      verify: price the plan again with ``cost_models.evaluate`` and raise
        :class:`PlanVerificationError` if the two disagree.
      options: all of the above as one
        :class:`~layout_planner.options.PlanOptions` (then leave the separate
        keyword arguments at their defaults).

    ``mtf.auto_layout`` is this function with one more keyword, ``server``:
    a planner service's URL to plan on instead (:func:`api.client.auto_layout`;
    the planner itself knows nothing of HTTP).

    Ties between layouts of equal objective go to the lexicographically
    smallest choice vector: dims in name order, each "not split" < first mesh
    axis < second axis ...  So the same request gives the same plan.

    >>> # plan = mtf.auto_layout(graph, "batch:4;model:2", hardware="h100-nvlink-ib")
    >>> # print(plan.layout_rules); print(plan.explain())
    """
    options = resolve_options(
        hardware,
        objective,
        memory_limit,
        top_k,
        time_limit_s,
        num_workers,
        seed,
        verify,
        max_mesh_dims,
        options,
    )
    params = options.solve_params()
    hw = options.hardware_with_limit
    if isinstance(mesh_shape, int) and not isinstance(mesh_shape, bool):
        from layout_planner.mesh_search import search_mesh_shape

        return search_mesh_shape(
            graph,
            mesh_shape,
            outputs=outputs,
            hardware=hw,
            objective=options.objective,
            params=params,
            max_dims=options.max_mesh_dims,
            verify=options.verify,
        )
    mesh = check_mesh_shape(mesh_shape)
    return plan_problem(
        LayoutProblem(check_graph(graph, outputs), mesh, hw, outputs),
        options.objective,
        params,
        verify=options.verify,
    )


# -- argument checks -------------------------------------------------------------------
def check_mesh_shape(mesh_shape: Any) -> Shape:
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
    for t in outputs:
        if not isinstance(t, Tensor) or t.graph is not graph:
            raise PlannerError(
                f"output {t!r} is not a tensor of this graph; expected mtf.Tensors"
            )
    return graph


# -- planning one mesh shape ----------------------------------------------------------------
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
    capacity = problem.hw.memory_bytes
    program = problem.program(objective, capacity)
    if params.num_workers == 0:
        params = replace(params, num_workers=workers_for(program, os.cpu_count() or 1))
    result, where = solver_process.solve(program, params)
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
            SolveParams(params.time_limit_s, params.num_workers, params.seed, 1),
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
    table = problem.table_cost(assignment)
    if table.invalid:  # pragma: no cover - only with no solution at all
        table = problem.table_cost({})
    cost = plan_cost(table, capacity)
    _check_against_solver(problem, result, cost)
    if not cost.fits and reason is None:
        reason = nothing_fits_reason(problem, assignment, cost)
    rules = problem.rules_for(assignment)
    evaluation = None
    if verify:
        evaluation = evaluate(
            problem.graph,
            problem.mesh_shape,
            rules,
            problem.hw,
            problem.outputs,
            memory=problem.memory,
        )
        check_cost(cost, evaluation, f"plan {rules}")
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
        status=status,
        objective_value=objective_value,
        best_bound=bound,
        gap=gap,
        wall_time_s=wall,
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
        solved_in=where,
        top_k_complete=result.top_k_complete,
        verified=evaluation is not None,
        problem=asdict(problem.stats),
        memory_rows_added=result.memory_rows_added,
    )
    plan = LayoutPlan(
        mesh_shape=problem.mesh_shape,
        layout_rules=rules,
        objective=objective,
        status=status,
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
    elapsed = time.perf_counter() - t0 + stats.build_time_s
    return _with_plan_time(plan, elapsed)


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
    problem: LayoutProblem, result: ProgramResult, cost: PlanCost
) -> None:
    """The tables and the integer program must agree on the chosen layout."""
    if not result.solutions:
        return
    best = result.solutions[0]
    # Each dim set's time was rounded to a whole picosecond.
    slack_ps = len(problem.tables) + 1
    if abs(cost.time_s * PS_PER_S - best.time_ps) > slack_ps + _REL_TOL * best.time_ps:
        raise PlanVerificationError(
            f"solver time {best.time_ps} ps != table time {cost.time_s * PS_PER_S:.1f} ps "
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
