"""A stage of n identical layers planned from its 2-, 3- and 4-layer graphs
(layout_planner.stacked) prices every layout exactly as the n-layer graph."""

from __future__ import annotations

import copy
import dataclasses
import random

import numpy as np
import pytest

from cost_models.costs import evaluate
from cost_models.profiles import get_hardware
from layout_planner.analysis import GraphAnalysis
from layout_planner.plan_mesh import solve_problem
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams
from layout_planner.stacked import LayerStack, StackingError
from mtf_core.graph import Graph, Mesh
from mtf_core.models import (
    TransformerConfig,
    build_encoder_decoder,
    build_lm,
    transformer,
)
from mtf_core.models.base import ModelGraph, add_training
from mtf_core.ops import elementwise as ew
from mtf_core.shapes import convert_to_shape

BASE = TransformerConfig(
    num_layers=2, d_model=64, heads=4, d_kv=16, d_ff=128, vocab=256, length=32,
    batch=4, activation_dtype="bfloat16", shardable_weights=True,
)  # fmt: skip
MESH = convert_to_shape("dp:2;tp:2")
HW = get_hardware("h100-nvlink-ib")


def _analysis(cfg: TransformerConfig, layers: int, builder=build_lm) -> GraphAnalysis:
    model = builder(cfg.replace(num_layers=layers), optimizer="adam")
    return GraphAnalysis(model.graph, [model.loss])


@pytest.mark.parametrize(
    "attention,ffn,builder",
    [
        ("none", "none", build_lm),
        ("scores", "none", build_lm),
        ("block", "block", build_lm),
        # Each decoder layer reads the encoder output through its own identity.
        ("scores", "block", build_encoder_decoder),
    ],
)
def test_stacked_stage_prices_every_layout_like_the_full_graph(attention, ffn, builder):
    cfg = BASE.replace(recompute_attention=attention, recompute_ffn=ffn)
    n = 7
    small = [_analysis(cfg, k, builder) for k in (2, 3, 4)]
    stacked = LayerStack(*small).analysis(n)
    full = _analysis(cfg, n, builder)
    # The unit classes are the n-layer graph's, counts included.
    want = {(c.unit.dim_names, c.unit.signature): c.count for c in full.unit_classes}
    got = {(c.unit.dim_names, c.unit.signature): c.count for c in stacked.unit_classes}
    assert got == want
    p_full = LayoutProblem(full.graph, MESH, HW, full.outputs, analysis=full)
    p_stack = LayoutProblem(stacked.graph, MESH, HW, stacked.outputs, analysis=stacked)
    assert p_stack.free_dims == p_full.free_dims
    # Every layout (random ones of the whole space): same time, same peak.
    rng = random.Random(0)
    options = [[None, *p_full.allowed[d]] for d in p_full.free_dims]
    checked = tries = 0
    while checked < 150 and tries < 20000:
        tries += 1
        asg = dict(zip(p_full.free_dims, (rng.choice(o) for o in options)))
        a, b = p_full.table_cost(asg), p_stack.table_cost(asg)
        assert (a.invalid is None) == (b.invalid is None)
        if a.invalid is None:
            assert b.time_s == pytest.approx(a.time_s, rel=1e-12)
            assert b.peak_bytes == a.peak_bytes
            checked += 1
    assert checked == 150
    # Under a memory limit that binds, CP-SAT picks the same layout in both,
    # and evaluate() of the n-layer graph gives the stacked tables' price.
    unconstrained = p_full.table_cost(
        solve_problem(p_full, Objective.TIME, SolveParams(20.0, 1, 0, 1)).assignment
    )
    hw = HW.with_memory(int(unconstrained.peak_bytes * 0.8))
    p_full = LayoutProblem(full.graph, MESH, hw, full.outputs, analysis=full)
    p_stack = LayoutProblem(stacked.graph, MESH, hw, stacked.outputs, analysis=stacked)
    params = SolveParams(20.0, 1, 0, 1)
    s_full = solve_problem(p_full, Objective.TIME, params)
    s_stack = solve_problem(p_stack, Objective.TIME, params)
    assert s_stack.assignment == s_full.assignment
    rules = p_stack.rules_for(s_stack.assignment)
    cost = evaluate(full.graph, MESH, rules, hw, full.outputs)
    table = p_stack.table_cost(s_stack.assignment)
    assert table.time_s == pytest.approx(cost.time_s, rel=1e-9)
    assert table.peak_bytes == cost.peak_memory_bytes
    assert cost.peak_memory_bytes <= hw.memory_bytes < unconstrained.peak_bytes


