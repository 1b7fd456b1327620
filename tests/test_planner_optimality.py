"""The integer program is right: on small graphs, every layout is enumerated
and priced by ``cost_models.evaluate``, the independent evaluator.

* the planner's tables price every layout exactly as ``evaluate`` does, and
  reject exactly the layouts the lowering rejects (plus, conservatively, those
  splitting a dim an op marked unsplittable);
* the solver's plan is optimal among all valid layouts, for both objectives;
* the top-k candidates are the k best layouts, in order.
"""

from __future__ import annotations

import math

import pytest
from test_cost_graphs import BUILDERS, Case, all_rules

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
