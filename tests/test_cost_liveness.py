"""The cost model prices the step a compiled step runs: the ops the exported
outputs and the graph's updates (its ``Assign`` ops) need
(:mod:`mtf_core.liveness`), every op when no output is given."""

from __future__ import annotations

import pytest

import mtf_core as mtf
from cost_models import cost_units, evaluate, get_hardware, memory_model
from cost_models.units import OP
from layout_planner.problem import LayoutProblem
from mtf_core.comm import LayoutContext
from mtf_core.errors import GraphError
from mtf_core.liveness import graph_updates, step_operations, step_targets

HW = "h100-nvlink-ib"


def _graph() -> tuple[mtf.Graph, mtf.Tensor, mtf.Tensor, mtf.Operation]:
    """``y = exp(x @ w)`` is exported; ``w`` is updated with ``w - x @ v``;
    ``exp(x @ v2)`` is read by nothing the step needs."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.ones(m, "b:8,k:4")
    w = mtf.get_variable(m, "w", "k:4,h:4")
    y = mtf.exp(mtf.einsum([x, w], output_shape="b:8,h:4"))
    upd = mtf.assign(w, w - mtf.einsum([x, y], output_shape="k:4,h:4"))
    dead = mtf.exp(mtf.einsum([x, mtf.ones(m, "k:4,h:4")], output_shape="b:8,h:4"))
    return g, y, dead, upd


def test_a_step_is_what_its_outputs_and_updates_need() -> None:
    g, y, dead, upd = _graph()
    ops = step_operations(g, [y])
    assert graph_updates(g) == [upd]
    assert upd in ops and y.operation in ops
    assert dead.operation not in ops
    # everything but the unused ones(), its einsum and exp, in graph order
    assert [op for op in g.operations if op in ops] == list(ops)
    assert len(g.operations) - len(ops) == 3
    # no outputs: the whole graph (as Lowering(graph, ...) without targets)
    assert step_operations(g) == tuple(g.operations)
    assert step_targets(g) is None
    assert step_targets(g, [y]) == [y, upd]


def test_the_step_grows_with_its_graph() -> None:
    g, y, dead, _ = _graph()
    before = step_operations(g, [y])
    z = mtf.log(dead)  # a new op: the cache is per graph size
    assert step_operations(g, [y]) == before
    assert set(step_operations(g, [y, z])) == set(before) | {
        dead.operation,
        dead.operation.inputs[0].operation,
        dead.operation.inputs[0].operation.inputs[1].operation,
        z.operation,
    }


def test_outputs_of_another_graph_are_refused() -> None:
    g, _, _, _ = _graph()
    other, y2, _, _ = _graph()
    with pytest.raises(GraphError, match="not a tensor of this graph"):
        step_operations(g, [y2])
    del other


def test_evaluate_prices_neither_the_flops_nor_the_allreduce_of_an_unused_op() -> None:
    g, y, dead, _ = _graph()
    rules = "k:x"  # every einsum over k sums over x: one allreduce each
    step = evaluate(g, "x:2", rules, HW, [y])
    whole = evaluate(g, "x:2", rules, HW)
    # the unused einsum's allreduce is forced by its exp: in the whole graph only
    assert len(whole.collectives) - len(step.collectives) == 1
    assert "exp_1" in whole.collective_ops and "exp_1" not in step.collective_ops
    # its flops: 2 * 8 * 4 * 4 over 2 devices, and exp's 8 * 4 (h unsplit)
    assert whole.flops_per_device - step.flops_per_device == pytest.approx(
        2 * 8 * 4 * 4 / 2 + 8 * 4
    )
    assert sum(u.kind == OP for u in cost_units(g, [y])) == len(g.operations) - 3


def test_memory_holds_what_the_step_makes_and_every_variable() -> None:
    g, y, dead, _ = _graph()
    names = {t.name for t in memory_model(g, [y]).tensors}
    assert dead.name not in names and "w:0" in names
    assert dead.name in {t.name for t in memory_model(g).tensors}
    one = LayoutContext.make("x:1", "")
    # x is held until the update's einsum reads it, not until the unused one
    step, whole = memory_model(g, [y]), memory_model(g)
    ops = g.operations
    update_einsum = ops.index(
        graph_updates(g)[0].inputs[1].operation.inputs[1].operation
    )
    unused_einsum = ops.index(dead.operation.inputs[0].operation)
    assert (step.end[0], whole.end[0]) == (update_einsum, unused_einsum)
    # the peak: x, w, x @ w and y (128 + 64 + 128 + 128 bytes)
    assert step.peak_bytes_per_device(one) == 448


def test_the_planner_tables_price_the_step_like_evaluate() -> None:
    g, y, _, _ = _graph()
    problem = LayoutProblem(g, mtf.convert_to_shape("x:2"), get_hardware(HW), [y])
    for rules in ("", "k:x", "b:x", "h:x"):
        cost = evaluate(g, "x:2", rules, HW, [y])
        table = problem.table_cost(
            problem.assignment_from_rules(mtf.convert_to_layout_rules(rules))
        )
        assert table.compute_s == pytest.approx(cost.compute_s, rel=1e-12)
        assert dict(table.comm_s_by_axis) == pytest.approx(
            dict(cost.comm_s_by_axis), rel=1e-12
        )
        assert table.peak_bytes == cost.peak_memory_bytes, rules


def test_only_the_steps_tensors_must_have_valid_layouts() -> None:
    """As the lowering checks only the ops it lowers: a layout that splits a
    dim only an unused tensor has, and cannot split it, prices the step."""
    g, y, _, _ = _graph()
    m = y.mesh
    mtf.exp(mtf.ones(m, "z:3"))  # nothing reads it; z:3 cannot split over x:2
    assert evaluate(g, "x:2", "z:x", HW, [y]).flops_per_device > 0
    with pytest.raises(mtf.LayoutError, match="ones_2:0"):
        evaluate(g, "x:2", "z:x", HW)
