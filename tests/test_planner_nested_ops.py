"""Graphs with nested operations (a ``while_loop`` body) plan: dims named only
inside the body get nodes with their sizes in the dimension graph."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from layout_planner.dim_graph import DimensionGraph

pytestmark = pytest.mark.solver

D = mtf.Dimension


def _loop_with_inner_dim():
    """Each iteration goes through a dim (``inner``) that no tensor outside
    the loop has: x <- relu(x @ w1) @ w2 + sum over ``pos`` of a range."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch, hidden, inner = D("batch", 8), D("hidden", 8), D("inner", 16)
    x = mtf.import_tf_tensor(mesh, np.ones((8, 8), np.float32), [batch, hidden])
    w1 = mtf.get_variable(mesh, "w1", [hidden, inner])
    w2 = mtf.get_variable(mesh, "w2", [inner, hidden])
    limit = mtf.constant(mesh, 2, (), "int32")

    def body(i, x):
        h = mtf.relu(mtf.einsum([x, w1], [batch, inner]))
        shift = mtf.reduce_sum(mtf.range(mesh, D("pos", 4), "float32"))
        return [i + 1, mtf.einsum([h, w2], [batch, hidden]) + shift]

    _, y = mtf.while_loop(
        lambda i, x: mtf.less(i, limit), body, [mtf.constant(mesh, 0, (), "int32"), x]
    )
    return graph, mtf.reduce_sum(y)


def test_dims_named_only_inside_a_loop_body_have_sizes() -> None:
    graph, _ = _loop_with_inner_dim()
    dims = DimensionGraph.from_graph(graph)
    assert dims.info("inner").sizes == (16,)
    assert dims.info("pos").sizes == (4,)


def test_a_graph_with_a_loop_plans() -> None:
    graph, loss = _loop_with_inner_dim()
    plan = mtf.auto_layout(graph, "x:2;y:2", outputs=[loss], time_limit_s=10)
    assert plan.status.value in ("optimal", "feasible"), plan.status
    # whatever it chose names only dims of the graph
    assert {d for d, _ in plan.layout_rules.pairs} <= {
        "batch",
        "hidden",
        "inner",
        "pos",
    }
