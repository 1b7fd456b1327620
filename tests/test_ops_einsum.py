"""einsum / matmul: values and gradients under every layout, and what they
communicate."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import MODEL_SPLIT, SPLIT_2D, check_op, lower

import mtf_core as mtf
from mtf_core.comm import CollectiveSpec

pytestmark = pytest.mark.tf

CASES = {
    # name: (input shapes, mtf function, the same in TensorFlow)
    "matmul_reduces_hidden": (
        ["batch:8,hidden:8", "hidden:8,out:4"],
        lambda x, w: mtf.matmul(x, w),
        lambda x, w: tf.einsum("bh,ho->bo", x, w),
    ),
    "explicit_transposed_output": (
        ["batch:8,hidden:8", "hidden:8,out:4"],
        lambda x, w: mtf.einsum([x, w], output_shape="out:4,batch:8"),
        lambda x, w: tf.einsum("bh,ho->ob", x, w),
    ),
    "outer_product_keeps_every_dim": (
        ["batch:8", "hidden:8,out:2"],
        lambda x, w: mtf.einsum([x, w], output_shape="hidden:8,batch:8,out:2"),
        lambda x, w: tf.einsum("b,ho->hbo", x, w),
    ),
    "shared_batch_dim_and_reduced_hidden": (
        ["batch:8,hidden:8,k:2", "batch:8,hidden:8"],
        lambda a, b: mtf.einsum([a, b], output_shape="batch:8,k:2"),
        lambda a, b: tf.einsum("bhk,bh->bk", a, b),
    ),
    "three_inputs": (
        ["batch:8,hidden:8", "hidden:8,out:4", "out:4"],
        lambda a, b, c: mtf.einsum([a, b, c], output_shape="batch:8"),
        lambda a, b, c: tf.einsum("bh,ho,o->b", a, b, c),
    ),
    "one_input_sums_and_transposes": (
        ["batch:8,hidden:8,out:2"],
        lambda a: mtf.einsum([a], output_shape="out:2,batch:8"),
        lambda a: tf.einsum("bho->ob", a),
    ),
    "implicit_output_keeps_dims_seen_once": (
        ["batch:8,hidden:8", "hidden:8,out:4"],
        lambda x, w: mtf.einsum(x, w),
        lambda x, w: tf.einsum("bh,ho->bo", x, w),
    ),
    # Mesh TensorFlow: with reduced_dims, every other input dim is kept
    "reduced_dims_keep_every_other_dim": (
        ["batch:8,hidden:8", "hidden:8,out:4"],
        lambda x, w: mtf.matmul(x, w, reduced_dims=["out:4"]),
        lambda x, w: tf.einsum("bh,ho->bh", x, w),
    ),
    "reduced_dims_by_name": (
        ["batch:8,hidden:8", "hidden:8,out:4"],
        lambda x, w: mtf.matmul(x, w, reduced_dims=["hidden"]),
        lambda x, w: tf.einsum("bh,ho->bo", x, w),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_einsum_and_its_gradient_do_not_depend_on_layout(
    devices: list[str], case: str
) -> None:
    shapes, mtf_fn, tf_fn = CASES[case]
    check_op(devices, shapes, mtf_fn, tf_fn)


def test_einsum_output_shape_and_flops() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "batch:8,hidden:16")
    w = mtf.zeros(mesh, "hidden:16,out:4")
    y = mtf.einsum([x, w], output_shape="batch:8,out:4")
    op = y.operation
    assert isinstance(op, mtf.Einsum)
    assert str(y.shape) == "batch:8,out:4" and y.dtype == "float32"
    assert op.reduced_dims == ["hidden"]
    assert op.flops() == 2 * 8 * 16 * 4
    assert op.splittable_dims() == {"batch", "hidden", "out"}


def _einsum_graph() -> tuple[mtf.Graph, mtf.Mesh, mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, "batch:8,hidden:16")
    w = mtf.placeholder(mesh, "hidden:16,out:4")
    return graph, mesh, x, w, mtf.einsum([x, w], output_shape="batch:8,out:4")


def test_einsum_with_split_reduced_dim_allreduces_once_over_model(
    devices: list[str],
) -> None:
    graph, mesh, x, w, y = _einsum_graph()
    rng = np.random.RandomState(0)
    xv = rng.randn(8, 16).astype(np.float32)
    wv = rng.randn(16, 4).astype(np.float32)
    (got,), lowering = lower(graph, mesh, MODEL_SPLIT, devices, [y], {x: xv, w: wv})
    np.testing.assert_allclose(got, xv @ wv, rtol=1e-5, atol=1e-5)
    records = lowering.counters.collectives
    # each device holds a partial [batch:8, out:4] float32 sum: 128 bytes
    assert [(r.kind, r.mesh_axes, r.bytes_per_device) for r in records] == [
        ("allreduce", ("model",), 8 * 4 * 4)
    ]
    assert records[0].op_name == y.operation.name
    assert records[0].reduction == "SUM"
    assert lowering.counters["allreduce/model/Einsum"] == 128


def test_einsum_communication_matches_what_lowering_records(
    devices: list[str],
) -> None:
    graph, mesh, x, w, y = _einsum_graph()
    feeds = {x: np.ones((8, 16), np.float32), w: np.ones((16, 4), np.float32)}
    op = y.operation
    for case, want in [
        (MODEL_SPLIT, [CollectiveSpec("allreduce", ("model",), 128, pending=True)]),
        # batch on data:2 halves the partial sums each device reduces
        (SPLIT_2D, [CollectiveSpec("allreduce", ("model",), 64, pending=True)]),
    ]:
        impl = case.impl(devices)
        assert op.communication(impl.ctx) == want
        _, lowering = lower(graph, mesh, case, devices, [y], feeds)
        recorded = [
            (r.kind, r.mesh_axes, r.bytes_per_device)
            for r in lowering.counters.collectives
        ]
        assert recorded == [(s.kind, s.mesh_axes, s.bytes_per_device) for s in want]


def test_einsum_with_only_kept_dims_split_communicates_nothing(
    devices: list[str],
) -> None:
    graph, mesh, x, w, y = _einsum_graph()
    case = type(MODEL_SPLIT)("out_split", "model:4", "batch:model")
    feeds = {x: np.ones((8, 16), np.float32), w: np.ones((16, 4), np.float32)}
    (got,), lowering = lower(graph, mesh, case, devices, [y], feeds)
    np.testing.assert_array_equal(got, np.full((8, 4), 16.0, np.float32))
    assert lowering.counters.collectives == []
    assert y.operation.communication(case.impl(devices).ctx) == []
    # the work is divided four ways
    assert lowering.counters.flops_per_device[y.operation.name] == 2 * 8 * 16 * 4 / 4
