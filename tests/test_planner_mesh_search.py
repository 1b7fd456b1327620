"""The mesh-shape search honours the request's time limit and reports progress.

A request with ``time_limit_s=1``, 65,536 devices and up to four mesh axes
(576 ordered factorizations) once ran for 78 s with its progress stuck: the
limit bounded each shape's solve, not the search.  Now it bounds the search:
the search stops, returns the best shape it tried as a ``feasible`` plan and
says how many of the shapes it tried.
"""

from __future__ import annotations

import time

import pytest
from test_planner_graphs import transformer

import mtf_core as mtf
from layout_planner.errors import PlannerError
from layout_planner.mesh_search import factorizations
from layout_planner.plan import mesh_text

pytestmark = pytest.mark.solver


def test_the_time_limit_bounds_the_whole_mesh_search_and_the_plan_says_so() -> None:
    model = transformer()
    shapes = factorizations(65536, 4)
    assert len(shapes) == 576
    seen: list[tuple[str, float]] = []
    t0 = time.monotonic()
    plan = mtf.auto_layout(
        model.graph,
        65536,
        [model.loss],
        max_mesh_dims=4,
        time_limit_s=0.5,
        top_k=2,
        progress=lambda phase, fraction: seen.append((phase, fraction)),
    )
    elapsed = time.monotonic() - t0
    tried = len(plan.mesh_trials)
    assert 1 <= tried < 576
    assert plan.status.value == "feasible"  # the best of those tried, not proven
    assert plan.reason is not None
    assert f"after {tried} of the 576 shapes of 65536 devices" in plan.reason
    assert "time_limit_s=0.5 s" in plan.reason
    # The plan is one of the shapes tried, and the best of them.
    assert mesh_text(plan.mesh_shape) in [t.mesh_shape for t in plan.mesh_trials]
    best = min(t.objective_value for t in plan.mesh_trials if t.objective_value)
    assert plan.solver.objective_value == pytest.approx(best, rel=1e-12)
    # Progress: once per shape tried, then once for the final plan, rising.
    assert len(seen) == tried + 1
    assert [f for _, f in seen] == sorted(f for _, f in seen)
    assert seen[0] == (f"mesh shape 1 of 576: {plan.mesh_trials[0].mesh_shape}", 0.0)
    assert seen[-1][0] == f"planning on {mesh_text(plan.mesh_shape)}"
    # Not a speed claim: a hang guard (the search used to run for 78 s).
    assert elapsed < 30


def test_a_search_within_its_limit_tries_every_shape_and_stays_optimal() -> None:
    model = transformer()
    seen: list[float] = []
    plan = mtf.auto_layout(
        model.graph,
        8,
        [model.loss],
        max_mesh_dims=3,
        time_limit_s=60,
        progress=lambda phase, fraction: seen.append(fraction),
    )
    assert [t.mesh_shape for t in plan.mesh_trials] == [
        ";".join(f"{n}:{v}" for n, v in zip("xyz", s)) for s in factorizations(8, 3)
    ]
    assert plan.status.value == "optimal" and plan.reason is None
    n = len(factorizations(8, 3))  # 8, 4x2, 2x4, 2x2x2
    assert n == 4 and seen == [i / n for i in range(n)] + [1.0]


def test_a_search_that_finds_nothing_in_time_says_how_many_shapes_it_tried() -> None:
    model = transformer()
    with pytest.raises(PlannerError, match=r"tried 1 of the 576 shapes") as info:
        mtf.auto_layout(
            model.graph,
            65536,
            [model.loss],
            max_mesh_dims=4,
            time_limit_s=1e-9,
            memory_limit=1,  # nothing fits: no shape has a layout
        )
    assert isinstance(info.value, ValueError)
