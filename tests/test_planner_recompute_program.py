"""Recomputation chosen inside the integer program, checked exhaustively.

On a 2-layer language model (every recomputation option a graph of its own)
every layout of every option is enumerated and priced from the tables (which
``cost_models.evaluate`` prices the same: checked here on a sample, for each
option), and at every memory capacity where the best (option, layout) pair
changes, and one byte below it, the joint solve
(``recompute_program.solve_with_recomputation``) must return that pair's
option and time, verified by ``evaluate``; and the same option and rules as
solving each option alone and keeping the fastest.
"""

from __future__ import annotations

import copy
import functools
import itertools
import random
from collections.abc import Mapping

import pytest
from test_cost_graphs import BUILDERS

import mtf_core as mtf
from cost_models.costs import evaluate
from cost_models.profiles import get_hardware
from layout_planner.errors import PlannerError
from layout_planner.plan import LayoutPlan, fmt_bytes
from layout_planner.plan_mesh import plan_problem
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams, SolveStatus
from layout_planner.recompute_program import (
    NothingFitsError,
    solve_with_recomputation,
)
from mtf_core.models import TransformerConfig, build_lm

pytestmark = pytest.mark.solver

HW = get_hardware("h100-nvlink-ib")
# Six free names: batch, d_ff, d_kv, d_model, heads, vocab (length is odd,
# so it and memory_length stay whole).
CFG = TransformerConfig(
    num_layers=2, d_model=8, heads=2, d_kv=4, d_ff=16, vocab=8, length=9, batch=4
)
OPTIONS = (("none", "none"), ("scores", "none"), ("block", "block"))
MESHES = ["dp:2;tp:2", "x:2;y:2;z:2"]
PARAMS = SolveParams(time_limit_s=60, num_workers=1, seed=0)

Key = tuple[str, str]
# (option rank, option, assignment, time, peak)
Pair = tuple[int, Key, dict[str, int | None], float, int]


@functools.cache
def lm_problems(mesh: str) -> dict[Key, LayoutProblem]:
    out = {}
    for attn, ffn in OPTIONS:
        model = build_lm(
            CFG.replace(recompute_attention=attn, recompute_ffn=ffn), optimizer="adam"
        )
        out[(attn, ffn)] = LayoutProblem(
            model.graph, mtf.convert_to_shape(mesh), HW, [model.loss]
        )
    return out


def every_pair(problems: Mapping[Key, LayoutProblem]) -> list[Pair]:
    """Every (option, layout) the tables accept, priced from the tables."""
    out = []
    for rank, (key, problem) in enumerate(problems.items()):
        dims = problem.free_dims
        for axes in itertools.product(*([None, *problem.allowed[d]] for d in dims)):
            asg = dict(zip(dims, axes))
            cost = problem.table_cost(asg)
            if cost.invalid is None:
                out.append((rank, key, asg, cost.time_s, cost.peak_bytes))
    return out


def best_fitting(pairs: list[Pair], capacity: int) -> Pair | None:
    """The fastest pair within ``capacity``; ties to the earlier option."""
    fit = [p for p in pairs if p[4] <= capacity]
    return min(fit, key=lambda p: (p[3], p[0])) if fit else None


def regime_starts(pairs: list[Pair]) -> list[int]:
    """Each capacity at which the best fitting pair changes (the peak of the
    pair that becomes the best there)."""
    starts, best = [], None
    for p in sorted(pairs, key=lambda p: (p[4], p[3], p[0])):
        if best is None or (p[3], p[0]) < (best[3], best[0]):
            best = p
            starts.append(p[4])
    return sorted(set(starts))


@pytest.mark.parametrize("mesh", MESHES)
def test_each_option_tables_price_like_evaluate(mesh: str) -> None:
    problems = lm_problems(mesh)
    pairs = every_pair(problems)
    assert {p[1] for p in pairs} == set(OPTIONS)
    for _, key, asg, time_s, peak in random.Random(0).sample(pairs, 30):
        problem = problems[key]
        cost = evaluate(
            problem.graph,
            problem.mesh_shape,
            problem.rules_for(asg),
            HW,
            problem.outputs,
            memory=problem.memory,
        )
        assert time_s == pytest.approx(cost.time_s, rel=1e-9), (key, asg)
        assert peak == cost.peak_memory_bytes, (key, asg)


