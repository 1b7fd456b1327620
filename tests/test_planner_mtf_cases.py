"""Mesh TensorFlow's own auto_mtf test cases, under the memory objective."""

from __future__ import annotations

import pytest
from test_planner_graphs import mtf_example

import mtf_core as mtf

pytestmark = pytest.mark.solver

MESH = mtf.convert_to_shape("m1:4,m2:2")


def axis_of(rules: mtf.LayoutRules, name: str, mesh: mtf.Shape) -> int | None:
    return rules.tensor_dimension_to_mesh_axis(mtf.Dimension(name, 1), mesh)


def test_layout_splits_a_over_m2_and_c_over_m1() -> None:
    ex = mtf_example()
    rules = mtf.auto_mtf.layout(ex.graph, MESH, [ex.z])
    assert str(rules) == "a:m2;c:m1"
    assert axis_of(rules, "a", MESH) == 1
    assert axis_of(rules, "b", MESH) is None
    assert axis_of(rules, "c", MESH) == 0


def test_layout_splits_nothing_when_unstack_needs_a_and_c_whole() -> None:
    ex = mtf_example(unstack=True)
    rules = mtf.auto_mtf.layout(ex.graph, MESH, [ex.z])
    assert str(rules) == ""


def test_layout_and_mesh_shape_picks_a_4x2_mesh_with_the_same_rules() -> None:
    ex = mtf_example()
    rules, mesh = mtf.auto_mtf.layout_and_mesh_shape(ex.graph, 8, [ex.z])
    assert list(mesh.dims) == [mtf.Dimension("mesh_0", 4), mtf.Dimension("mesh_1", 2)]
    assert axis_of(rules, "a", mesh) == 1
    assert axis_of(rules, "b", mesh) is None
    assert axis_of(rules, "c", mesh) == 0


def test_layout_and_mesh_shape_with_one_dimension_gives_8_and_splits_nothing() -> None:
    ex = mtf_example()
    rules, mesh = mtf.auto_mtf.layout_and_mesh_shape(ex.graph, 8, [ex.z], 1)
    assert list(mesh.dims) == [mtf.Dimension("mesh_0", 8)]
    assert str(rules) == ""


def test_memory_plan_reports_the_peak_it_minimised() -> None:
    ex = mtf_example()
    plan = mtf.auto_layout(ex.graph, MESH, [ex.z], objective="memory")
    # x[a/2,b], y[b,c/4], z[a/2,c/4] float32, all alive at the einsum.
    assert plan.cost.peak_memory_bytes == 4 * (5 * 5 + 5 * 5 + 5 * 5)
    assert plan.evaluation is not None
    assert plan.evaluation.peak_memory_bytes == plan.cost.peak_memory_bytes
    assert plan.solver.gap == 0.0
