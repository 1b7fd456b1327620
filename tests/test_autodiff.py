"""Reverse-mode autodiff in the mtf graph, and the layers built on it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import ONE_DEVICE, assert_same_under_layouts, lower

import mtf_core as mtf
from mtf_core.weight_handoff import provided_variables

pytestmark = pytest.mark.tf


def _mesh() -> tuple[mtf.Graph, mtf.Mesh]:
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "mesh")


# -- layers: dense, layer_norm, softmax cross entropy ---------------------------


def _classifier() -> tuple[mtf.Graph, mtf.Mesh, dict[str, mtf.Tensor], list]:
    """The MNIST-like network: dense+relu, layer_norm, dense, cross entropy."""
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,rows:4,cols:4")
    labels = mtf.placeholder(mesh, "batch:8,classes:4")
    h = mtf.layers.dense(
        x, "hidden:8", reduced_dims=["rows", "cols"], activation=mtf.relu, name="h"
    )
    h = mtf.layers.layer_norm(h, "hidden", name="ln")
    logits = mtf.layers.dense(h, "classes:4", name="out")
    xent = mtf.layers.softmax_cross_entropy_with_logits(logits, labels, "classes")
    loss = mtf.reduce_mean(xent)
    variables = list(graph.trainable_variables)
    grads = mtf.gradients([loss], variables)
    tensors = {"x": x, "labels": labels, "logits": logits, "xent": xent, "loss": loss}
    return graph, mesh, tensors, list(zip(variables, grads))


def _tf_classifier(
    x: np.ndarray, labels: np.ndarray, w: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The same network written directly in TensorFlow."""
    v = {k: tf.Variable(a) for k, a in w.items()}
    with tf.GradientTape() as tape:
        h = tf.nn.relu(tf.einsum("brc,rch->bh", x, v["h_kernel"]) + v["h_bias"])
        mean = tf.reduce_mean(h, 1, keepdims=True)
        var = tf.reduce_mean(tf.square(h - mean), 1, keepdims=True)
        h = (h - mean) * tf.math.rsqrt(var + 1e-6) * v["ln_scale"] + v["ln_bias"]
        logits = h @ v["out_kernel"] + v["out_bias"]
        xent = tf.nn.softmax_cross_entropy_with_logits(labels, logits)
        loss = tf.reduce_mean(xent)
    grads = tape.gradient(loss, v)
    return [logits.numpy(), xent.numpy(), loss.numpy()], {
        k: g.numpy() for k, g in grads.items()
    }


def test_layers_and_their_gradients_do_not_depend_on_layout(
    devices: list[str],
) -> None:
    graph, mesh, t, var_grads = _classifier()
    rng = np.random.RandomState(0)
    xv = rng.randn(8, 4, 4).astype(np.float32)
    labels = np.eye(4, dtype=np.float32)[rng.randint(0, 4, 8)]
    feeds = {t["x"]: xv, t["labels"]: labels}
    outputs = [t["logits"], t["xent"], t["loss"]] + [g for _, g in var_grads]
    got = assert_same_under_layouts(graph, mesh, devices, outputs, feeds)

    # the same network in plain TensorFlow, from the same initial weights
    _, lowering = lower(graph, mesh, ONE_DEVICE, devices, [t["loss"]], feeds)
    weights = lowering.variables.to_dict()
    assert sorted(weights) == [
        "h_bias",
        "h_kernel",
        "ln_bias",
        "ln_scale",
        "out_bias",
        "out_kernel",
    ]
    want_values, want_grads = _tf_classifier(xv, labels, weights)
    for a, b in zip(got[:3], want_values):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for (var, _), g in zip(var_grads, got[3:]):
        np.testing.assert_allclose(
            g, want_grads[var.name], rtol=1e-4, atol=1e-6, err_msg=var.name
        )


# -- gradients ---------------------------------------------------------------------


def test_a_tensor_used_twice_gets_the_sum_of_both_gradients(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y = mtf.reduce_sum(x * x + mtf.sin(x))
    (dx,) = mtf.gradients([y], [x])
    xv = np.random.RandomState(1).randn(8, 8).astype(np.float32)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx], {x: xv})
    np.testing.assert_allclose(got, 2 * xv + np.cos(xv), rtol=1e-5, atol=1e-6)


def test_gradients_of_several_ys_add_up(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y1 = mtf.reduce_sum(mtf.square(x), reduced_dim="hidden")
    y2 = mtf.reduce_sum(x * 3.0)
    (dx,) = mtf.gradients([y1, y2], [x])
    xv = np.random.RandomState(2).randn(8, 8).astype(np.float32)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx], {x: xv})
    np.testing.assert_allclose(got, 2 * xv + 3.0, rtol=1e-6)