@pytest.mark.parametrize("mesh", MESHES)
def test_joint_solve_is_the_best_option_and_layout_at_every_capacity(
    mesh: str,
) -> None:
    problems = lm_problems(mesh)
    pairs = every_pair(problems)
    starts = regime_starts(pairs)
    capacities = [HW.memory_bytes, *starts, *(s - 1 for s in starts)]
    winners = set()
    for capacity in capacities:
        want = best_fitting(pairs, capacity)
        got = solve_with_recomputation(problems, PARAMS, capacity, verify=True)
        assert got.jointly
        if want is None:
            assert got.status is SolveStatus.INFEASIBLE, capacity
            continue
        winners.add(want[1])
        assert got.status is SolveStatus.OPTIMAL, capacity
        assert got.key == want[1], (capacity, got.key, want)
        assert got.time_s == pytest.approx(want[3], rel=1e-9), capacity
        # The chosen option's rules priced by evaluate: its time, its peak
        # (within the capacity), as the plan says.
        problem = problems[got.key]
        cost = evaluate(
            problem.graph,
            problem.mesh_shape,
            got.plan.layout_rules,
            HW,
            problem.outputs,
        )
        assert got.plan.evaluation is not None
        assert cost.time_s == pytest.approx(got.time_s, rel=1e-9)
        assert cost.peak_memory_bytes == got.plan.cost.peak_memory_bytes <= capacity
    # No limit: keep everything (recomputation only adds work); and there
    # are capacities where recomputing the scores, and whole blocks, is best.
    free = solve_with_recomputation(problems, PARAMS)
    assert free.key == ("none", "none") and free.plan.cost.fits
    assert winners == set(OPTIONS)


@pytest.mark.parametrize("mesh", MESHES)
def test_joint_solve_equals_the_best_of_solving_each_option_alone(mesh: str) -> None:
    problems = lm_problems(mesh)
    starts = regime_starts(every_pair(problems))
    for capacity in [HW.memory_bytes, *starts[::2], *(s - 1 for s in starts[1::2])]:
        joint = solve_with_recomputation(problems, PARAMS, capacity)
        alone = solve_with_recomputation(problems, PARAMS, capacity, jointly=False)
        assert not alone.jointly
        if alone.status is not SolveStatus.OPTIMAL:
            assert alone.status is SolveStatus.INFEASIBLE
            assert joint.status is SolveStatus.INFEASIBLE
            continue
        assert joint.key == alone.key, capacity
        assert joint.plan.layout_rules == alone.plan.layout_rules, capacity
        assert joint.time_s == alone.time_s, capacity


def test_first_fitting_option_is_slower_than_the_joint_choice_somewhere() -> None:
    """Today's search (least recomputation first, keep the first that fits)
    misses the optimum where keeping everything fits only with a slow layout."""
    problems = lm_problems("x:2;y:2;z:2")
    pairs = every_pair(problems)
    slower = []
    for capacity in regime_starts(pairs):
        joint = solve_with_recomputation(problems, PARAMS, capacity)
        for key in OPTIONS:
            first = _plan_alone(problems[key], capacity)
            if first.cost.fits:
                break
        if first.cost.time_s > joint.time_s * (1 + 1e-9):
            slower.append((capacity, key, joint.key))
    assert slower, "the first fitting option was the fastest at every capacity"


def _plan_alone(problem: LayoutProblem, capacity: int) -> LayoutPlan:
    """``problem`` alone under ``capacity`` (what the scale search does)."""
    limited = copy.copy(problem)
    limited.hw = problem.hw.with_memory(capacity)
    return plan_problem(limited, Objective.TIME, PARAMS, verify=False, extras=False)


def test_nothing_fits_names_every_options_smallest_peak() -> None:
    problems = lm_problems("dp:2;tp:2")
    pairs = every_pair(problems)
    smallest = {key: min(p[4] for p in pairs if p[1] == key) for key in OPTIONS}
    capacity = min(smallest.values()) - 1
    for jointly in (True, False):
        got = solve_with_recomputation(problems, PARAMS, capacity, jointly=jointly)
        assert got.status is SolveStatus.INFEASIBLE
        assert dict(got.smallest_peaks) == smallest
        assert got.key == min(smallest, key=smallest.__getitem__)
        assert got.plan.cost.peak_memory_bytes == min(smallest.values())
        assert not got.plan.cost.fits
        assert got.plan.reason is not None
        assert got.plan.reason.startswith("no option fits")
        for key, peak in smallest.items():
            assert f"{key!r} {fmt_bytes(peak)}" in got.plan.reason
    # The joint model rules every option out before searching (each has a
    # live set that cannot fit however it is split) only when that bound
    # says so; here the three options' bounds are all above the capacity.
    joint = solve_with_recomputation(problems, PARAMS, 1000)
    assert joint.excluded == OPTIONS


def test_each_option_has_its_own_capacity() -> None:
    problems = lm_problems("dp:2;tp:2")
    pairs = every_pair(problems)
    # Keeping everything gets no memory at all: the best of the other two.
    caps = {OPTIONS[0]: 1000, OPTIONS[1]: HW.memory_bytes, OPTIONS[2]: HW.memory_bytes}
    got = solve_with_recomputation(problems, PARAMS, caps)
    want = min((p for p in pairs if p[1] != OPTIONS[0]), key=lambda p: (p[3], p[0]))
    assert got.key == want[1] == OPTIONS[1]
    assert got.time_s == pytest.approx(want[3], rel=1e-9)
    assert got.excluded == (OPTIONS[0],)
    assert got.plan.cost.memory_capacity_bytes == HW.memory_bytes


