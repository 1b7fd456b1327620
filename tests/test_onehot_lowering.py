"""einsum with a one_hot input lowers as a gather / segment sum: the same values,
collectives and flops as the plain tf.einsum under every layout, and no
TensorFlow Einsum left for it in the traced graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from layout_cases import (
    LayoutCase,
    assert_close,
    assert_communication_as_recorded,
    collective_specs,
    lower,
    upstream_for,
    weighted_sum,
)

import mtf_core as mtf
from mtf_core.ops import einsum as einsum_module

pytestmark = pytest.mark.tf

BATCH, LENGTH, VOCAB, D = 8, 4, 16, 8

LAYOUTS = (
    LayoutCase("one_device", "all:1", ""),
    LayoutCase("batch_split", "data:4", "batch:data"),
    LayoutCase("vocab_split", "model:4", "vocab:model"),
    LayoutCase("d_model_split", "model:4", "d_model:model"),
    LayoutCase("split_2d", "data:2;model:4", "batch:data;vocab:model"),
    LayoutCase("split_2d_length_d", "data:2;model:4", "length:data;d_model:model"),
)
LAYOUT_IDS = [c.name for c in LAYOUTS]


def _dims(spec: str) -> list[mtf.Dimension]:
    return list(mtf.convert_to_shape(spec).dims)


def _embedding(x: Any, ids: Any) -> Any:
    """The LM's embedding: [batch, length, vocab] x [vocab, d_model]."""
    hot = mtf.one_hot(ids, x.shape.get_dim_by_name("vocab"))
    return mtf.einsum([hot, x], output_shape=ids.shape + _dims(f"d_model:{D}"))


def _embedding_other_first(x: Any, ids: Any) -> Any:
    hot = mtf.one_hot(ids, x.shape.get_dim_by_name("vocab"))
    return mtf.einsum(
        [x, hot], output_shape=_dims(f"d_model:{D}") + list(ids.shape.dims)
    )


def _segment_sum(x: Any, ids: Any) -> Any:
    """The embedding gradient's einsum: the vocab dim is an output dim."""
    hot = mtf.one_hot(ids, f"vocab:{VOCAB}")
    return mtf.einsum([x, hot], output_shape=_dims(f"d_model:{D},vocab:{VOCAB}"))


def _per_batch_table(x: Any, ids: Any) -> Any:
    """A lookup with a dim shared by the ids and the table (gather batch_dims)."""
    hot = mtf.one_hot(ids, x.shape.get_dim_by_name("vocab"))
    return mtf.einsum([hot, x], output_shape=ids.shape + _dims(f"d_model:{D}"))


def _pick_logit(x: Any, ids: Any) -> Any:
    """Cross entropy's ``sum(logits * one_hot(targets))`` written as an einsum."""
    hot = mtf.one_hot(ids, x.shape.get_dim_by_name("vocab"))
    return mtf.einsum([x, hot], output_shape=ids.shape)


# name: (shape of x, the graph, how many einsums take the lookup path
# (the forward one and, where it has that shape, its gradient wrt x))
CASES: dict[str, tuple[str, Callable[[Any, Any], Any], int]] = {
    "embedding": (f"vocab:{VOCAB},d_model:{D}", _embedding, 2),
    "embedding_other_first": (f"vocab:{VOCAB},d_model:{D}", _embedding_other_first, 2),
    "segment_sum": (f"batch:{BATCH},length:{LENGTH},d_model:{D}", _segment_sum, 2),
    "per_batch_table": (
        f"batch:{BATCH},vocab:{VOCAB},d_model:{D}",
        _per_batch_table,
        1,
    ),
    "pick_logit": (f"batch:{BATCH},length:{LENGTH},vocab:{VOCAB}", _pick_logit, 1),
}


