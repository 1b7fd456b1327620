"""Interchangeable mesh axes (one size, one link) are priced once.

The planner prices one assignment per orbit of the axis permutations that
only exchange interchangeable axes, and copies the others with their comm
keys renamed.  These tests price every table both ways and require the same
numbers, bit for bit; and they check what the saving is for.
"""

from __future__ import annotations

import pytest
from test_cost_graphs import BUILDERS
from test_planner_graphs import INFINIBAND, NVLINK, gpu, transformer

import mtf_core as mtf
from cost_models import get_hardware
from layout_planner.problem import LayoutProblem

pytestmark = pytest.mark.solver


def priced_fully(monkeypatch: pytest.MonkeyPatch, *args: object) -> LayoutProblem:
    with monkeypatch.context() as m:
        m.setattr(LayoutProblem, "_axis_permutations", lambda self: [])
        return LayoutProblem(*args)  # type: ignore[arg-type]


def assert_same_tables(a: LayoutProblem, b: LayoutProblem) -> None:
    assert [t.dims for t in a.tables] == [t.dims for t in b.tables]
    for ta, tb in zip(a.tables, b.tables):
        assert ta.assignments == tb.assignments
        assert ta.invalid == tb.invalid, ta.dims
        assert ta.compute_s == tb.compute_s, ta.dims
        assert ta.buffer_bytes == tb.buffer_bytes, ta.dims
        for k, (ca, cb) in enumerate(zip(ta.comm_s, tb.comm_s)):
            assert ca.keys() == cb.keys(), (ta.dims, ta.assignments[k])
            for axis in ca:
                assert ca[axis] == pytest.approx(cb[axis], rel=1e-12, abs=0)
        assert ta.time_s == pytest.approx(tb.time_s, rel=1e-12, abs=0)


@pytest.mark.parametrize(
    "mesh, hardware",
    [
        ("x:2;y:2;z:2", "cpu-host"),
        ("x:2;y:2;z:2", "h100-nvlink-ib"),
        ("x:4;y:4;z:4", "h100-nvlink-ib"),  # x crosses hosts: y, z only
        ("x:2;y:2", "cpu-host"),
    ],
)
def test_orbit_pricing_gives_the_tables_of_full_pricing(
    monkeypatch: pytest.MonkeyPatch, mesh: str, hardware: str
) -> None:
    model = transformer(num_layers=2)
    args = (model.graph, mtf.convert_to_shape(mesh), get_hardware(hardware))
    fast = LayoutProblem(*args, [model.loss])
    full = priced_fully(monkeypatch, *args, [model.loss])
    assert_same_tables(fast, full)
    assert fast.stats.num_unit_pricings < full.stats.num_unit_pricings


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_orbit_pricing_is_exact_for_every_graph_family(
    monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    case = BUILDERS[family]()
    args = (case.graph, mtf.convert_to_shape("x:2;y:2;z:2"), get_hardware("cpu-host"))
    assert_same_tables(
        LayoutProblem(*args, case.outputs),
        priced_fully(monkeypatch, *args, case.outputs),
    )


def test_axes_of_different_links_are_not_exchanged() -> None:
    model = transformer()
    mesh = mtf.convert_to_shape("x:2;y:2;z:2")
    problem = LayoutProblem(
        model.graph, mesh, gpu({"x": INFINIBAND, "y": NVLINK}), [model.loss]
    )
    # y and z share NVLink (z by default); x is on InfiniBand.
    assert problem._axis_permutations() == [(0, 2, 1)]
    one_link = LayoutProblem(model.graph, mesh, gpu(), [model.loss])
    assert len(one_link._axis_permutations()) == 5  # 3! - identity


def test_three_interchangeable_axes_price_about_a_sixth_of_the_assignments() -> None:
    model = transformer(num_layers=2)
    mesh = mtf.convert_to_shape("x:2;y:2;z:2")
    problem = LayoutProblem(model.graph, mesh, get_hardware("cpu-host"), [model.loss])
    stats = problem.stats
    # Every unit signature of a table under every assignment, without orbits.
    full = sum(
        len(t.assignments) * len({u.signature for u in _units_of(problem, t.dims)})
        for t in problem.tables
    )
    assert stats.num_unit_pricings < full / 3


def _units_of(problem: LayoutProblem, dims: tuple[str, ...]) -> list[object]:
    return [
        c.unit for c in problem.unit_classes if problem.free(c.unit.dim_names) == dims
    ]


def test_a_three_axis_plan_takes_one_solve_per_candidate() -> None:
    # Time and the tie-break in one objective (over the shifted time
    # variable) even on three interchangeable axes: no second solve per rank.
    model = transformer(num_layers=2)
    plan = mtf.auto_layout(model.graph, "x:2;y:2;z:2", [model.loss], top_k=5)
    assert plan.status.value == "optimal"
    assert len(plan.candidates) == 5
    assert plan.solver.num_solves == 5
