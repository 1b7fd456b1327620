"""Reductions, softmax and broadcast: values and gradients under every layout,
and the allreduces they issue."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import BATCH_SPLIT, MODEL_SPLIT, SPLIT_2D, check_op, lower

import mtf_core as mtf
from mtf_core.comm import CollectiveSpec

pytestmark = pytest.mark.tf

X = "batch:8,hidden:8,k:2"

CASES = {
    # name: (mtf function of x [batch, hidden, k], the same in TensorFlow)
    "sum_over_hidden": (
        lambda x: mtf.reduce_sum(x, reduced_dim="hidden"),
        lambda x: tf.reduce_sum(x, 1),
    ),
    "sum_over_batch_and_hidden": (
        lambda x: mtf.reduce_sum(x, output_shape="k:2"),
        lambda x: tf.reduce_sum(x, [0, 1]),
    ),
    "sum_to_scalar": (mtf.reduce_sum, tf.reduce_sum),
    "sum_with_transposed_output": (
        lambda x: mtf.reduce_sum(x, output_shape="k:2,batch:8"),
        lambda x: tf.transpose(tf.reduce_sum(x, 1)),
    ),
    "sum_over_a_list_of_dims": (
        lambda x: mtf.reduce_sum(x, reduced_dim=["batch:8", "k"]),
        lambda x: tf.reduce_sum(x, [0, 2]),
    ),
    "mean_over_hidden": (
        lambda x: mtf.reduce_mean(x, reduced_dim=mtf.Dimension("hidden", 8)),
        lambda x: tf.reduce_mean(x, 1),
    ),
    "mean_over_batch": (
        lambda x: mtf.reduce_mean(x, output_shape="hidden:8,k:2"),
        lambda x: tf.reduce_mean(x, 0),
    ),
    "max_over_hidden": (
        lambda x: mtf.reduce_max(x, reduced_dim="hidden"),
        lambda x: tf.reduce_max(x, 1),
    ),
    "max_over_batch_and_hidden": (
        lambda x: mtf.reduce_max(x, output_shape="k:2"),
        lambda x: tf.reduce_max(x, [0, 1]),
    ),
    "min_over_hidden": (
        lambda x: mtf.reduce_min(x, reduced_dim="hidden"),
        lambda x: tf.reduce_min(x, 1),
    ),
    "logsumexp_over_hidden": (
        lambda x: mtf.reduce_logsumexp(x, reduced_dim="hidden"),
        lambda x: tf.reduce_logsumexp(x, 1),
    ),
    "softmax_over_hidden": (
        lambda x: mtf.softmax(x, reduced_dim="hidden"),
        lambda x: tf.nn.softmax(x, axis=1),
    ),
    "softmax_over_batch": (
        lambda x: mtf.softmax(x, reduced_dim="batch"),
        lambda x: tf.nn.softmax(x, axis=0),
    ),
    "log_softmax_over_hidden": (
        lambda x: mtf.log_softmax(x, reduced_dim="hidden"),
        lambda x: tf.nn.log_softmax(x, axis=1),
    ),
    "softmax_with_extra_logit": (
        lambda x: mtf.softmax(x, reduced_dim="hidden", extra_logit=0.5),
        lambda x: (
            tf.exp(x) / (tf.reduce_sum(tf.exp(x), axis=1, keepdims=True) + tf.exp(0.5))
        ),
    ),
    "log_softmax_with_extra_logit": (
        lambda x: mtf.log_softmax(x, reduced_dim="hidden", extra_logit=3.0),
        lambda x: (
            x
            - tf.math.log(tf.reduce_sum(tf.exp(x), axis=1, keepdims=True) + tf.exp(3.0))
        ),
    ),
    "broadcast_adds_a_dim": (
        lambda x: mtf.broadcast(x, "batch:8,out:3,hidden:8,k:2"),
        lambda x: tf.broadcast_to(x[:, None], [8, 3, 8, 2]),
    ),
    "transpose_reorders_dims": (
        lambda x: mtf.transpose(x, "k:2,hidden:8,batch:8"),
        lambda x: tf.transpose(x, [2, 1, 0]),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reduction_and_its_gradient_do_not_depend_on_layout(
    devices: list[str], case: str
) -> None:
    mtf_fn, tf_fn = CASES[case]
    check_op(devices, [X], mtf_fn, tf_fn)


def test_reduce_any_and_all_over_split_dims(devices: list[str]) -> None:
    b = np.random.RandomState(1).rand(8, 8, 2) > 0.8
    b[3] = True
    for mtf_fn, tf_fn in [
        (mtf.reduce_any, tf.reduce_any),
        (mtf.reduce_all, tf.reduce_all),
    ]:
        check_op(
            devices,
            [X],
            lambda x, f=mtf_fn: f(x, output_shape="batch:8"),
            lambda x, f=tf_fn: f(x, [1, 2]),
            values=[b],
        )


def test_reduce_to_own_shape_is_a_no_op_and_same_dims_transpose() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "a:2,b:3")
    assert mtf.reduce_sum(x, output_shape="a:2,b:3") is x
    t = mtf.reduce_sum(x, output_shape="b:3,a:2")
    assert t.operation.op_type == "Broadcast" and str(t.shape) == "b:3,a:2"
    op = mtf.reduce_sum(x, reduced_dim="b").operation
    assert op.flops() == 6 and op.attrs() == {"reduction": "SUM"}


def _max_graph() -> tuple[mtf.Graph, mtf.Mesh, mtf.Tensor, mtf.Tensor]:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    return graph, mesh, x, mtf.reduce_max(x, reduced_dim="hidden")


def test_reduce_max_over_a_split_dim_issues_a_max_allreduce(devices: list[str]) -> None:
    graph, mesh, x, y = _max_graph()
    xv = np.random.RandomState(2).randn(8, 8).astype(np.float32)
    (got,), lowering = lower(graph, mesh, SPLIT_2D, devices, [y], {x: xv})
    np.testing.assert_array_equal(got, xv.max(axis=1))
    records = lowering.counters.collectives
    # batch:8 on data:2 leaves 4 floats per device to reduce over model
    assert [
        (r.kind, r.mesh_axes, r.reduction, r.bytes_per_device) for r in records
    ] == [("allreduce", ("model",), "MAX", 16)]
    assert y.operation.communication(SPLIT_2D.impl(devices).ctx) == [
        CollectiveSpec("allreduce", ("model",), 16, pending=False, reduction="MAX")
    ]


def test_reduce_max_over_an_unsplit_dim_communicates_nothing(
    devices: list[str],
) -> None:
    graph, mesh, x, y = _max_graph()
    xv = np.random.RandomState(3).randn(8, 8).astype(np.float32)
    (got,), lowering = lower(graph, mesh, BATCH_SPLIT, devices, [y], {x: xv})
    np.testing.assert_array_equal(got, xv.max(axis=1))
    assert lowering.counters.collectives == []


def test_softmax_over_a_split_dim_allreduces_a_max_then_a_sum(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y = mtf.softmax(x, reduced_dim="hidden")
    xv = np.random.RandomState(4).randn(8, 8).astype(np.float32)
    (got,), lowering = lower(graph, mesh, MODEL_SPLIT, devices, [y], {x: xv})
    np.testing.assert_allclose(got, tf.nn.softmax(xv).numpy(), rtol=1e-5)
    kinds = [(r.kind, r.reduction, r.mesh_axes) for r in lowering.counters.collectives]
    assert kinds == [("allreduce", "MAX", ("model",)), ("allreduce", "SUM", ("model",))]
    assert lowering.counters["allreduce/model/Reduce"] == 2 * 8 * 4


def test_softmax_extra_logit_must_be_a_number_or_a_tensor() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, "a:4,b:3")
    with pytest.raises(mtf.ArgumentError, match="extra_logit 'big'"):
        mtf.softmax(x, "b", extra_logit="big")
    extra = mtf.zeros(mesh, "a:4")  # a tensor of the output's dims is fine
    y = mtf.softmax(x, "b", extra_logit=extra)
    assert y.shape == x.shape


def test_softmax_extra_logit_takes_numpy_numbers_and_checks_tensor_dims() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, "a:4,b:3")
    assert mtf.softmax(x, "b", extra_logit=np.float32(0.5)).shape == x.shape
    with pytest.raises(mtf.ShapeError, match="extra_logit .*c:2"):
        mtf.softmax(x, "b", extra_logit=mtf.zeros(mesh, "a:4,c:2"))
