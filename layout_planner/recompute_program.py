"""Recomputation chosen inside the integer program.

The scale planner's recomputation options for a stage (keep everything,
recompute the attention scores, recompute whole blocks) are one
:class:`~layout_planner.problem.LayoutProblem` each, on one mesh.
:func:`solve_with_recomputation` solves them as one CP-SAT model
(:mod:`layout_planner.recompute_cpsat`): a selector picks the option, whose
time is minimised under its own memory rows, so one solve returns the
fastest (option, layout) pair that fits, where solving the options one by
one needs a solve each.

    >>> plan = solve_with_recomputation(
    ...     {("none", "none"): keep, ("block", "block"): blocks},
    ...     SolveParams(time_limit_s=5, num_workers=0),
    ... )  # doctest: +SKIP
    >>> plan.key, plan.plan.layout_rules, plan.plan.cost.time_s  # doctest: +SKIP

Where CP-SAT must run in the worker process (``solver_process``), the
options are solved one by one there instead (``jointly=False`` forces it):
the same answer, as the best of each option's own optimum.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from layout_planner import solver_process
from layout_planner.errors import PlannerError
from layout_planner.plan import LayoutPlan, fmt_bytes
from layout_planner.plan_mesh import (
    Solved,
    assemble_plan,
    price_solution,
    solve_problem,
    verify_plan,
)
from layout_planner.problem import LayoutProblem
from layout_planner.program import (
    PS_PER_S,
    SMALL_PROGRAM_VARIABLES,
    ChoiceProgram,
    ChoiceResult,
    IntegerProgram,
    Objective,
    OptionProgram,
    ProgramResult,
    SolveParams,
    SolveStatus,
)

K = TypeVar("K", bound=Hashable)


class NothingFitsError(PlannerError):
    """No option fits under any layout (raised instead of finding each
    option's smallest peak, where the caller asked not to); with
    ``max_time_s``, none that fits takes that long or less."""

    def __init__(self, message: str, max_time_s: float | None = None) -> None:
        super().__init__(message)
        self.max_time_s = max_time_s


@dataclass(frozen=True)
class RecomputePlan(Generic[K]):
    """The chosen option and its layout.

    ``key``: the chosen option (when nothing fits, the one whose layout has
    the smallest peak); ``plan``: its layout on ``problems[key]``, priced
    from that problem's tables (``plan.status``: ``optimal``, ``feasible``,
    ``infeasible`` or ``unknown``; ``plan.reason`` says why there is no
    usable layout); ``jointly``: one joint solve, or each option alone;
    ``excluded``: options the joint model ruled out before searching (a live
    set too big however it is split); ``smallest_peaks``: when nothing fits,
    each option's smallest peak per device (bytes), in option order.
    """

    key: K
    plan: LayoutPlan
    jointly: bool
    excluded: tuple[K, ...] = ()
    smallest_peaks: tuple[tuple[K, int], ...] = ()

    @property
    def status(self) -> SolveStatus:
        return self.plan.status

    @property
    def time_s(self) -> float:
        return self.plan.cost.time_s

    @property
    def wall_s(self) -> float:
        """Solver seconds (all the solves)."""
        return self.plan.solver.wall_time_s


def solve_with_recomputation(
    problems: Mapping[K, LayoutProblem],
    params: SolveParams,
    capacity_bytes: int | Mapping[K, int] | None = None,
    verify: bool = False,
    extras: bool = False,
    jointly: bool | None = None,
    smallest_peak: bool = True,
    max_time_s: float | None = None,
) -> RecomputePlan[K]:
    """The fastest (option, layout) pair of ``problems`` that fits.

    ``problems``: one problem per option, all on one mesh, in order of
    preference (least recomputation first: on equal time the earlier option
    wins).  ``capacity_bytes``: bytes per device, one for all options or
    one per option (default: each problem's ``hw.memory_bytes``).
    ``params``: the time limit is for the whole call; ``num_workers=0``
    chooses from the joint model's size; ``top_k`` is ignored.  ``verify``
    prices the answer again with ``cost_models.evaluate`` (raises
    ``PlanVerificationError`` if it disagrees); ``extras`` adds baselines
    and explanations to the plan.  ``jointly``: one joint CP-SAT model
    (True), each option alone (False), or the joint model when CP-SAT runs
    in this process (None).

    Nothing fits: the plan (status ``infeasible``) is the smallest-peak
    layout of the option with the smallest peak, and its ``reason`` names
    that peak and every option's; with ``smallest_peak=False``,
    :class:`NothingFitsError` is raised instead, and no smallest peak is
    solved for (one memory-objective program per option).

    ``max_time_s`` (with ``smallest_peak=False``; ``inf``: no limit):
    only a pair whose time is at most this is sought, and where none fits,
    :class:`NothingFitsError` says so.  The joint program proves that far
    sooner than its optimum (``recompute_cpsat.solve_choice``); solved
    option by option, the limit is not applied, and the answer may be
    slower.
    """
    keys = list(problems)
    if not keys:
        raise PlannerError("no recomputation options to choose from; expected one")
    mesh = problems[keys[0]].mesh_shape
    for key in keys[1:]:
        if problems[key].mesh_shape != mesh:
            raise PlannerError(
                f"option {key!r} is on mesh {problems[key].mesh_shape}, option "
                f"{keys[0]!r} on {mesh}; the options of one solve share a mesh"
            )
    if max_time_s is not None and smallest_peak:
        raise PlannerError(
            f"max_time_s={max_time_s!r} needs smallest_peak=False: under a time "
            "limit, the smallest peak is not sought"
        )
    caps = _capacities(problems, capacity_bytes)
    chosen = {k: _with_capacity(problems[k], caps[k]) for k in keys}
    if jointly is None:
        jointly = solver_process.solver_location() == "inprocess"
    elif jointly and solver_process.solver_location() != "inprocess":
        raise PlannerError(
            "jointly=True needs CP-SAT in this process, and this process solves "
            "in the worker (solver_process.solver_location()); pass jointly=None"
        )
    if jointly:
        return _joint(chosen, params, verify, extras, smallest_peak, max_time_s)
    return _separate(chosen, params, verify, extras, smallest_peak)


def choice_program(
    problems: Sequence[LayoutProblem], capacities: Sequence[int]
) -> ChoiceProgram:
    """The options' time programs, each under its capacity, as one
    :class:`ChoiceProgram`."""
    options = []
    for problem, cap in zip(problems, capacities, strict=True):
        order = sorted(problem.x_index.items(), key=lambda kv: kv[1])
        options.append(
            OptionProgram(
                problem.program(Objective.TIME, cap), tuple(k for k, _ in order)
            )
        )
    return ChoiceProgram(tuple(options))


# -- the joint solve --------------------------------------------------------------------
def _joint(
    problems: dict[K, LayoutProblem],
    params: SolveParams,
    verify: bool,
    extras: bool,
    smallest_peak: bool = True,
    max_time_s: float | None = None,
) -> RecomputePlan[K]:
    from layout_planner.recompute_cpsat import solve_choice

    t0 = time.perf_counter()
    keys = list(problems)
    choice = choice_program(
        [problems[k] for k in keys], [problems[k].hw.memory_bytes for k in keys]
    )
    params = _workers(params, [o.program for o in choice.options])
    res = solve_choice(choice, params, _time_limit_ps(max_time_s, choice))
    excluded = tuple(keys[i] for i in res.excluded)
    if res.option is not None and res.solution is not None:
        key = keys[res.option]
        problem = problems[key]
        result = _program_result(res)
        solved = Solved(
            result,
            "inprocess",
            params,
            problem.assignment_from_x(res.solution.x),
            res.solution.status,
            res.wall_time_s,
            None,
        )
        plan = _plan(problem, solved, verify, extras, t0)
        return RecomputePlan(key, plan, True, excluded)
    empty = _program_result(res)
    if res.status is SolveStatus.INFEASIBLE:
        if not smallest_peak:
            raise _nothing_fits_error(problems, max_time_s)
        return _nothing_fits(
            problems, params, empty, res.wall_time_s, True, excluded, t0
        )
    # No layout within the time limit.
    key = keys[0]
    reason = (
        f"the solver found no layout within {params.time_limit_s:g} s "
        f"(status {res.status.value}); raise time_limit_s"
    )
    solved = Solved(empty, "inprocess", params, {}, res.status, res.wall_time_s, reason)
    return RecomputePlan(key, _plan(problems[key], solved, False, extras, t0), True)


def _program_result(res: ChoiceResult) -> ProgramResult:
    """The joint result as the chosen option's :class:`ProgramResult` (what
    the plan's pricing checks and its solver statistics read)."""
    return ProgramResult(
        status=res.status,
        solutions=(res.solution,) if res.solution is not None else (),
        wall_time_s=res.wall_time_s,
        num_solves=res.num_solves,
        num_variables=res.num_variables,
        num_constraints=res.num_constraints,
        top_k_complete=True,
        phases=res.phases,
        memory_rows_added=res.memory_rows_added,
    )


def _nothing_fits(
    problems: dict[K, LayoutProblem],
    params: SolveParams,
    result: ProgramResult,
    wall: float,
    jointly: bool,
    excluded: tuple[K, ...],
    t0: float,
) -> RecomputePlan[K]:
    """Each option's smallest-peak layout (the memory objective); the plan
    is the smallest of them."""
    deadline = time.monotonic() + params.time_limit_s - wall
    peaks: list[tuple[K, int, dict[str, int | None]]] = []
    for key, problem in problems.items():
        left = max(deadline - time.monotonic(), 0.05)
        got, _ = solver_process.solve(
            problem.program(Objective.MEMORY, problem.hw.memory_bytes),
            replace(params, time_limit_s=left, top_k=1),
        )
        wall += got.wall_time_s
        asg = problem.assignment_from_x(got.solutions[0].x) if got.solutions else {}
        peaks.append((key, problem.table_cost(asg).peak_bytes, asg))
    key, _, asg = min(peaks, key=lambda p: p[1])  # ties: the earlier option
    where = "inprocess" if jointly else solver_process.solver_location()
    solved = Solved(result, where, params, asg, SolveStatus.INFEASIBLE, wall, None)
    plan = _plan(problems[key], solved, False, False, t0)
    return _none_fits(key, plan, [(k, p) for k, p, _ in peaks], jointly, excluded)


def _time_limit_ps(max_time_s: float | None, choice: ChoiceProgram) -> int | None:
    """``max_time_s`` as a limit on the joint program's time, which adds
    each dim set's time rounded to the picosecond: one picosecond of slack
    per dim set, and a relative ``1e-9`` for the float sums, so that no
    layout of at most ``max_time_s`` is cut (the reference models' program
    times and steps agree within ``1e-11``)."""
    if max_time_s is None or max_time_s == float("inf"):
        return None
    terms = sum(len(o.program.dimsets) for o in choice.options)
    return math.ceil(max_time_s * PS_PER_S * (1 + 1e-9)) + terms + 1


def _nothing_fits_error(
    problems: Mapping[K, LayoutProblem], max_time_s: float | None = None
) -> NothingFitsError:
    caps = {k: p.hw.memory_bytes for k, p in problems.items()}
    if len(set(caps.values())) == 1:
        room = f"in {fmt_bytes(next(iter(caps.values())))} per device"
    else:
        room = "in " + ", ".join(f"{fmt_bytes(c)} ({k})" for k, c in caps.items())
    if max_time_s is not None and max_time_s < float("inf"):
        return NothingFitsError(
            f"no recomputation option fits {room} at a step of "
            f"{max_time_s:.6g} s or less",
            max_time_s,
        )
    return NothingFitsError(f"no recomputation option fits {room} under any layout")


def _none_fits(
    key: K,
    plan: LayoutPlan,
    peaks: Sequence[tuple[K, int]],
    jointly: bool,
    excluded: tuple[K, ...] = (),
) -> RecomputePlan[K]:
    """The answer when no option fits: ``key``'s smallest-peak ``plan``, its
    reason listing every option's smallest peak."""
    listing = ", ".join(f"{k!r} {fmt_bytes(p)}" for k, p in peaks)
    reason = (
        f"no option fits (smallest peak per device: {listing}); option {key!r}: "
        f"{plan.reason}"
    )
    return RecomputePlan(
        key, replace(plan, reason=reason), jointly, excluded, tuple(peaks)
    )


# -- each option alone (the worker process, and the comparison) ----------------------------
def _separate(
    problems: dict[K, LayoutProblem],
    params: SolveParams,
    verify: bool,
    extras: bool,
    smallest_peak: bool = True,
) -> RecomputePlan[K]:
    """Each option's own optimum (``plan_mesh.solve_problem``), the fastest
    kept; optimal only if every option's solve was proven."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + params.time_limit_s
    solves: list[tuple[K, Solved]] = []
    for key, problem in problems.items():
        left = max(deadline - time.monotonic(), 0.05)
        step = replace(params, time_limit_s=left, top_k=1)
        solves.append((key, solve_problem(problem, Objective.TIME, step)))
    wall = sum(s.wall_s for _, s in solves)
    found = [
        (s.result.solutions[0].time_ps, i, key, s)
        for i, (key, s) in enumerate(solves)
        if s.result.solutions
    ]
    proven = all(
        s.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE) for _, s in solves
    )
    if found:
        _, _, key, best = min(found, key=lambda f: (f[0], f[1]))
        status = best.status if proven else SolveStatus.FEASIBLE
        best = replace(best, status=status, wall_s=wall)
        plan = _plan(problems[key], best, verify, extras, t0)
        return RecomputePlan(key, plan, False)
    if all(s.status is SolveStatus.INFEASIBLE for _, s in solves):
        if not smallest_peak:
            raise _nothing_fits_error(problems)
        # solve_problem found each option's smallest-peak layout already.
        peaks = [
            (key, problems[key].table_cost(s.assignment).peak_bytes, i)
            for i, (key, s) in enumerate(solves)
        ]
        key, _, i = min(peaks, key=lambda p: (p[1], p[2]))
        solved = replace(solves[i][1], wall_s=wall)
        plan = _plan(problems[key], solved, False, False, t0)
        return _none_fits(key, plan, [(k, p) for k, p, _ in peaks], False)
    key, unknown = next((k, s) for k, s in solves if not s.result.solutions)
    unknown = replace(unknown, wall_s=wall)
    return RecomputePlan(key, _plan(problems[key], unknown, False, extras, t0), False)


# -- helpers -----------------------------------------------------------------------------
def _capacities(
    problems: Mapping[K, LayoutProblem], capacity: int | Mapping[K, int] | None
) -> dict[K, int]:
    if capacity is None:
        return {k: p.hw.memory_bytes for k, p in problems.items()}
    if isinstance(capacity, Mapping):
        missing = [k for k in problems if k not in capacity]
        extra = [k for k in capacity if k not in problems]
        if missing or extra:
            raise PlannerError(
                f"capacity_bytes has no entry for options {missing} and entries "
                f"for unknown options {extra}; expected one per option of problems"
            )
        caps = {k: capacity[k] for k in problems}
    else:
        caps = {k: capacity for k in problems}
    for k, cap in caps.items():
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise PlannerError(
                f"capacity_bytes {cap!r} for option {k!r}; expected a positive "
                "integer number of bytes per device"
            )
    return caps


def _with_capacity(problem: LayoutProblem, capacity: int) -> LayoutProblem:
    """``problem`` under another capacity: its tables do not depend on it,
    its programs and plans read ``hw.memory_bytes``."""
    if capacity == problem.hw.memory_bytes:
        return problem
    out = copy.copy(problem)
    out.hw = problem.hw.with_memory(capacity)
    return out


def _workers(params: SolveParams, programs: Sequence[IntegerProgram]) -> SolveParams:
    """``num_workers=0``: one worker for a joint model of at most
    :data:`~layout_planner.program.SMALL_PROGRAM_VARIABLES` Boolean variables,
    else the machine's cores (at most 8), as for one program."""
    if params.num_workers:
        return params
    variables = sum(
        p.num_x + sum(len(ds.choices) for ds in p.dimsets) for p in programs
    )
    cores = os.cpu_count() or 1
    workers = 1 if variables <= SMALL_PROGRAM_VARIABLES else max(1, min(cores, 8))
    return replace(params, num_workers=workers)


def _plan(
    problem: LayoutProblem, solved: Solved, verify: bool, extras: bool, t0: float
) -> LayoutPlan:
    cost, reason = price_solution(problem, solved)
    evaluation = None
    if verify and solved.status.has_solution:
        evaluation = verify_plan(problem, problem.rules_for(solved.assignment), cost)
    plan = assemble_plan(
        problem, Objective.TIME, solved, cost, reason, evaluation, extras
    )
    elapsed = time.perf_counter() - t0
    return replace(plan, solver=replace(plan.solver, plan_time_s=elapsed))
