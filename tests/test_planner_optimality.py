"""The integer program is right: on small graphs, every layout is enumerated
and priced by ``cost_models.evaluate``, the independent evaluator.

* the planner's tables price every layout exactly as ``evaluate`` does, and
  reject exactly the layouts the lowering rejects (plus, conservatively, those
  splitting a dim an op marked unsplittable);
* the solver's plan is optimal among all valid layouts, for both objectives;
* the top-k candidates are the k best layouts, in order;
* on ``x:2;y:2`` and ``x:2;y:2;z:2`` (interchangeable axes: symmetry breaking,
  axis orbits priced once), under two hardware profiles, for every graph
  family: the plan's objective equals the best of every layout, enumerated,
  and the tables agree with ``evaluate`` on (a sample of) those layouts.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
from test_cost_graphs import BUILDERS, Case, all_rules
from test_planner_graphs import INFINIBAND, gpu

import mtf_core as mtf
from cost_models import Cost, evaluate, get_hardware
from layout_planner.problem import LayoutProblem
from mtf_core.errors import LayoutError

HW = get_hardware("cpu-host")
MESH = "x:2;y:4"  # two axes of different sizes: no two layouts are mirror images


def every_layout(
    case: Case, mesh: str, problem: LayoutProblem
) -> list[tuple[str, Cost]]:
    """Every layout ``evaluate`` accepts and the planner may choose, priced."""
    out = []
    for text in all_rules(case.dim_names, mesh):
        rules = mtf.convert_to_layout_rules(text)
        table = problem.table_cost(problem.assignment_from_rules(rules))
        try:
            cost = evaluate(
                case.graph, mesh, rules, HW, case.outputs, memory=problem.memory
            )
        except LayoutError:
            assert table.invalid, f"the planner accepts {text!r}, the lowering does not"
            continue
        if table.invalid:
            assert "unsplittable" in table.invalid, (text, table.invalid)
            continue
        out.append((str(rules), cost))
    return out


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_planner_prices_every_layout_exactly_like_evaluate(family: str) -> None:
    case = BUILDERS[family]()
    problem = LayoutProblem(case.graph, mtf.convert_to_shape(MESH), HW, case.outputs)
    layouts = every_layout(case, MESH, problem)
    assert len(layouts) > 1
    for text, cost in layouts:
        table = problem.table_cost(
            problem.assignment_from_rules(mtf.convert_to_layout_rules(text))
        )
        assert table.compute_s == pytest.approx(cost.compute_s, rel=1e-9, abs=1e-18)
        assert dict(table.comm_s_by_axis) == pytest.approx(
            dict(cost.comm_s_by_axis), rel=1e-9
        )
        assert table.peak_bytes == cost.peak_memory_bytes, text


@pytest.mark.solver
@pytest.mark.parametrize("family", ["einsum", "lazy_sums", "reshape", "mlp_adam"])
@pytest.mark.parametrize("objective", ["time", "memory"])
def test_plan_is_optimal_among_every_valid_layout(family: str, objective: str) -> None:
    case = BUILDERS[family]()
    problem = LayoutProblem(case.graph, mtf.convert_to_shape(MESH), HW, case.outputs)
    layouts = every_layout(case, MESH, problem)
    plan = mtf.auto_layout(case.graph, MESH, case.outputs, HW, objective, top_k=1)
    assert plan.status.value == "optimal" and plan.solver.gap == 0.0
    assert plan.evaluation is not None  # verified against evaluate()
    if objective == "time":
        best = min(c.time_s for _, c in layouts if c.fits)
        assert plan.cost.time_s == pytest.approx(best, rel=1e-9)
    else:
        peak = min(c.peak_memory_bytes for _, c in layouts)
        best = min(c.time_s for _, c in layouts if c.peak_memory_bytes == peak)
        assert plan.cost.peak_memory_bytes == peak
        assert plan.cost.time_s == pytest.approx(best, rel=1e-9)


@pytest.mark.solver
def test_top_k_candidates_are_the_k_best_layouts_in_order() -> None:
    case = BUILDERS["mlp_adam"]()
    problem = LayoutProblem(case.graph, mtf.convert_to_shape(MESH), HW, case.outputs)
    times = sorted(c.time_s for _, c in every_layout(case, MESH, problem))
    plan = mtf.auto_layout(case.graph, MESH, case.outputs, HW, top_k=6)
    got = [c.cost.time_s for c in plan.candidates]
    assert len(got) == 6 and len({str(c.layout_rules) for c in plan.candidates}) == 6
    assert got == pytest.approx(times[:6], rel=1e-9)
    assert [c.rank for c in plan.candidates] == [1, 2, 3, 4, 5, 6]
    assert plan.candidates[0].layout_rules == plan.layout_rules


@pytest.mark.solver
def test_top_k_stops_when_every_layout_is_ranked() -> None:
    case = BUILDERS["slicing"]()  # two dims: few layouts
    problem = LayoutProblem(case.graph, mtf.convert_to_shape(MESH), HW, case.outputs)
    n = len(every_layout(case, MESH, problem))
    plan = mtf.auto_layout(case.graph, MESH, case.outputs, HW, top_k=n + 5)
    assert len(plan.candidates) == n
    assert plan.solver.top_k_complete
    assert all(math.isfinite(c.cost.time_s) for c in plan.candidates)


# Two profiles: one link for every axis (all interchangeable), and a GPU whose
# x axis is on InfiniBand (only y and z interchangeable, x pricier).
PROFILES = {"cpu-host": HW, "gpu-x-infiniband": gpu({"x": INFINIBAND})}
SYMMETRIC_MESHES = ["x:2;y:2", "x:2;y:2;z:2"]
# Layouts per case that evaluate() prices again (every one, below this).
EVALUATED = 60


def enumerate_layouts(
    problem: LayoutProblem,
) -> list[tuple[dict[str, int | None], float, int]]:
    """Every layout of the free dims the tables accept: (assignment, time,
    peak), from the tables (microseconds each)."""
    dims = problem.free_dims
    out = []
    for choice in itertools.product(*([None, *problem.allowed[d]] for d in dims)):
        asg = dict(zip(dims, choice))
        table = problem.table_cost(asg)
        if table.invalid is None:
            out.append((asg, table.time_s, table.peak_bytes))
    return out


def _optimality_cases() -> list[object]:
    cases = []
    for family in sorted(BUILDERS):
        for mesh in SYMMETRIC_MESHES:
            for hw in PROFILES:
                marks = []
                if family == "reshape" and mesh.count(":") == 3:
                    marks = [pytest.mark.slow]  # 65,536 layouts of 8 dims
                cases.append(pytest.param(family, mesh, hw, marks=marks))
    return cases


@pytest.mark.solver
@pytest.mark.parametrize("family, mesh, hw_name", _optimality_cases())
def test_plans_on_interchangeable_axes_match_exhaustive_enumeration(
    family: str, mesh: str, hw_name: str
) -> None:
    case = BUILDERS[family]()
    hw = PROFILES[hw_name]
    problem = LayoutProblem(case.graph, mtf.convert_to_shape(mesh), hw, case.outputs)
    layouts = enumerate_layouts(problem)
    assert layouts
    # The tables price what evaluate() prices (every layout, or a sample).
    sample = random.Random(0).sample(layouts, min(EVALUATED, len(layouts)))
    for asg, time_s, peak in sample:
        rules = problem.rules_for(asg)
        cost = evaluate(
            case.graph, mesh, rules, hw, case.outputs, memory=problem.memory
        )
        assert time_s == pytest.approx(cost.time_s, rel=1e-9, abs=1e-18), str(rules)
        assert peak == cost.peak_memory_bytes, str(rules)
    capacity = hw.memory_bytes
    fitting = [(t, p) for _, t, p in layouts if p <= capacity]
    plan = mtf.auto_layout(case.graph, mesh, case.outputs, hw, "time", top_k=3)
    assert plan.status.value == "optimal" and plan.evaluation is not None
    assert plan.cost.time_s == pytest.approx(min(t for t, _ in fitting), rel=1e-9)
    # The candidates, in order, take the best times there are (mirror images
    # under interchangeable axes are one candidate: compare values, not rules).
    got = [c.cost.time_s for c in plan.candidates]
    assert got == sorted(got) and len(plan.candidates) == min(3, len(layouts))
    distinct = sorted({t for t, _ in fitting})
    assert sorted(set(got)) == distinct[: len(set(got))]
    memory = mtf.auto_layout(case.graph, mesh, case.outputs, hw, "memory", top_k=1)
    peak = min(p for _, _, p in layouts)
    assert memory.status.value == "optimal"
    assert memory.cost.peak_memory_bytes == peak
    fastest_at_peak = min(t for _, t, p in layouts if p == peak)
    assert memory.cost.time_s == pytest.approx(fastest_at_peak, rel=1e-9)
