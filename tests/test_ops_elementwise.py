"""Elementwise ops: values and gradients under every layout, against TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import LAYOUTS, assert_same_under_layouts, check_op, lower

import mtf_core as mtf

pytestmark = pytest.mark.tf

X = "batch:8,hidden:8"

# mtf name -> the TensorFlow function it must match
UNARY = {
    "exp": tf.math.exp,
    "sqrt": tf.math.sqrt,
    "rsqrt": tf.math.rsqrt,
    "log": tf.math.log,
    "reciprocal": tf.math.reciprocal,
    "square": tf.math.square,
    "sigmoid": tf.math.sigmoid,
    "tanh": tf.math.tanh,
    "relu": tf.nn.relu,
    "negative": tf.math.negative,
    "abs": tf.math.abs,
    "sin": tf.math.sin,
    "cos": tf.math.cos,
    "softplus": tf.math.softplus,
    "silu": tf.nn.silu,
    "gelu": lambda x: tf.nn.gelu(x, approximate=True),
    "elu": tf.nn.elu,
    "selu": tf.nn.selu,
    "squared_relu": lambda x: tf.square(tf.nn.relu(x)),
    "leaky_relu": lambda x: tf.nn.leaky_relu(x, alpha=0.2),
    "identity": tf.identity,
}
POSITIVE_ONLY = {"sqrt", "rsqrt", "log", "reciprocal"}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_and_gradient_do_not_depend_on_layout(
    devices: list[str], name: str
) -> None:
    rng = np.random.RandomState(1)
    x = rng.randn(8, 8).astype(np.float32)
    if name in POSITIVE_ONLY:
        x = np.abs(x) + 0.5
    check_op(devices, [X], getattr(mtf, name), UNARY[name], values=[x])


@pytest.mark.parametrize("name", ["sign", "floor", "ceil", "round", "is_finite"])
def test_unary_ops_without_gradient_match_tensorflow(
    devices: list[str], name: str
) -> None:
    x = np.random.RandomState(2).randn(8, 8).astype(np.float32) * 3
    x[0, 0] = np.inf
    check_op(devices, [X], getattr(mtf, name), getattr(tf.math, name), [x], False)


BINARY = {
    "add": tf.math.add,
    "sub": tf.math.subtract,
    "multiply": tf.math.multiply,
    "divide": tf.math.divide,
    "minimum": tf.math.minimum,
    "maximum": tf.math.maximum,
    "pow": tf.math.pow,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_broadcasts_by_name_under_every_layout(
    devices: list[str], name: str
) -> None:
    """[batch, hidden] op [hidden, out] -> [batch, hidden, out]."""
    rng = np.random.RandomState(3)
    a = rng.uniform(0.5, 2.0, (8, 8)).astype(np.float32)
    b = rng.uniform(0.5, 2.0, (8, 2)).astype(np.float32)
    if name in ("minimum", "maximum", "add", "sub", "multiply"):
        a, b = a - 1.2, b - 1.2  # signs mixed; no ties with these draws
    tf_fn = BINARY[name]
    check_op(
        devices,
        [X, "hidden:8,out:2"],
        getattr(mtf, name),
        lambda x, y: tf_fn(x[:, :, None], y[None, :, :]),
        values=[a, b],
    )


@pytest.mark.parametrize(
    ("left", "right", "out"),
    [
        ("b:3", "a:2,b:3", "a:2,b:3"),  # the shorter first: the longer's order
        ("a:2,b:3", "b:3", "a:2,b:3"),
        ("a:2", "a:2,b:3", "a:2,b:3"),
        ("b:3,a:2", "a:2,b:3", "b:3,a:2"),  # neither in the other's order
        ("a:2", "b:3", "a:2,b:3"),
        ("c:4,a:2", "b:3,c:4", "c:4,a:2,b:3"),
    ],
)
def test_a_broadcast_orders_its_dims_as_mesh_tf_does(
    left: str, right: str, out: str
) -> None:
    # Mesh TF's _infer_binary_broadcast_shape: the shape whose dims hold the
    # other's in order, else the first's dims and the second's new ones.
    m = mtf.Mesh(mtf.Graph(), "m")
    x, y = mtf.zeros(m, left), mtf.zeros(m, right)
    for z in (x + y, x * y, mtf.maximum(x, y), mtf.add_n([x, y])):
        assert z.shape == mtf.convert_to_shape(out)
    assert mtf.where(mtf.greater(x, y), x, y).shape == mtf.convert_to_shape(out)


def test_a_bias_added_first_keeps_the_tensors_order_through_a_reshape(
    devices: list[str],
) -> None:
    # [b] + [a, b] was [b, a], so the reshape below read the sum transposed.
    m = mtf.Mesh(mtf.Graph(), "m")
    x = mtf.import_tf_tensor(m, tf.reshape(tf.range(6.0), [2, 3]), "a:2,b:3")
    bias = mtf.import_tf_tensor(m, tf.constant([10.0, 20.0, 30.0]), "b:3")
    flat = mtf.reshape(bias + x, "ab:6")
    lowering = mtf.Lowering(
        m.graph, {m: mtf.PlacementMeshImpl("x:2", "a:x", devices[:2])}
    )
    got = lowering.export_to_tf_tensor(flat).numpy().tolist()
    assert got == [10.0, 21.0, 32.0, 13.0, 24.0, 35.0]


def test_binary_op_with_explicit_output_shape_transposes(devices: list[str]) -> None:
    check_op(
        devices,
        [X, "batch:8"],
        lambda x, y: mtf.multiply(x, y, output_shape="hidden:8,batch:8"),
        lambda x, y: tf.transpose(x * y[:, None]),
    )


@pytest.mark.parametrize(
    ("expr", "tf_fn"),
    [
        (lambda x: x + 2.0, lambda x: x + 2.0),
        (lambda x: 2.0 - x, lambda x: 2.0 - x),
        (lambda x: x * 3.0, lambda x: x * 3.0),
        (lambda x: 1.0 / (x * x + 1.0), lambda x: 1.0 / (x * x + 1.0)),
        (lambda x: -x, lambda x: -x),
        (lambda x: 3.0 * x - x / 2.0, lambda x: 3.0 * x - x / 2.0),
    ],
    ids=["add", "rsub", "mul", "rdiv", "neg", "mixed"],
)
def test_python_scalars_combine_with_tensors(
    devices: list[str], expr: object, tf_fn: object
) -> None:
    check_op(devices, [X], expr, tf_fn)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal"],
)
def test_comparisons_broadcast_by_name_and_give_bool(
    devices: list[str], name: str
) -> None:
    rng = np.random.RandomState(4)
    a = rng.randint(0, 3, (8, 8)).astype(np.float32)
    b = rng.randint(0, 3, (8,)).astype(np.float32)
    tf_fn = getattr(tf.math, name)
    (y,) = check_op(
        devices,
        [X, "batch:8"],
        getattr(mtf, name),
        lambda x, z: tf_fn(x, z[:, None]),
        values=[a, b],
        grads=False,
    )
    assert y.dtype == np.bool_


def test_logical_ops_combine_bool_tensors(devices: list[str]) -> None:
    rng = np.random.RandomState(5)
    a, b = rng.rand(8, 8) > 0.5, rng.rand(8, 8) > 0.5
    check_op(
        devices,
        [X, X],
        lambda x, y: mtf.logical_or(mtf.logical_and(x, y), mtf.logical_not(y)),
        lambda x, y: np.logical_or(np.logical_and(x, y), np.logical_not(y)),
        values=[a, b],
    )


def test_where_selects_with_broadcast_condition(devices: list[str]) -> None:
    rng = np.random.RandomState(6)
    cond = rng.rand(8) > 0.5
    values = [cond, *rng.randn(2, 8, 8).astype(np.float32)]
    check_op(
        devices,
        ["batch:8", X, X],
        mtf.where,
        lambda c, x, y: tf.where(c[:, None], x, y),
        values=values,
    )


def test_where_broadcasts_values_and_takes_scalars(devices: list[str]) -> None:
    rng = np.random.RandomState(7)
    values = [rng.rand(8, 8) > 0.5, rng.randn(8).astype(np.float32)]
    check_op(
        devices,
        [X, "hidden:8"],
        lambda c, x: mtf.where(c, x, 0.5),
        lambda c, x: tf.where(c, tf.broadcast_to(x, [8, 8]), 0.5),
        values=values,
    )


def test_add_n_sums_any_number_of_tensors(devices: list[str]) -> None:
    check_op(
        devices,
        [X, X, X],
        lambda a, b, c: mtf.add_n([a, b, c]),
        lambda a, b, c: tf.add_n([a, b, c]),
    )


def test_cast_round_trips_and_its_gradient_passes_through(devices: list[str]) -> None:
    check_op(
        devices,
        [X],
        lambda x: mtf.cast(mtf.cast(x, tf.float16), "float32"),
        lambda x: tf.cast(tf.cast(x, tf.float16), tf.float32),
    )


def test_cast_from_int_has_no_gradient_but_a_value(devices: list[str]) -> None:
    xi = np.arange(64, dtype=np.int32).reshape(8, 8) - 30
    (y,) = check_op(
        devices,
        [X],
        lambda x: mtf.cast(x, mtf.float32) * 0.5,
        lambda x: tf.cast(x, tf.float32) * 0.5,
        values=[xi],
    )
    assert y.dtype == np.float32


def test_stop_gradient_blocks_only_its_path(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, X)
    y = mtf.reduce_sum(x * mtf.stop_gradient(x) + x)
    (dx,) = mtf.gradients([y], [x])
    xv = np.random.RandomState(8).randn(8, 8).astype(np.float32)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx], {x: xv})
    np.testing.assert_allclose(got, xv + 1.0, rtol=1e-6)


def test_elementwise_ops_never_communicate(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, X)
    b = mtf.placeholder(mesh, "hidden:8")
    y = mtf.where(mtf.greater(x, 0.0), mtf.tanh(x) * b, mtf.add_n([x, x, x]))
    (dx,) = mtf.gradients([mtf.cast(y, "float16")], [x])
    feeds = {x: np.ones((8, 8), np.float32), b: np.ones(8, np.float32)}
    for case in LAYOUTS:
        _, lowering = lower(graph, mesh, case, devices, [y, dx], feeds)
        assert lowering.counters.collectives == [], case.name
        ctx = case.impl(devices).ctx
        for op in graph.operations:
            # the unused gradient for b sums over batch: a reduction, not ours
            if op.op_type != "Reduce":
                assert op.communication(ctx) == [], op


def test_binary_output_shape_is_the_union_of_input_dims_in_order() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    a = mtf.zeros(mesh, "batch:2,hidden:3")
    b = mtf.zeros(mesh, "out:4,batch:2")
    assert str((a + b).shape) == "batch:2,hidden:3,out:4"
    assert str((b * a).shape) == "out:4,batch:2,hidden:3"
    assert (a + 1).shape == a.shape and (1 - a).dtype == "float32"
    assert mtf.greater(a, b).dtype == "bool"
    assert mtf.is_finite(a).dtype == "bool"