def test_grad_ys_seed_the_backward_pass(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y = mtf.reduce_sum(x * 2.0, reduced_dim="hidden")
    seed = mtf.placeholder(mesh, "batch:8")
    (dx,) = mtf.gradients([y], [x], grad_ys=[seed])
    rng = np.random.RandomState(3)
    xv, sv = rng.randn(8, 8).astype(np.float32), rng.randn(8).astype(np.float32)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx], {x: xv, seed: sv})
    np.testing.assert_allclose(got, np.repeat(2 * sv[:, None], 8, 1), rtol=1e-6)


def test_unconnected_and_blocked_inputs_get_no_gradient() -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8")
    unused = mtf.placeholder(mesh, "batch:8")
    blocked = mtf.placeholder(mesh, "batch:8")
    y = mtf.reduce_sum(x * mtf.stop_gradient(blocked))
    dx, du, db = mtf.gradients([y], [x, unused, blocked])
    assert dx is not None and str(dx.shape) == "batch:8"
    assert du is None and db is None


def test_gradients_accept_variables_and_their_value_tensors() -> None:
    graph, mesh = _mesh()
    w = mtf.get_variable(mesh, "w", "hidden:4")
    y = mtf.reduce_sum(w * w)
    by_tensor, by_op = mtf.gradients([y], [w, w.operation])
    assert by_tensor is not None and by_op is not None
    # w * w: both factors' gradients reach w, summed once per requested x
    assert by_tensor.operation.inputs == by_op.operation.inputs
    assert len(by_tensor.operation.inputs) == 2
    with pytest.raises(mtf.GraphError, match="is not an mtf Tensor or Variable"):
        mtf.gradients([y], ["w"])


def test_gradient_graph_is_made_of_mtf_ops_on_the_same_mesh() -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,rows:4,cols:4")
    h = mtf.layers.dense(x, "hidden:8", reduced_dims=["rows", "cols"], name="h")
    loss = mtf.reduce_mean(mtf.square(mtf.layers.layer_norm(h, "hidden", name="ln")))
    variables = list(graph.trainable_variables)
    forward = list(graph.operations)
    grads = mtf.gradients([loss], variables)
    backward = graph.operations[len(forward) :]
    # The forward part is untouched; the backward pass was appended to it as
    # ops of this graph on this mesh, in an order where every input exists
    # before it is read (the order the lowering walks).
    assert graph.operations[: len(forward)] == forward and backward
    position = {id(op): i for i, op in enumerate(graph.operations)}
    for i, op in enumerate(graph.operations):
        assert op.mesh is mesh and op.graph is graph
        for t in op.inputs:
            assert position.get(id(t.operation), i) < i, (op, t)
    for var, g in zip(variables, grads, strict=True):
        assert g is not None and g.mesh is mesh, var.name
        assert g.operation in backward, var.name
        assert (g.shape, g.dtype) == (var.shape, var.dtype), var.name