@pytest.mark.parametrize("mesh", MESHES)
def test_options_with_different_names_share_only_the_names_they_have(
    mesh: str,
) -> None:
    """Three graphs whose names differ (b, h, j, k / b, h, k / b, h, k, o):
    a name an option lacks is never split when that option is chosen."""
    problems: dict[Key, LayoutProblem] = {}
    for family in ("lazy_sums", "custom_gradient", "elementwise"):
        case = BUILDERS[family]()
        problems[(family, "")] = LayoutProblem(
            case.graph, mtf.convert_to_shape(mesh), HW, case.outputs
        )
    pairs = every_pair(problems)
    peaks = sorted({p[4] for p in pairs})
    for capacity in [HW.memory_bytes, *peaks]:
        want = best_fitting(pairs, capacity)
        got = solve_with_recomputation(problems, PARAMS, capacity, verify=True)
        assert want is not None and got.key == want[1], capacity
        assert got.time_s == pytest.approx(want[3], rel=1e-9)
        names = set(problems[got.key].free_dims)
        assert {d for d, _ in got.plan.layout_rules} <= names


def test_phase_by_phase_objective_gives_the_same_answer() -> None:
    """A tiny weight limit forces time, the option and each tie-break chunk
    to be solved one after the other."""
    problems = lm_problems("x:2;y:2;z:2")
    starts = regime_starts(every_pair(problems))
    for capacity in [HW.memory_bytes, *starts[::4]]:
        one = solve_with_recomputation(problems, PARAMS, capacity)
        phased = solve_with_recomputation(
            problems,
            SolveParams(60, 1, 0, max_objective_weight=50),
            capacity,
        )
        # A phase is skipped when its terms are at zero (nothing split, the
        # first option); otherwise each is a solve of its own.
        if one.key != OPTIONS[0] or len(one.plan.layout_rules):
            assert phased.plan.solver.num_solves > one.plan.solver.num_solves
        assert (phased.key, phased.plan.layout_rules) == (
            one.key,
            one.plan.layout_rules,
        )
        assert phased.status is SolveStatus.OPTIMAL


def test_in_the_worker_process_each_option_is_solved_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problems = lm_problems("dp:2;tp:2")
    capacity = regime_starts(every_pair(problems))[3]
    here = solve_with_recomputation(problems, PARAMS, capacity)
    monkeypatch.setenv("MTF_PLANNER_SOLVER", "subprocess")
    there = solve_with_recomputation(problems, PARAMS, capacity)
    assert not there.jointly and there.plan.solver.solved_in == "subprocess"
    assert (there.key, there.plan.layout_rules) == (here.key, here.plan.layout_rules)
    with pytest.raises(PlannerError, match="jointly=True needs CP-SAT in this"):
        solve_with_recomputation(problems, PARAMS, capacity, jointly=True)


def test_bad_requests_say_what_was_wrong() -> None:
    problems = lm_problems("dp:2;tp:2")
    with pytest.raises(PlannerError, match="no recomputation options"):
        solve_with_recomputation({}, PARAMS)
    other = dict(problems)
    other[("x", "y")] = lm_problems("x:2;y:2;z:2")[OPTIONS[0]]
    with pytest.raises(PlannerError, match=r"option \('x', 'y'\) is on mesh"):
        solve_with_recomputation(other, PARAMS)
    with pytest.raises(PlannerError, match=r"no entry for options \[\('block'"):
        solve_with_recomputation(
            problems, PARAMS, {OPTIONS[0]: 10**9, OPTIONS[1]: 10**9}
        )
    with pytest.raises(PlannerError, match="capacity_bytes -5 for option"):
        solve_with_recomputation(problems, PARAMS, -5)


def test_asked_not_to_nothing_fits_raises_without_finding_smallest_peaks(
    monkeypatch,
) -> None:
    from layout_planner import cpsat

    problems = lm_problems("dp:2;tp:2")
    capacity = min(p[4] for p in every_pair(problems)) - 1
    seen: list[str] = []
    original = cpsat.solve_program

    def counted(program, *args, **kwargs):
        seen.append(program.objective.value)
        return original(program, *args, **kwargs)

    monkeypatch.setattr(cpsat, "solve_program", counted)
    for jointly in (True, False):
        with pytest.raises(NothingFitsError, match=rf"{fmt_bytes(capacity)} per"):
            solve_with_recomputation(
                problems, PARAMS, capacity, jointly=jointly, smallest_peak=False
            )
    # One joint model: no memory-objective program (each option alone finds
    # its smallest peak on the way, plan_mesh.solve_problem).
    assert seen.count("memory") == len(OPTIONS)