def test_stacked_rows_are_fewer_than_the_full_graph_rows():
    small = [_analysis(BASE, k) for k in (2, 3, 4)]
    stacked = LayerStack(*small).analysis(48)
    full = _analysis(BASE, 48)
    assert len(stacked.live_rows) < len(full.live_rows) / 5


def _every_layer_to_the_head(cfg: TransformerConfig, optimizer: str) -> ModelGraph:
    """Feed-forward layers whose outputs all meet in one sum before the head:
    a sum of ``n`` terms, which no 2- or 3-layer graph has."""
    graph = Graph()
    mesh = Mesh(graph, "mesh")
    with transformer._storage(cfg, graph):
        ph = transformer._placeholders(mesh, cfg, ["inputs", "targets"])
        x = transformer._embed(cfg, ph["inputs"], "token")
        outs = []
        for i in range(cfg.num_layers):
            x = transformer._feed_forward(cfg, x, f"layer_{i:03d}/ffn")
            outs.append(x)
        logits, loss = transformer._logits_and_loss(cfg, ew.add_n(outs), ph["targets"])
        model = ModelGraph(graph, mesh, ph, loss, logits, cfg)
        return add_training(model, optimizer, None)


def test_stages_whose_layers_are_not_identical_are_refused_by_name():
    small = [_analysis(BASE, k, _every_layer_to_the_head) for k in (2, 3, 4)]
    with pytest.raises(StackingError, match="add_n.*not affine in layers"):
        LayerStack(*small)
    with pytest.raises(StackingError, match="1 layers"):
        LayerStack(*[_analysis(BASE, k) for k in (2, 3, 4)]).analysis(1)


@pytest.mark.parametrize(
    "cfg,builder",
    [
        (BASE, build_lm),
        (BASE.replace(recompute_attention="scores"), build_lm),
        (BASE.replace(recompute_attention="block", recompute_ffn="block"), build_lm),
        (BASE.replace(recompute_attention="scores"), build_encoder_decoder),
        # The experts' capacity is not proportional to the batch.
        (BASE.replace(experts=4, shardable_slots=True), build_lm),
    ],
)
def test_a_stack_resized_to_another_batch_is_the_stack_made_afresh(cfg, builder):
    reference = LayerStack(*[_analysis(cfg, k, builder) for k in (2, 3, 4)])
    for batch in (2, 8, 12):
        other = cfg.replace(batch=batch)
        two, three, four = (_analysis(other, k, builder) for k in (2, 3, 4))
        fresh = LayerStack(two, three, four)
        # With its 3-layer graph, and without (its rows scaled from the
        # reference's 3-layer graph's by the 2-layer graphs' factors).
        for resized in (reference.resized(two, three), reference.resized(two)):
            assert resized.tensor_classes == fresh.tensor_classes
            assert resized.unit_steps == fresh.unit_steps
            assert (resized.row_base == fresh.row_base).all()
            assert (resized.row_step == fresh.row_step).all()
            # What a further resize scales: the new 3-layer graph's own.
            assert (resized._three_rows == fresh._three_rows).all()
            assert (resized._three_bytes == fresh._three_bytes).all()
            # Another batch: other bytes, so the rows are really the new graphs'.
            assert not (resized.row_base == reference.row_base).all()
            got, want = resized.analysis(7), _analysis(other, 7, builder)
            assert {(c.unit.signature, c.count) for c in got.unit_classes} == {
                (c.unit.signature, c.count) for c in want.unit_classes
            }