def test_custom_gradient_replaces_autodiff(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")

    def forward(a: mtf.Tensor) -> mtf.Tensor:
        return mtf.square(a)

    def backward(output_grads: list, **_: object) -> list:
        return [output_grads[0] * 10.0]  # deliberately not the true derivative

    y = mtf.custom_gradient(forward, backward, [x])
    (dx,) = mtf.gradients([mtf.reduce_sum(y * 2.0)], [x])
    xv = np.random.RandomState(4).randn(8, 8).astype(np.float32)
    got_y, got_dx = assert_same_under_layouts(graph, mesh, devices, [y, dx], {x: xv})
    np.testing.assert_allclose(got_y, xv * xv, rtol=1e-6)
    np.testing.assert_allclose(got_dx, np.full((8, 8), 20.0), rtol=1e-6)


def test_recompute_grad_gives_the_same_gradients(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    w = mtf.get_variable(mesh, "w", "hidden:8,out:4")

    def block(a: mtf.Tensor, b: mtf.Tensor) -> mtf.Tensor:
        return mtf.tanh(mtf.einsum([a, b], output_shape="batch:8,out:4"))

    plain = mtf.reduce_sum(mtf.square(block(x, w)))
    again = mtf.reduce_sum(mtf.square(mtf.recompute_grad(block, [x, w])))
    grads = mtf.gradients([plain], [x, w]) + mtf.gradients([again], [x, w])
    xv = np.random.RandomState(5).randn(8, 8).astype(np.float32)
    got = assert_same_under_layouts(
        graph, mesh, devices, [plain, again, *grads], {x: xv}
    )
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
    for a, b in zip(got[2:4], got[4:6]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_recompute_grad_takes_a_block_that_makes_its_weights(
    devices: list[str],
) -> None:
    # Mesh TF's LayerStack(recompute_grads=True) recomputes layers that create
    # their weights inside fn; their gradients flow as without recomputation.
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")

    def block(a: mtf.Tensor) -> mtf.Tensor:
        h = mtf.layers.dense(a, "mid:8", activation=mtf.tanh, name="inner")
        return mtf.layers.dense(h, "out:4", name="outer")

    again = mtf.recompute_grad(block, [x])
    assert again.operation.op_type == "CustomGradient"
    variables = list(graph.trainable_variables)
    weights = [v.outputs[0] for v in variables]
    with provided_variables(graph, {v.name: v.outputs[0] for v in variables}):
        plain = block(x)  # the same weights, activations kept
    assert graph.trainable_variables == variables  # made once
    loss_again = mtf.reduce_sum(mtf.square(again))
    loss_plain = mtf.reduce_sum(mtf.square(plain))
    n_ops = len(graph.operations)
    g_again = mtf.gradients([loss_again], [x, *weights])
    einsums = sum(op.op_type == "Einsum" for op in graph.operations[n_ops:])
    g_plain = mtf.gradients([loss_plain], [x, *weights])
    assert all(g is not None for g in g_again)
    # The backward pass runs both forward einsums again, then the four of
    # their gradients (each einsum's input's and its kernel's).
    assert einsums == 2 + 4
    xv = np.random.RandomState(6).randn(8, 8).astype(np.float32)
    got = assert_same_under_layouts(
        graph, mesh, devices, [loss_again, loss_plain, *g_again, *g_plain], {x: xv}
    )
    n = len(g_again)
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
    for a, b in zip(got[2 : 2 + n], got[2 + n :]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_recompute_grad_keeps_the_forward_passs_dropout_masks(
    devices: list[str],
) -> None:
    # Random operations are not recomputed (as in Mesh TF): the copies read
    # the forward mask, so the gradient is that mask, scaled.
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y = mtf.recompute_grad(lambda a: mtf.layers.dropout(mtf.tanh(a), 0.5), [x])
    randoms = sum(op.op_type == "Random" for op in graph.operations)
    (dx,) = mtf.gradients([mtf.reduce_sum(y)], [x])
    assert sum(op.op_type == "Random" for op in graph.operations) == randoms == 1
    xv = np.random.RandomState(7).randn(8, 8).astype(np.float32)
    got_y, got_dx = lower(graph, mesh, ONE_DEVICE, devices, [y, dx], {x: xv})[0]
    kept = got_y != 0
    assert 0 < kept.sum() < kept.size
    expected = np.where(kept, 2.0 * (1.0 - np.tanh(xv) ** 2), 0.0)
    np.testing.assert_allclose(got_dx, expected, rtol=1e-5, atol=1e-6)


def test_custom_gradient_calls_grad_fn_as_mesh_tf_does(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    scale = mtf.placeholder(mesh, "hidden:8")  # read from outside fn
    seen: dict[str, list] = {}

    def fn(a: mtf.Tensor) -> mtf.Tensor:
        w = mtf.get_variable(mesh, "w", "hidden:8")
        return a * w * scale

    def grad_fn(
        explicit_inputs: list,
        all_inputs: list,
        forward_operations: list,
        outputs: list,
        output_grads: list,
    ) -> list:
        seen.update(explicit=explicit_inputs, all=all_inputs, ops=forward_operations)
        (dy,) = output_grads
        # deliberately not the true derivatives: dx = 3 dy, none for w, scale
        return [dy * 3.0, None, None]

    y = mtf.custom_gradient(fn, grad_fn, [x])
    (w,) = graph.trainable_variables
    dx, dw = mtf.gradients([mtf.reduce_sum(y)], [x, w])
    assert seen["explicit"] == [x]
    assert seen["all"] == [x, w.outputs[0], scale]  # fn's weight is an input
    assert [op.op_type for op in seen["ops"]] == ["Variable", "Binary", "Binary"]
    assert dw is None
    xv = np.random.RandomState(8).randn(8, 8).astype(np.float32)
    sv = np.arange(8, dtype=np.float32)
    feeds = {x: xv, scale: sv}
    got_y, got_dx = lower(graph, mesh, ONE_DEVICE, devices, [y, dx], feeds)[0]
    np.testing.assert_allclose(got_dx, np.full((8, 8), 3.0), rtol=1e-6)
    assert got_y.shape == (8, 8)


def test_custom_gradient_refuses_a_grad_fn_that_returns_too_few() -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    w = mtf.placeholder(mesh, "hidden:8")
    y = mtf.custom_gradient(lambda a: a * w, lambda **kw: [kw["output_grads"][0]], [x])
    with pytest.raises(mtf.GraphError, match="returned 1 gradient.*for 2 input"):
        mtf.gradients([mtf.reduce_sum(y)], [x])


def test_gradients_through_given_operations_only() -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    y = mtf.square(x)
    z = y * 2.0
    mul = z.operation  # through the multiply alone, the graph starts at y
    (dy,) = mtf.gradients([z], [y], operations=[mul])
    assert dy is not None
    assert mtf.gradients([z], [x], operations=[mul]) == [None]
    (dx,) = mtf.gradients([z], [x], operations=[y.operation, mul])
    assert dx is not None
    with pytest.raises(mtf.GraphError, match="operations holds 5"):
        mtf.gradients([z], [x], operations=[mul, 5])
    with pytest.raises(mtf.GraphError, match="expected a list of mtf Operations"):
        mtf.gradients([z], [x], operations=mul)


def test_clone_operations_copies_with_mapped_inputs(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    x2 = mtf.placeholder(mesh, "batch:8,hidden:8")
    out, ops = graph.capture_operations(lambda: mtf.reduce_sum(mtf.square(x) + x))
    copies, mapping = graph.clone_operations(ops, {x: x2})
    assert [op.op_type for op in copies] == [op.op_type for op in ops]
    assert {op.name for op in copies}.isdisjoint(op.name for op in ops)
    assert mapping[x] is x2 and mapping[out].operation is copies[-1]
    xv = np.ones((8, 8), np.float32)
    feeds = {x: xv, x2: 2 * xv}
    got = lower(graph, mesh, ONE_DEVICE, devices, [out, mapping[out]], feeds)[0]
    assert got[0] == pytest.approx(64 * 2.0) and got[1] == pytest.approx(64 * 6.0)
    other = mtf.placeholder(mesh, "batch:8")
    with pytest.raises(mtf.ShapeError, match="expected the same shape and dtype"):
        graph.clone_operations(ops, {x: other})
    with pytest.raises(mtf.GraphError, match="which is cloned; map only its inputs"):
        graph.clone_operations(ops, {x: x2, out: out})
    with pytest.raises(mtf.GraphError, match="is not an operation of this graph"):
        graph.clone_operations([x], {})


def test_constants_fn_reads_are_not_inputs_of_its_gradient() -> None:
    # A mask no gradient can reach (from constants, or from integer ids) is
    # read as it is: not one of all_inputs, so the backward pass computes no
    # gradient for it (the planner's graphs stay as they were).
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:8")
    ids = mtf.placeholder(mesh, "batch:8", dtype="int32")
    from_ids = mtf.cast(mtf.equal(ids, 0), "float32")
    bias = mtf.ones(mesh, "hidden:8") * 2.0
    scale = mtf.placeholder(mesh, "hidden:8")
    seen: dict[str, list] = {}

    def grad_fn(all_inputs: list, output_grads: list, **_: object) -> list:
        seen["all"] = all_inputs
        return [output_grads[0], None]

    y = mtf.custom_gradient(lambda a: (a + bias) * from_ids * scale, grad_fn, [x])
    mtf.gradients([mtf.reduce_sum(y)], [x])
    assert seen["all"] == [x, scale]


def test_a_copy_works_out_again_what_its_op_worked_out_from_its_inputs(
    devices: list[str],
) -> None:
    # An einsum with a one_hot input lowers as a lookup (its onehot_plan,
    # worked out once from its inputs); its copy reading an identity of the
    # one-hot tensor is a plain einsum, with the same values.
    graph, mesh = _mesh()
    ids = mtf.placeholder(mesh, "batch:4", dtype="int32")
    table = mtf.placeholder(mesh, "vocab:8,hidden:4")
    hot = mtf.one_hot(ids, mtf.Dimension("vocab", 8))
    looked_up = mtf.einsum([hot, table], output_shape="batch:4,hidden:4")
    assert looked_up.operation.onehot_plan is not None
    (copy,), mapping = graph.clone_operations(
        [looked_up.operation], {hot: mtf.identity(hot)}
    )
    assert copy.onehot_plan is None
    feeds = {
        ids: np.array([3, 0, 7, 3], np.int32),
        table: np.arange(32, dtype=np.float32).reshape(8, 4),
    }
    got = lower(
        graph, mesh, ONE_DEVICE, devices, [looked_up, mapping[looked_up]], feeds
    )[0]
    np.testing.assert_array_equal(got[0], feeds[table][[3, 0, 7, 3]])
    np.testing.assert_array_equal(got[1], got[0])