@pytest.mark.parametrize("mesh", MESHES)
def test_under_a_step_limit_the_answer_is_the_same_or_none_fits_within_it(
    mesh: str,
) -> None:
    """A limit at or above the fastest fitting pair's time changes nothing
    (it only cuts slower layouts); one below it is answered by
    NothingFitsError naming the limit, at every capacity regime."""
    problems = lm_problems(mesh)
    pairs = every_pair(problems)
    starts = regime_starts(pairs)
    limited = 0
    for capacity in [HW.memory_bytes, *starts[::2], *(s - 1 for s in starts[1::2])]:
        want = best_fitting(pairs, capacity)
        kwargs = dict(capacity_bytes=capacity, smallest_peak=False)
        if want is None:
            with pytest.raises(NothingFitsError) as none:
                solve_with_recomputation(problems, PARAMS, max_time_s=1.0, **kwargs)
            assert none.value.max_time_s == 1.0
            continue
        free = solve_with_recomputation(problems, PARAMS, **kwargs)
        for limit in (want[3], want[3] * 1.001, 10 * want[3]):
            got = solve_with_recomputation(problems, PARAMS, max_time_s=limit, **kwargs)
            assert got.key == free.key == want[1], (capacity, limit)
            assert got.plan.layout_rules == free.plan.layout_rules
            assert got.time_s == free.time_s
        below = want[3] * (1 - 1e-3)
        with pytest.raises(NothingFitsError, match=f"at a step of {below:.6g} s"):
            solve_with_recomputation(problems, PARAMS, max_time_s=below, **kwargs)
        limited += 1
    assert limited >= 3
    with pytest.raises(PlannerError, match="max_time_s=1.0 needs smallest_peak"):
        solve_with_recomputation(problems, PARAMS, max_time_s=1.0)


def test_a_term_added_to_the_time_objective_counts_in_every_option() -> None:
    """``LayoutProblem.add_time`` (a pipeline's sends): a cost outside the
    graph that reads the layout of some names.  The joint program picks
    the (option, layout) that is fastest with it; the tables' own time
    leaves it out, ``weighted_time_s`` counts it."""
    # Problems of their own: a term may add a table to its problem.
    problems = lm_problems.__wrapped__("dp:2;tp:2")
    shape = mtf.Shape([mtf.Dimension("batch", 4), mtf.Dimension("d_model", 8)])

    def term(ctx) -> float:
        # Leaving the activation whole is dearest: 0.2 ms a byte.
        return 2e-4 * ctx.slice_bytes(shape, "float32")

    for problem in problems.values():
        problem.add_time(["batch", "d_model", "no_such_name"], term)
    pairs = []
    for rank, key, asg, time_s, peak in every_pair(problems):
        cost = problems[key].table_cost(asg)
        extra = term(problems[key].context(asg))
        assert cost.time_s == time_s and cost.extra_s == extra
        assert problems[key].weighted_time_s(cost) == time_s + extra
        pairs.append((rank, key, asg, time_s + extra, peak))
    plain = best_fitting(every_pair(lm_problems("dp:2;tp:2")), HW.memory_bytes)
    want = best_fitting(pairs, HW.memory_bytes)
    assert plain is not None and want is not None
    # The term moves the answer: the plain optimum leaves batch or d_model
    # less split than the optimum with the term.
    assert plain[2] != want[2]
    got = solve_with_recomputation(problems, PARAMS, verify=True)
    assert got.key == want[1]
    assert problems[got.key].assignment_from_rules(got.plan.layout_rules) == {
        **dict.fromkeys(problems[got.key].free_dims),
        **want[2],
    }
    # The plan's cost is the graph's (what evaluate checks), without the term.
    assert got.plan.cost.time_s == pytest.approx(
        want[3] - term(problems[got.key].context(want[2])), rel=1e-9
    )
    one = plan_problem(problems[("none", "none")], Objective.TIME, PARAMS)
    assert one.solver.objective_value == pytest.approx(
        min(p[3] for p in pairs if p[0] == 0), rel=1e-9
    )


def test_a_term_of_the_time_objective_is_checked() -> None:
    problem = lm_problems.__wrapped__("dp:2;tp:2")[("none", "none")]
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(PlannerError, match=f"costs {bad!r} s"):
            problem.add_time(["batch"], lambda ctx, bad=bad: bad)
    assert problem.extra_time is None
    # Names no layout splits cost the same under every layout: left out.
    problem.add_time(["length", "no_such_name"], lambda ctx: 1.0)
    assert problem.extra_time is None
    problem.add_time(["batch"], lambda ctx: 1.0)
    assert problem.extra_time is not None
    problem.add_time(["length"], lambda ctx: 1.0)
    assert problem.extra_time is None