def _ids_value(rng: np.random.RandomState) -> np.ndarray:
    ids = rng.randint(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    ids[0, :3] = [-1, VOCAB, VOCAB + 3]  # out of range: a row of zeros
    ids[1, :] = 5  # repeated ids: the segment sum adds several rows
    return ids


def _build(case: str, constants: bool = False) -> tuple[Any, ...]:
    """The case's graph: ``[y, d(loss)/dx]``, with ``x`` and the ids fed as
    placeholders (their values returned as feeds) or, if ``constants``,
    imported as constants (no feeds)."""
    x_shape, fn, _ = CASES[case]
    rng = np.random.RandomState(0)
    xv = rng.randn(*mtf.convert_to_shape(x_shape).to_integer_list())
    xv = xv.astype(np.float32)
    idv = _ids_value(rng)
    ids_shape = f"batch:{BATCH},length:{LENGTH}"
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    if constants:
        x = mtf.import_tf_tensor(mesh, xv, x_shape)
        ids = mtf.import_tf_tensor(mesh, idv, ids_shape)
        feeds = {}
    else:
        x = mtf.placeholder(mesh, x_shape)
        ids = mtf.placeholder(mesh, ids_shape, dtype="int32")
        feeds = {x: xv, ids: idv}
    y = fn(x, ids)
    (dx,) = mtf.gradients([weighted_sum(y, upstream_for(y, rng))], [x])
    return graph, mesh, [y, dx], feeds


def _no_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes every einsum built from now on take the plain tf.einsum path."""
    monkeypatch.setattr(einsum_module, "plan_onehot_einsum", lambda *a: None)


def _is_lookup(op: Any) -> bool:
    return isinstance(op, mtf.Einsum) and op.onehot_plan is not None


def _lookups(graph: mtf.Graph) -> int:
    return sum(_is_lookup(op) for op in graph.operations)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_lookup_lowering_equals_plain_einsum_with_the_same_collectives(
    devices: list[str], monkeypatch: pytest.MonkeyPatch, case: str, layout: LayoutCase
) -> None:
    graph, mesh, outs, feeds = _build(case)
    assert _lookups(graph) == CASES[case][2]
    got, lowering = lower(graph, mesh, layout, devices, outs, feeds)

    _no_lookup(monkeypatch)
    p_graph, p_mesh, p_outs, p_feeds = _build(case)
    assert _lookups(p_graph) == 0
    want, plain = lower(p_graph, p_mesh, layout, devices, p_outs, p_feeds)
    (reference, ref_grad), _ = lower(
        p_graph, p_mesh, LAYOUTS[0], devices, p_outs, p_feeds
    )

    for name, g, w, r in zip(["value", "gradient"], got, want, [reference, ref_grad]):
        assert_close(g, w, err_msg=f"{name} under {layout.name} differs from einsum")
        assert_close(g, r, err_msg=f"{name} under {layout.name} differs from 1 device")
    assert np.abs(got[0]).sum() > 0 and np.abs(got[1]).sum() > 0
    assert collective_specs(lowering.counters.collectives) == collective_specs(
        plain.counters.collectives
    )
    # flops are the einsum's either way (what the cost model predicts)
    flops = lowering.counters.flops_per_device
    assert flops == plain.counters.flops_per_device
    assert all(flops[op.name] > 0 for op in graph.operations if _is_lookup(op))


def test_out_of_range_ids_give_zero_rows_and_add_nothing(devices: list[str]) -> None:
    graph, mesh, outs, feeds = _build("embedding")
    x, ids = feeds
    (y, dx), _ = lower(graph, mesh, LAYOUTS[4], devices, outs, feeds)
    table, idv = feeds[x], feeds[ids]
    np.testing.assert_array_equal(y[0, :3], np.zeros((3, D), np.float32))
    np.testing.assert_array_equal(y[2:], table[idv[2:]])  # exact: a copy
    # rows of the table no in-range id names get no gradient
    unused = sorted(set(range(VOCAB)) - set(idv[(idv >= 0) & (idv < VOCAB)].ravel()))
    np.testing.assert_array_equal(dx[unused], np.zeros((len(unused), D), np.float32))


@pytest.mark.parametrize("case", sorted(CASES))
def test_cost_model_predicts_the_collectives_the_lookup_records(
    devices: list[str], case: str
) -> None:
    def build() -> tuple[mtf.Graph, mtf.Mesh, list[mtf.Tensor]]:
        graph, mesh, outs, _ = _build(case, constants=True)
        return graph, mesh, outs

    recorded = assert_communication_as_recorded(devices, build, LAYOUTS)
    assert recorded["one_device"] == []
    if case == "embedding":
        # the lookup over a split vocab leaves one pending allreduce over
        # model of the [batch/2, length, d_model] float32 result; the table's
        # gradient sums over the split batch: one allreduce over data
        spec = recorded["split_2d"]
        assert ("allreduce", ("model",), BATCH // 2 * LENGTH * D * 4) in spec
        assert ("allreduce", ("data",), VOCAB // 4 * D * 4) in spec


def _traced_op_types(
    devices: list[str], layout: LayoutCase, graph: mtf.Graph, mesh: mtf.Mesh, outs: Any
) -> list[str]:
    import tensorflow as tf

    impl = mtf.PlacementMeshImpl(
        layout.mesh_shape, layout.rules, devices[: layout.n_devices]
    )

    @tf.function(autograph=False)
    def run() -> list[Any]:
        lowering = mtf.Lowering(graph, {mesh: impl}, targets=outs)
        return [lowering.export_to_tf_tensor(t) for t in outs]

    return [op.type for op in run.get_concrete_function().graph.get_operations()]


def test_traced_embedding_and_its_gradient_have_no_einsum(
    devices: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = LAYOUTS[4]
    graph, mesh, outs, _ = _build("embedding", constants=True)
    types = _traced_op_types(devices, layout, graph, mesh, outs)
    assert "Einsum" not in types
    assert types.count("GatherV2") == 8  # forward: one per device
    assert types.count("UnsortedSegmentSum") == 8  # gradient wrt the table

    _no_lookup(monkeypatch)
    graph, mesh, outs, _ = _build("embedding", constants=True)
    types = _traced_op_types(devices, layout, graph, mesh, outs)
    assert types.count("Einsum") == 16 and "UnsortedSegmentSum" not in types


def _hot(idv: np.ndarray, on: float = 1.0, off: float = 0.0) -> np.ndarray:
    return np.where(np.arange(VOCAB) == idv[..., None], on, off).astype(np.float32)


FALLBACKS = {
    # name: (mtf graph of (ids, x), numpy of (ids, x))
    "on_off_values": (
        lambda i, x: mtf.einsum(
            [mtf.one_hot(i, f"vocab:{VOCAB}", on_value=2.0, off_value=0.5), x],
            output_shape=f"batch:{BATCH},length:{LENGTH},d_model:{D}",
        ),
        lambda i, x: np.einsum("blv,vd->bld", _hot(i, 2.0, 0.5), x),
    ),
    "three_inputs": (
        lambda i, x: mtf.einsum(
            [mtf.one_hot(i, f"vocab:{VOCAB}"), x, mtf.ones(x.mesh, f"d_model:{D}")],
            output_shape=f"batch:{BATCH},length:{LENGTH}",
        ),
        lambda i, x: np.einsum("blv,vd->bl", _hot(i), x),
    ),
    "extra_reduced_dim": (
        lambda i, x: mtf.einsum(
            [mtf.one_hot(i, f"vocab:{VOCAB}"), x],
            output_shape=f"batch:{BATCH},d_model:{D}",
        ),
        lambda i, x: np.einsum("blv,vd->bd", _hot(i), x),
    ),
}


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_other_one_hot_einsums_keep_the_plain_einsum(
    devices: list[str], case: str
) -> None:
    make, reference = FALLBACKS[case]
    rng = np.random.RandomState(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, f"vocab:{VOCAB},d_model:{D}")
    ids = mtf.placeholder(mesh, f"batch:{BATCH},length:{LENGTH}", dtype="int32")
    y = make(ids, x)
    assert y.operation.onehot_plan is None
    idv = _ids_value(rng)
    xv = rng.randn(VOCAB, D).astype(np.float32)
    (got,), _ = lower(graph, mesh, LAYOUTS[4], devices, [y], {x: xv, ids: idv})
    np.testing.assert_allclose(got, reference(idv, xv), rtol=2e-5, atol=2e-5)


def test_plan_kinds_follow_the_einsum_shape() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.zeros(mesh, "batch:2,length:3", "int32")
    hot = mtf.one_hot(ids, "vocab:5")
    emb = mtf.zeros(mesh, "vocab:5,d_model:4")
    dy = mtf.zeros(mesh, "batch:2,length:3,d_model:4")
    fwd = mtf.einsum([hot, emb], output_shape="length:3,d_model:4,batch:2")
    bwd = mtf.einsum([dy, hot], output_shape="d_model:4,vocab:5")
    plan = fwd.operation.onehot_plan
    assert plan is not None and (plan.kind, plan.hot, plan.other) == ("gather", 0, 1)
    assert plan.out_perm == (1, 2, 0)  # gather gives [batch, length, d_model]
    plan = bwd.operation.onehot_plan
    assert plan is not None and (plan.kind, plan.hot) == ("segment_sum", 1)
    assert plan.out_perm == (1, 0)  # the segment sum gives [vocab, d_model]
    # keeping an ids dim in the segment-sum output is not a plain segment sum
    kept = mtf.einsum([dy, hot], output_shape="batch:2,vocab:5,d_model:4")
    assert kept.operation.onehot_plan is None
    # an integer one-hot keeps the einsum
    ihot = mtf.one_hot(ids, "vocab:5", dtype="int32")
    iemb = mtf.zeros(mesh, "vocab:5,d_model:4", "int32")
    iy = mtf.einsum([ihot, iemb], output_shape="batch:2,length:3,d_model:4")
    assert iy.operation.onehot_plan is None


def _train_lm(
    devices: list[str], layout: LayoutCase, steps: int = 3
) -> tuple[list[float], dict[str, np.ndarray]]:
    """A tiny LM (embedding, output projection, cross entropy, SGD) compiled
    into one step under ``layout``; returns the losses and the variables."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.placeholder(mesh, f"batch:{BATCH},length:{LENGTH}", dtype="int32")
    vocab = mtf.Dimension("vocab", VOCAB)
    emb = mtf.get_variable(mesh, "emb", f"vocab:{VOCAB},d_model:{D}")
    w_out = mtf.get_variable(mesh, "w_out", f"d_model:{D},vocab:{VOCAB}")
    x = _embedding(emb, ids)
    logits = mtf.einsum([x, w_out], output_shape=ids.shape + [vocab])
    targets = mtf.one_hot(ids, vocab)
    loss = mtf.reduce_mean(
        mtf.layers.softmax_cross_entropy_with_logits(logits, targets, vocab)
    )
    params = [emb, w_out]
    grads = mtf.gradients([loss], params)
    updates = [mtf.assign(p, p - g * 0.5) for p, g in zip(params, grads)]
    impl = layout.impl(devices)
    step = mtf.compile_function(
        graph, {mesh: impl}, inputs=[ids], outputs=[loss], updates=updates
    )
    idv = np.random.RandomState(2).randint(0, VOCAB, (BATCH, LENGTH))
    losses = [float(step(idv.astype(np.int32))[0]) for _ in range(steps)]
    return losses, step.variables.to_dict()


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[4]], ids=["one", "2d"])
def test_compiled_training_with_lookups_matches_plain_einsum(
    devices: list[str], monkeypatch: pytest.MonkeyPatch, layout: LayoutCase
) -> None:
    losses, variables = _train_lm(devices, layout)
    assert losses[-1] < losses[0]  # it trains
    _no_lookup(monkeypatch)
    plain_losses, plain_variables = _train_lm(devices, layout)
    np.testing.assert_allclose(losses, plain_losses, rtol=2e-5, atol=2e-5)
    assert sorted(variables) == sorted(plain_variables)
    for name, value in variables.items():
        assert_close(value, plain_variables[name], err_msg=name)