def test_resizing_refuses_graphs_that_are_not_the_reference_at_another_batch():
    reference = LayerStack(*[_analysis(BASE, k) for k in (2, 3, 4)])
    # Another recomputation: other ops.
    scores = BASE.replace(batch=8, recompute_attention="scores")
    with pytest.raises(StackingError, match="cost-unit classes differ"):
        reference.resized(*[_analysis(scores, k) for k in (2, 3)])
    # The same ops, one buffer alive one op longer: a row that is not the
    # reference's scaled (liveness the signatures do not see).
    two, three = (_analysis(BASE.replace(batch=8), k) for k in (2, 3))
    longer = copy.copy(two)
    end = list(two.memory.end)
    i = next(i for i, e in enumerate(end) if e + 1 < len(two.graph.operations))
    end[i] += 1
    longer.memory = dataclasses.replace(two.memory, end=tuple(end))
    for resized_with in ((three,), ()):
        with pytest.raises(StackingError, match="rows are not the reference's scaled"):
            reference.resized(longer, *resized_with)
    assert reference.resized(two, three).unit_steps == reference.unit_steps
    # The 3-layer graph of another stage.
    deeper = BASE.replace(batch=8)
    with pytest.raises(StackingError):
        reference.resized(_analysis(deeper, 2), _analysis(deeper, 4))


def test_op_keys_reuse_the_analyses_signatures_as_a_fresh_signer_gives_them():
    from cost_models.signatures import Signer
    from layout_planner.stacked import _op_keys

    analyses = [
        _analysis(BASE.replace(recompute_attention="scores"), k) for k in (2, 3)
    ]
    assert all(a.op_signatures for a in analyses)
    signer, ids = Signer(), {}
    fresh = [
        [ids.setdefault(signer.op(op), len(ids)) for op in a.graph.operations]
        for a in analyses
    ]
    assert _op_keys(analyses) == fresh


@pytest.mark.parametrize("shape", [(0, 3), (1, 4), (5, 0), (40, 3), (300, 12)])
def test_unique_rows_is_numpys_unique_over_rows(shape):
    from layout_planner.analysis import unique_rows

    rng = np.random.default_rng(sum(shape))
    # Few distinct values, negative ones too (a stack's per-layer steps), so
    # rows repeat and tie on their first columns.
    a = rng.integers(-3, 3, size=shape, dtype=np.int64) * 2**40
    got = unique_rows(a)
    want = np.unique(a, axis=0)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_resize_without_the_three_layer_graph_refuses_rows_that_do_not_scale(
    monkeypatch,
):
    reference = LayerStack(*[_analysis(BASE, k) for k in (2, 3, 4)])
    half = _analysis(BASE.replace(batch=2), 2)
    assert reference.resized(half) is not None
    # A 3-layer row that half the batch would make a fraction of a byte.
    odd = copy.copy(reference)
    odd._three_rows = reference._three_rows.copy()
    batch = [c for c, names in enumerate(reference.tensor_classes) if "batch" in names]
    row, column = next(
        (r, c) for r, c in np.argwhere(odd._three_rows > 0) if c in batch
    )
    odd._three_rows[row, column] += 1
    with pytest.raises(StackingError, match="do not scale exactly"):
        odd.resized(half)
    assert odd.resized(half, _analysis(BASE.replace(batch=2), 3)) is not None
    # A 3-layer graph the analysis would refuse as too large is built.
    import layout_planner.stacked as stacked

    limit = int(reference._three_bytes.sum()) // 2 + 1
    monkeypatch.setattr(stacked, "MAX_GRAPH_BYTES", limit)
    with pytest.raises(StackingError, match="may be too large"):
        reference.resized(_analysis(BASE.replace(batch=8), 2))


def test_a_stacks_three_and_four_layer_graphs_get_no_dimension_graph():
    """Stacking reads the 3- and 4-layer graphs' units and memory only: their
    dimension graphs are never made (docs/scale.md, "What keeps it this
    fast"); the 2-layer graph's is made when a problem asks, and is the one
    an eager build gives."""
    from layout_planner.dim_graph import DimensionGraph

    two, three, four = (_analysis(BASE, k) for k in (2, 3, 4))
    stacked = LayerStack(two, three, four).analysis(7)
    problem = LayoutProblem(stacked.graph, MESH, HW, stacked.outputs, analysis=stacked)
    assert problem.free_dims
    assert "dim_graph" in two.__dict__  # the stack's problem asked for it
    assert "dim_graph" not in three.__dict__
    assert "dim_graph" not in four.__dict__
    eager = DimensionGraph.from_graph(two.graph)
    assert two.dim_graph.names == eager.names
    assert two.dim_graph.tensor_conflicts() == eager.tensor_conflicts()
    assert [two.dim_graph.info(n) for n in eager.names] == [
        eager.info(n) for n in eager.names
    ]
