"""The dimension graph: sizes, conflicts, unsplittable names, components."""

from __future__ import annotations

from test_planner_graphs import mtf_example, transformer

import mtf_core as mtf
from layout_planner.dim_graph import DimensionGraph


def test_names_sharing_a_tensor_get_a_tensor_edge_and_op_only_pairs_an_op_edge() -> (
    None
):
    dg = DimensionGraph.from_graph(mtf_example().graph)
    assert dg.conflict_kind("a", "b") == "tensor"  # x[a,b]
    assert dg.conflict_kind("a", "c") == "tensor"  # z[a,c]
    assert dg.conflict_kind("b", "c") == "tensor"  # y[b,c]
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.einsum([mtf.zeros(m, "a:4,b:4"), mtf.zeros(m, "b:4,c:4")], "a:4")
    dg = DimensionGraph.from_graph(g)
    assert dg.conflict_kind("a", "c") == "op"  # they only meet in the einsum
    assert dg.meeting_place("a", "c").startswith("einsum")
    assert dg.tensor_conflicts() == [("a", "b"), ("b", "c")]


def test_unsplittable_names_have_no_allowed_axis_and_say_which_op() -> None:
    dg = DimensionGraph.from_graph(mtf_example(unstack=True).graph)
    mesh = mtf.convert_to_shape("m1:4,m2:2")
    assert dg.allowed_axes("a", mesh) == ()
    assert "unsplittable" in dg.why_whole("a", mesh)
    assert "unstack" in dg.why_whole("c", mesh)


def test_allowed_axes_need_the_axis_size_to_divide_the_dim() -> None:
    dg = DimensionGraph.from_graph(mtf_example().graph)
    mesh = mtf.convert_to_shape("m1:4,m2:2,one:1")
    assert dg.allowed_axes("a", mesh) == (1,)  # 10 % 4 != 0; size-1 axes never
    assert dg.allowed_axes("c", mesh) == (0, 1)
    assert dg.allowed_axes("b", mesh) == ()
    assert dg.why_whole("b", mesh) == (
        "size 5 is divisible by no mesh axis (m1:4, m2:2)"
    )


def test_local_assignments_skip_tensor_conflicts_and_start_unsplit() -> None:
    dg = DimensionGraph.from_graph(mtf_example().graph)
    got = dg.local_assignments(["a", "c"], {"a": (1,), "c": (0, 1)})
    assert got[0] == (None, None)
    # a and c share z: never both on axis 1.
    assert sorted(got, key=str) == sorted(
        [(None, None), (None, 0), (None, 1), (1, None), (1, 0)], key=str
    )


def test_transformer_dims_form_one_component_with_sizes() -> None:
    dg = DimensionGraph.from_graph(transformer().graph)
    assert dg.components() == [tuple(sorted(dg.names))]
    assert dg.info("d_ff").sizes == (32,)
    as_dict = dg.to_dict(mtf.convert_to_shape("x:2;y:4"))
    node = next(n for n in as_dict["nodes"] if n["name"] == "heads")
    assert node["allowed_axes"] == ["x", "y"]
    assert {"a": "batch", "b": "d_ff", "kind": "tensor"}.items() <= next(
        e for e in as_dict["edges"] if (e["a"], e["b"]) == ("batch", "d_ff")
    ).items()
