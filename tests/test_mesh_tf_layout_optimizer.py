"""Mesh TF's memory-only CP-SAT layout model
(``mesh_tensorflow.auto_mtf.layout_optimizer``, the planner's
``mesh_tf_layout_optimizer``): its answers against an exhaustive search with
its own evaluator."""

from __future__ import annotations

import itertools

import pytest

import mtf_core as mtf
from layout_planner.errors import PlannerError
from layout_planner.mesh_tf_layout_optimizer import (
    LayoutOptimizer,
    _generate_assignments,
    _local_var_name,
)
from mtf_core.compat.auto_mtf.memory_estimator import MemoryEstimator


def _einsum_graph(repeat: int = 1) -> mtf.Graph:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x1 = mtf.zeros(m, "a:10,b:5")  # 200 bytes
    x2 = mtf.zeros(m, "b:5,c:20")  # 400 bytes
    for _ in range(repeat):
        mtf.einsum([x1, x2], output_shape="a:10,c:20")  # 800 bytes
    return g


def test_assignments_are_one_to_one_partial_maps() -> None:
    got = _generate_assignments({"s1", "s2", "s3"}, {"m1": 4, "m2": 8})
    # 1 empty + 3 dims x 2 mesh dims + 3 pairs x 2 orders
    assert len(got) == 13
    assert {} in got and {"s1": "m2", "s2": "m1"} in got
    assert all(len(set(a.values())) == len(a) for a in got)
    assert len(_generate_assignments({"a", "b"}, {"x": 2, "y": 2, "z": 2})) == 13
    assert _local_var_name({"channel", "hidden"}, {"channel": "y"}) == (
        "y_(channel:y,hidden)"
    )


def test_solves_the_memory_optimum_and_evaluates_it() -> None:
    opt = LayoutOptimizer(MemoryEstimator(_einsum_graph(), "m1:4,m2:2"))
    layout = opt.solve()
    assert layout == "a:m2;c:m1"  # b:5 divides by neither
    # x1 200/2, x2 400/4, the product 800/8: all live at the einsum
    assert opt.evaluate_layout(layout) == 300.0
    assert opt.evaluate_layout("") == 1400.0
    assert opt.evaluate_layout("c:m1") == 200 + 100 + 200


def _all_layouts(
    dims: dict[str, int], mesh: dict[str, int], op_dims: list[set[str]]
) -> list[str]:
    """Every layout: each dim on one mesh dim dividing it or none, no
    operation with two dims on one mesh dim."""
    out = []
    names = sorted(dims)
    for choice in itertools.product([None, *mesh], repeat=len(names)):
        split = {d: md for d, md in zip(names, choice) if md is not None}
        if any(dims[d] % mesh[md] for d, md in split.items()):
            continue
        if any(
            len([split[d] for d in s if d in split])
            != len({split[d] for d in s if d in split})
            for s in op_dims
        ):
            continue
        out.append(";".join(f"{d}:{md}" for d, md in sorted(split.items())))
    return out


def test_optimum_equals_exhaustive_search() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "batch:8,d:6")
    w = mtf.zeros(m, "d:6,f:4")
    h = mtf.einsum([x, w], output_shape="batch:8,f:4")
    v = mtf.zeros(m, "f:4,e:12")
    y = mtf.einsum([h, v], output_shape="batch:8,e:12")
    mtf.reduce_sum(y, reduced_dim=mtf.Dimension("e", 12))
    mesh = {"p": 2, "q": 2, "r": 3}
    opt = LayoutOptimizer(MemoryEstimator(g, "p:2,q:2,r:3"))
    layout = opt.solve()
    best = opt.evaluate_layout(layout)
    op_dims = [set(op.all_dim_names) for op in g.operations]
    sizes = {"batch": 8, "d": 6, "e": 12, "f": 4}
    valid = _all_layouts(sizes, mesh, op_dims)
    assert layout in valid
    # batch, f on {-, p, q}; d, e on {-, p, q, r}; batch, d, f and batch, f, e distinct
    assert len(valid) == 16 + 18 + 18 + 8
    assert best == min(opt.evaluate_layout(lay) for lay in valid)
    assert best < opt.evaluate_layout("")


def test_unsplittable_dims_stay_whole() -> None:
    g = _einsum_graph()
    x1, x2 = g.operations[0].outputs[0], g.operations[1].outputs[0]
    mtf.unstack(x1, mtf.Dimension("a", 10))
    mtf.unstack(x2, mtf.Dimension("c", 20))
    assert LayoutOptimizer(MemoryEstimator(g, "m1:4,m2:2")).solve() == ""


def test_a_size_one_mesh_dim_takes_one_more_dim() -> None:
    opt = LayoutOptimizer(MemoryEstimator(_einsum_graph(), "m1:4,m2:2,m3:1"))
    assert opt.solve() == "a:m2;b:m3;c:m1"  # same memory, one more split


def test_like_operations_share_variables() -> None:
    opt = LayoutOptimizer(MemoryEstimator(_einsum_graph(repeat=100), "m1:4,m2:2"))
    assert opt.solve() == "a:m2;c:m1"
    # 6 global + one set per distinct dim set ({a,b}, {b,c}, {a,c}, {a,b,c}) + z
    assert len(opt._model.Proto().variables) == 6 + 7 + 7 + 7 + 13 + 1


def test_layout_naming_an_unknown_mesh_dim_is_rejected() -> None:
    opt = LayoutOptimizer(MemoryEstimator(_einsum_graph(), "m1:4,m2:2"))
    with pytest.raises(PlannerError, match="mesh dim 'm9' is not one of"):
        opt.evaluate_layout("a:m9")


def test_mesh_tensorflow_name() -> None:
    import mtf_core.compat as compat

    compat.install()
    try:
        from mesh_tensorflow.auto_mtf import layout_optimizer

        assert layout_optimizer.LayoutOptimizer is LayoutOptimizer
    finally:
        compat.uninstall()


def test_solving_leaves_tensorflow_unloaded() -> None:
    """The planner side of Mesh TF's layout optimizer needs no TensorFlow: only
    GraphInterface.compute_cost_graph (a TF proto export) would load it."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        import mtf_core as mtf
        from layout_planner.mesh_tf_layout_optimizer import LayoutOptimizer
        from mtf_core.compat.auto_mtf.memory_estimator import MemoryEstimator
        g = mtf.Graph()
        m = mtf.Mesh(g, "m")
        x1 = mtf.zeros(m, "a:10,b:5")
        x2 = mtf.zeros(m, "b:5,c:20")
        mtf.einsum([x1, x2], output_shape="a:10,c:20")
        print(LayoutOptimizer(MemoryEstimator(g, "m1:4,m2:2")).solve())
        print("tensorflow" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["a:m2;c:m1", "False"]
