"""Mesh TensorFlow's ``mtf.layers`` signatures on mtf_core: dense (experts,
renamed reduced dims, variable dtypes, initializers, given kernels),
dense_product, conv1d / separable_conv1d, pooling, batch_norm, attention
(Mesh TensorFlow's multihead_attention, dot_product_attention, local
attention) against NumPy / TensorFlow, under the 1-D, 2-D and replicated
layouts."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    ONE_DEVICE,
    LayoutCase,
    assert_communication_as_recorded,
    assert_same_under_layouts,
    lower,
)

import mtf_core as mtf
from mtf_core import layers
from mtf_core.ops.variables import as_variable

D = mtf.Dimension


def _graph():
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "mesh")


def _x(mesh, shape, seed=0, scale=1.0):
    arr = np.random.RandomState(seed).randn(
        *mtf.convert_to_shape(shape).to_integer_list()
    ).astype(np.float32) * np.float32(scale)
    return mtf.import_tf_tensor(mesh, arr, shape), arr


def _vars(low, graph):
    return {v.name: low.variables.export(v) for v in graph.all_variables}


# --------------------------------------------------------------------------
# dense and friends
# --------------------------------------------------------------------------


@pytest.mark.tf
def test_dense_with_expert_dims_and_a_new_dim_named_like_the_reduced_one(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,hidden:4")
    # new dim "hidden:4" equals the reduced one: Mesh TF renames the input's
    same = layers.dense(x, [D("hidden", 4)], reduced_dims=[D("hidden", 4)], name="sq")
    experts = layers.dense(
        x, [], reduced_dims=[], expert_dims=[D("hidden", 4)], name="ex", use_bias=False
    )
    assert same.shape == x.shape and experts.shape == x.shape
    assert as_variable(graph.all_variables[0].outputs[0]).shape == mtf.convert_to_shape(
        "_hidden:4,hidden:4"
    )
    got = assert_same_under_layouts(graph, mesh, devices, [same, experts])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [same])
    w = _vars(low, graph)
    np.testing.assert_allclose(got[0], xv @ w["sq_kernel"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], xv * w["ex_kernel"], rtol=1e-6)


def test_dense_variable_dtypes_follow_mesh_tensorflow():
    graph, mesh = _graph()
    x = mtf.zeros(mesh, "batch:2,d:4", dtype=mtf.bfloat16)
    y = layers.dense(x, "h:8", reduced_dims=["d"], name="d")
    kernel, bias = graph.all_variables
    # default: float32 master and slices, activations in x's dtype
    assert (kernel.master_dtype, kernel.slice_dtype, kernel.activation_dtype) == (
        "float32",
        "float32",
        "bfloat16",
    )
    assert y.dtype == "bfloat16" and bias.activation_dtype == "bfloat16"
    layers.dense(
        x,
        "h:8",
        reduced_dims=["d"],
        name="e",
        variable_dtype=mtf.VariableDType("bfloat16"),
    )
    assert graph.all_variables[-1].dtype == "bfloat16"


def test_variance_scaling_initializer_scales_by_fan_and_checks_its_arguments():
    init = layers.VarianceScalingInitializer(scale=2.0, mode="fan_avg")
    got = init([D("a", 6)], [D("b", 2)]).named("w")((400, 300))
    assert abs(got.std() - (2.0 / 4) ** 0.5 * 0.8796) < 0.01  # truncated at 2 sigma
    assert np.abs(got).max() <= 2 * (2.0 / 4) ** 0.5 + 1e-6
    uni = layers.VarianceScalingInitializer(distribution="uniform")([D("a", 3)], [])
    u = uni.named("u")((300, 100))
    assert np.abs(u).max() <= 1.0 + 1e-6 and abs(u.std() - 3**-0.5) < 0.01
    # deterministic by name, different across names
    np.testing.assert_array_equal(uni.named("u")((4,)), uni.named("u")((4,)))
    assert not np.array_equal(uni.named("u")((4,)), uni.named("v")((4,)))
    with pytest.raises(mtf.ConfigError, match="mode 'fan_sum' is unknown"):
        layers.VarianceScalingInitializer(mode="fan_sum")


def test_unit_scaling_convention_divides_contractions_and_unit_weights():
    graph, mesh = _graph()
    x = mtf.ones(mesh, "batch:2,d:16")
    try:
        assert layers.unit_scaling_convention(True)
        y = layers.us_einsum([x, x], output_shape="batch:2")
        init = layers.VarianceScalingInitializer()([D("d", 16)], [D("h", 4)])
        assert init.stddev == 1.0
        with pytest.raises(mtf.ConfigError, match="needs mode 'fan_in'"):
            layers.VarianceScalingInitializer(mode="fan_out")([D("d", 16)], [])
    finally:
        layers.unit_scaling_convention(False)
    assert not layers.unit_scaling_convention()
    # the scale is an mtf multiply by 16 ** -0.5 after the einsum
    assert y.operation.op_type != "Einsum"


@pytest.mark.tf
def test_dense_product_is_a_gated_linear_unit(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,d:4")
    y = layers.dense_product(
        x, [D("d", 4)], [D("hidden", 8)], ["linear", "sigmoid"], use_bias=False
    )
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    w = _vars(low, graph)
    a, b = xv @ w["dense_product_0_kernel"], xv @ w["dense_product_1_kernel"]
    np.testing.assert_allclose(got, a / (1 + np.exp(-b)), rtol=1e-5, atol=1e-6)


def test_dense_relu_dense_takes_mesh_tensorflows_is_training_and_dropout():
    graph, mesh = _graph()
    x = mtf.ones(mesh, "batch:2,d:4")
    layers.dense_relu_dense(x, D("hidden", 8), False, dropout=0.5)
    assert not any(op.op_type == "Random" for op in graph.operations)
    layers.dense_relu_dense(x, D("hidden", 8), True, dropout=0.5, name="t")
    assert any(op.op_type == "Random" for op in graph.operations)


# --------------------------------------------------------------------------
# convolution, pooling, batch norm
# --------------------------------------------------------------------------


@pytest.mark.tf
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv1d_matches_tensorflow(devices, padding):
    import tensorflow as tf

    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,length:6,hidden:4")
    y = layers.conv1d(x, D("out", 4), filter_size=3, padding=padding, name="c1")
    n = 6 if padding == "SAME" else 4
    assert y.shape == mtf.convert_to_shape(f"batch:8,length:{n},out:4")
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    f = _vars(low, graph)["c1_filters"]  # [1, 3, 4, 4]
    want = tf.nn.conv1d(xv, f[0], 1, padding).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.tf
def test_separable_conv1d_under_a_split_length_shifts_between_neighbours(devices):
    def build():
        graph, mesh = _graph()
        x, _ = _x(mesh, "batch:8,hidden:8,d:4")  # "hidden" is the length here
        return graph, mesh, layers.separable_conv1d(x, D("out", 3), -1, 1, name="sc")

    graph, mesh, y = build()
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    w = _vars(low, graph)
    xv = np.random.RandomState(0).randn(8, 8, 4).astype(np.float32)
    padded = np.pad(xv, ((0, 0), (1, 1), (0, 0)))
    depth = sum(
        padded[:, i : i + 8] * w[f"sc_depthwise_dense_{i}_kernel"] for i in range(3)
    )
    depth = depth + w["sc_depthwise_dense_0_bias"]
    want = depth @ w["sc_pointwise_dense_kernel"] + w["sc_pointwise_dense_bias"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    rec = assert_communication_as_recorded(devices, build)
    assert rec["one_device"] == []
    # the length split over "model" only costs neighbour exchanges on it
    assert rec["model_split"] and {r[1] for r in rec["model_split"]} == {("model",)}


@pytest.mark.tf
def test_pooling_matches_tensorflow_with_the_batch_split(devices):
    import tensorflow as tf

    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,h:4,w:6,hidden:8")
    ys = [
        layers.max_pool2d(x, (2, 3)),
        layers.avg_pool2d(x, (2, 2)),
        layers.max_pool2d(x, (1, 1)),
    ]
    assert ys[2] is x
    got = assert_same_under_layouts(graph, mesh, devices, ys[:2])
    np.testing.assert_allclose(
        got[0], tf.nn.max_pool2d(xv, (2, 3), (2, 3), "VALID").numpy(), rtol=1e-6
    )
    np.testing.assert_allclose(
        got[1], tf.nn.avg_pool2d(xv, 2, 2, "VALID").numpy(), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(mtf.ShapeError, match="window 4 does not divide .*w:6"):
        layers.avg_pool2d(x, (2, 4))


@pytest.mark.tf
def test_pooling_gradients_match_tensorflow(devices):
    import tensorflow as tf

    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,h:4,w:6,hidden:8")
    loss = mtf.reduce_sum(mtf.square(layers.max_pool2d(x, (2, 3)))) + mtf.reduce_sum(
        mtf.square(layers.avg_pool2d(x, (2, 2)))
    )
    (dx,) = mtf.gradients([loss], [x])
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx])
    xt = tf.constant(xv)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        want_loss = tf.reduce_sum(
            tf.square(tf.nn.max_pool2d(xt, (2, 3), (2, 3), "VALID"))
        ) + tf.reduce_sum(tf.square(tf.nn.avg_pool2d(xt, 2, 2, "VALID")))
    np.testing.assert_allclose(got, tape.gradient(want_loss, xt).numpy(), rtol=1e-5)


@pytest.mark.tf
def test_pool3d_matches_numpy(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,d:2,h:2,w:4,c:2")
    y = layers.avg_pool3d(x, (2, 2, 2))
    m = layers.max_pool3d(x, (1, 2, 2))
    got_y, got_m = assert_same_under_layouts(graph, mesh, devices, [y, m])
    np.testing.assert_allclose(
        got_y, xv.reshape(8, 1, 2, 1, 2, 2, 2, 2).mean((2, 4, 6)), rtol=1e-5
    )
    np.testing.assert_allclose(got_m, xv.reshape(8, 2, 1, 2, 2, 2, 2).max((3, 5)))


@pytest.mark.tf
def test_batch_norm_normalizes_over_the_batch_and_updates_moving_stats(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,hidden:8", scale=3.0)
    y, updates = layers.batch_norm(x, True, momentum=0.9, epsilon=1e-6, name="bn")
    y_eval, none = layers.batch_norm(x, False, momentum=0.9, name="bn_eval")
    assert len(updates) == 2 and none == []
    got, got_eval = assert_same_under_layouts(graph, mesh, devices, [y, y_eval])
    want = (xv - xv.mean(0)) / np.sqrt(xv.var(0) + 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    mean0 = layers.RandomInitializer("normal", 1.0).named("bn_moving_mean")((8,))
    for case in LAYOUTS:
        # an eager lowering of everything runs the two updates once
        low = mtf.Lowering(graph, {mesh: case.impl(devices)})
        v = _vars(low, graph)
        np.testing.assert_allclose(
            v["bn_moving_mean"], 0.9 * mean0 + 0.1 * xv.mean(0), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            v["bn_moving_variance"], 0.9 + 0.1 * xv.var(0), rtol=1e-4
        )
    # eval uses the (initial) moving statistics
    mean0 = v["bn_eval_moving_mean"]
    np.testing.assert_allclose(
        got_eval, (xv - mean0) / np.sqrt(1.0 + 1e-9), rtol=1e-5, atol=1e-5
    )


# --------------------------------------------------------------------------
# attention
# --------------------------------------------------------------------------


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


@pytest.mark.tf
def test_dot_product_attention_matches_numpy(devices):
    graph, mesh = _graph()
    q, qv = _x(mesh, "batch:8,hidden:8,length:4,d_k:2", 1)
    k, kv = _x(mesh, "batch:8,hidden:8,memory_length:5,d_k:2", 2)
    v, vv = _x(mesh, "batch:8,hidden:8,memory_length:5,d_v:3", 3)
    mask, mv = _x(mesh, "length:4,memory_length:5", 4)
    y = layers.dot_product_attention(q, k, v, mask, is_training=False)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    w = _softmax(np.einsum("bhld,bhmd->bhlm", qv, kv) + mv)
    np.testing.assert_allclose(
        got, np.einsum("bhlm,bhmv->bhlv", w, vv), rtol=1e-5, atol=1e-5
    )


@pytest.mark.tf
def test_mesh_tensorflow_multihead_attention_signature_matches_numpy(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,length:4,io:6")
    heads, kv = D("hidden", 4), D("d_kv", 2)
    y = layers.multihead_attention(
        x,
        memory_antecedent=None,
        mask=None,
        kv_channels=kv,
        heads=heads,
        is_training=False,
        name="mha",
    )
    assert y.shape == x.shape
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    wq, wk, wv, wo = _vars(low, graph)["mha_qkvo"]  # [heads, io, kv] each
    q = np.einsum("bli,hik->bhlk", xv, wq)
    k = np.einsum("bmi,hik->bhmk", xv, wk)
    v = np.einsum("bmi,hik->bhmk", xv, wv)
    o = np.einsum("bhlm,bhmk->bhlk", _softmax(np.einsum("bhlk,bhmk->bhlm", q, k)), v)
    np.testing.assert_allclose(
        got, np.einsum("bhlk,hik->bli", o, wo), rtol=1e-5, atol=1e-5
    )


@pytest.mark.tf
def test_masked_local_attention_1d_equals_banded_attention_under_length_split(
    devices,
):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:2,hidden:8,io:4")  # "hidden" is the length
    y = layers.masked_local_attention_1d(
        x, D("d_kv", 2), D("heads", 2), False, window_size=2, length_per_split=2
    )
    cases = [ONE_DEVICE, LayoutCase("length_split", "model:4", "hidden:model")]
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y], layouts=cases)
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    wq, wk, wv, wo = next(iter(_vars(low, graph).values()))
    q = np.einsum("bli,hik->bhlk", xv, wq)
    k = np.einsum("bmi,hik->bhmk", xv, wk)
    v = np.einsum("bmi,hik->bhmk", xv, wv)
    # keys and values of positions -2, -1 are zeros (Mesh TF leaves them
    # visible); position p sees memory positions (p - 2, p]
    k = np.pad(k, ((0, 0), (0, 0), (2, 0), (0, 0)))
    v = np.pad(v, ((0, 0), (0, 0), (2, 0), (0, 0)))
    logits = np.einsum("bhlk,bhmk->bhlm", q, k)
    p, m = np.arange(8)[:, None], np.arange(-2, 8)[None, :]
    visible = (m <= p) & (m > p - 2)
    w = _softmax(np.where(visible, logits, logits - 1e9))
    want = np.einsum("bhlk,hik->bli", np.einsum("bhlm,bhmk->bhlk", w, v), wo)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.tf
def test_attention_masks_and_local_block_bias(devices):
    graph, mesh = _graph()
    ids = mtf.import_tf_tensor(mesh, np.array([[3, 0, 2, 0]], np.int32), "b:1,length:4")
    pos = mtf.range(mesh, D("length", 4), mtf.int32)
    pad = layers.attention_mask_ignore_padding(ids)
    causal = layers.attention_mask_autoregressive(pos)
    seg = layers.attention_mask_same_segment(
        mtf.import_tf_tensor(mesh, np.array([1, 1, 2, 2], np.int32), "length:4")
    )
    local = layers.attention_bias_local_block(mesh, D("block", 2), D("memory", 4))
    assert pad.shape == mtf.convert_to_shape("b:1,memory_length:4")
    got = assert_same_under_layouts(graph, mesh, devices, [pad, causal, seg, local])
    np.testing.assert_array_equal(got[0], [[0, -1e9, 0, -1e9]])
    np.testing.assert_array_equal(got[1], np.triu(np.full((4, 4), -1e9), 1))
    np.testing.assert_array_equal(got[2][0], [0, 0, -1e9, -1e9])
    np.testing.assert_array_equal(got[3], [[0, 0, 0, -1e9], [0, 0, 0, 0]])


@pytest.mark.tf
def test_conv2d_with_blocks_is_the_same_conv_of_the_whole_image(devices):
    """Height cut into 4 blocks on a dim that the model layouts split: the
    halo exchange brings each block its neighbours' rows."""
    import tensorflow as tf

    graph, mesh = _graph()
    xv = np.random.RandomState(0).randn(8, 8, 6, 2).astype(np.float32)
    x = mtf.import_tf_tensor(
        mesh, xv.reshape(8, 4, 2, 6, 2), "batch:8,hidden:4,h:2,w:6,c:2"
    )
    y = layers.conv2d_with_blocks(
        x, D("out", 3), (3, 3), h_blocks_dim=D("hidden", 4), name="blk"
    )
    assert y.shape == mtf.convert_to_shape("batch:8,hidden:4,h:2,w:6,out:3")
    (dx,) = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x])
    got, got_dx = assert_same_under_layouts(graph, mesh, devices, [y, dx])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    f = _vars(low, graph)["blk_filters"]
    xt = tf.constant(xv)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        want = tf.nn.conv2d(xt, f, 1, "SAME")
        loss = tf.reduce_sum(tf.square(want))
    np.testing.assert_allclose(
        got.reshape(8, 8, 6, 3), want.numpy(), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        got_dx.reshape(8, 8, 6, 2),
        tape.gradient(loss, xt).numpy(),
        rtol=1e-4,
        atol=1e-4,
    )
    with pytest.raises(mtf.ShapeError, match="odd filter sizes"):
        layers.conv2d_with_blocks(x, D("out", 3), (2, 3), h_blocks_dim=D("hidden", 4))


@pytest.mark.tf
def test_conv3d_and_blocked_conv3d_match_tensorflow_with_gradients(devices):
    import tensorflow as tf

    graph, mesh = _graph()
    xv = np.random.RandomState(3).randn(8, 4, 4, 3, 2).astype(np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "batch:8,d:4,h:4,w:3,c:2")
    y = layers.conv3d(x, D("hidden", 8), (3, 3, 1), name="c3")
    # depth cut into 2 blocks of 2 along "d_blocks"
    xb = mtf.import_tf_tensor(
        mesh, xv.reshape(8, 2, 2, 4, 3, 2), "batch:8,d_blocks:2,d:2,h:4,w:3,c:2"
    )
    yb = layers.conv3d_with_blocks(
        xb, D("hidden", 8), (3, 3, 1), d_blocks_dim=D("d_blocks", 2), name="c3b"
    )
    loss = mtf.reduce_sum(mtf.square(y))
    (dx,) = mtf.gradients([loss], [x])
    got, got_dx, got_b = assert_same_under_layouts(graph, mesh, devices, [y, dx, yb])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y, yb])
    w = _vars(low, graph)
    xt = tf.constant(xv)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        want = tf.nn.conv3d(xt, w["c3_filters"], [1] * 5, "SAME")
        want_loss = tf.reduce_sum(tf.square(want))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        got_dx, tape.gradient(want_loss, xt).numpy(), rtol=1e-4, atol=1e-4
    )
    want_b = tf.nn.conv3d(xt, w["c3b_filters"], [1] * 5, "SAME").numpy()
    np.testing.assert_allclose(
        got_b.reshape(8, 4, 4, 3, 8), want_b, rtol=1e-4, atol=1e-5
    )
    # the filter gradient sums over the batch: one allreduce under a batch split
    f = as_variable(graph.all_variables[0].outputs[0]).outputs[0]
    (df,) = mtf.gradients([loss], [f])
    _, low = lower(graph, mesh, LAYOUTS[1], devices, [df])
    grads = [c for c in low.counters.collectives if "grad_filter" in c.op_name]
    assert [(c.kind, c.mesh_axes, c.bytes_per_device) for c in grads] == [
        ("allreduce", ("data",), 3 * 3 * 1 * 2 * 8 * 4)
    ]
    # and a graph with conv3d and its gradients round-trips through JSON
    again = mtf.graph_from_json(mtf.graph_to_json(graph))
    types = [op.op_type for op in again.graph.operations]
    assert {"Conv3d", "Conv3dBackpropInput", "Conv3dBackpropFilter"} <= set(types)


@pytest.mark.tf
def test_clip_activation_gradient_keeps_values_and_clips_the_gradient_rms(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,hidden:8")
    up = np.full((8, 8), 3.0, np.float32)
    small = np.full((8, 8), 0.5, np.float32)
    y = layers.clip_activation_gradient(x, clip_rms_norm=1.0)
    loss = mtf.reduce_sum(y * mtf.constant(mesh, up, x.shape))
    loss_small = mtf.reduce_sum(y * mtf.constant(mesh, small, x.shape))
    (dx,) = mtf.gradients([loss], [x])
    (dx_small,) = mtf.gradients([loss_small], [x])
    got_y, got_dx, got_small = assert_same_under_layouts(
        graph, mesh, devices, [y, dx, dx_small]
    )
    np.testing.assert_array_equal(got_y, xv)
    np.testing.assert_allclose(got_dx, np.ones((8, 8)), rtol=1e-6)  # rms 3 -> 1
    np.testing.assert_allclose(got_small, small, rtol=1e-6)  # under the limit


@pytest.mark.tf
def test_annealed_dropout_anneals_with_the_global_step(devices):
    from mtf_core.optimize import global_step

    graph, mesh = _graph()
    x = mtf.ones(mesh, "batch:8,hidden:8")
    y = layers.annealed_dropout(x, True, start_step=0, end_step=10, init_rate=0.5)
    assert layers.annealed_dropout(x, False, 0, 10, 0.5) is x
    step = as_variable(global_step(mesh))
    low = mtf.Lowering(graph, {mesh: ONE_DEVICE.impl(devices)}, targets=[y])
    at_start = low.export_to_tf_tensor(y).numpy()
    assert set(np.unique(at_start)) <= {0.0, 2.0} and 0.2 < (at_start == 0).mean() < 0.8
    low.variables.import_(step, np.int32(10))
    done = mtf.Lowering(
        graph, {mesh: ONE_DEVICE.impl(devices)}, targets=[y], variables=low.variables
    )
    np.testing.assert_array_equal(done.export_to_tf_tensor(y).numpy(), np.ones((8, 8)))
    with pytest.raises(ValueError, match="init_rate None must be in"):
        layers.annealed_dropout(x, True, 0, 10)


def test_reversible_half_residual_and_swap_is_the_revnet_block():
    graph, mesh = _graph()
    a, b = mtf.ones(mesh, "hidden:8"), mtf.zeros(mesh, "hidden:8")
    y2, y2b, y1, y1b = layers.reversible_half_residual_and_swap(
        a, None, b, None, lambda t: t + 1.0, recompute_grads=False
    )
    assert y2 is b and y2b is None and y1b is None and y1.shape == a.shape
    # recomputed (tests/test_layers_reversible.py): one op forwards all four
    outs = layers.reversible_half_residual_and_swap(a, None, b, None, lambda t: t + 1.0)
    assert {t.operation.op_type for t in outs} == {"CustomGradient"}


@pytest.mark.tf
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_conv2d_transpose_matches_tensorflow_with_both_gradients(devices, padding):
    import tensorflow as tf

    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,h:3,w:2,c:4")
    y = layers.conv2d_transpose(
        x, D("hidden", 8), (2, 3), (2, 2), padding=padding, name="up"
    )
    h, w = (6, 4) if padding == "SAME" else (6, 5)
    assert y.shape == mtf.convert_to_shape(f"batch:8,h:{h},w:{w},hidden:8")
    loss = mtf.reduce_sum(mtf.square(y))
    f = graph.all_variables[0].outputs[0]
    dx, df = mtf.gradients([loss], [x, f])
    got, got_dx, got_df = assert_same_under_layouts(graph, mesh, devices, [y, dx, df])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    fv = _vars(low, graph)["up_filters"]  # [2, 3, 8, 4]
    xt, ft = tf.constant(xv), tf.constant(fv)
    with tf.GradientTape() as tape:
        tape.watch([xt, ft])
        want = tf.nn.conv2d_transpose(xt, ft, [8, h, w, 8], 2, padding)
        want_loss = tf.reduce_sum(tf.square(want))
    gx, gf = tape.gradient(want_loss, [xt, ft])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_dx, gx.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_df, gf.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.tf
def test_conv3d_transpose_matches_tensorflow(devices):
    import tensorflow as tf

    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,d:2,h:2,w:2,c:2")
    y = layers.conv3d_transpose(x, D("hidden", 4), name="up3")
    assert y.shape == mtf.convert_to_shape("batch:8,d:4,h:4,w:4,hidden:4")
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    fv = _vars(low, graph)["up3_filters"]
    want = tf.nn.conv3d_transpose(xv, fv, [8, 4, 4, 4, 4], 2, "SAME").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(mtf.ShapeError, match="does not give x's"):
        mtf.ops.conv.conv_transpose(x, y, "batch:8,d:4,h:4,w:4,hidden:4", (2, 2, 2))


def test_an_initializer_provider_supplies_mesh_tensorflows_defaults():
    asked = []

    def provider(distribution, stddev):
        asked.append((distribution, round(stddev, 6)))
        return lambda shape, dtype=None: np.full(shape, stddev, np.float32)

    graph, mesh = _graph()
    x = mtf.zeros(mesh, "batch:2,d:16")
    layers.set_initializer_provider(provider)
    try:
        layers.dense(x, "h:4", reduced_dims=["d"], name="k")
        layers.dense(
            x,
            "h:4",
            reduced_dims=["d"],
            name="v",
            kernel_initializer=layers.VarianceScalingInitializer(mode="fan_out"),
        )
        layers.embedding_weights(mesh, "vocab:8", "d:16", name="emb")
        layers.embedding_weights(
            mesh,
            "vocab:8",
            "d:16",
            name="own",
            initializer=lambda s, d=None: np.zeros(s),
        )
    finally:
        layers.set_initializer_provider(None)
    assert asked == [
        ("truncated_normal", 0.25),
        ("truncated_normal", 0.5),
        ("normal", 1.0),
    ]
    by_name = {v.name: v for v in graph.all_variables}
    np.testing.assert_array_equal(by_name["k_kernel"].initializer((2,)), [0.25, 0.25])
    # without a provider, mtf_core's NumPy draws seeded by name come back
    layers.dense(x, "h:4", reduced_dims=["d"], name="after")
    assert len(asked) == 3


@pytest.mark.tf
def test_incremental_self_attention_steps_equal_causal_attention(devices):
    graph, mesh = _graph()
    x, _ = _x(mesh, "batch:8,length:4,io:6")
    heads, kv = D("hidden", 4), D("d_kv", 2)
    length, memory = D("length", 4), D("memory_length", 4)
    mask = layers.attention_mask_autoregressive(mtf.range(mesh, length, "int32"))
    full = layers.multihead_attention(
        x, None, mask, kv_channels=kv, heads=heads, is_training=False, name="mha"
    )
    k = v = mtf.zeros(mesh, mtf.Shape([D("batch", 8), heads, memory, kv]))
    steps = []
    for t in range(4):
        step = mtf.constant(mesh, t, (), "int32")
        y, k, v = layers.multihead_self_attention_incremental(
            mtf.gather(x, step, length), k, v, step, "float32", "float32", name="mha"
        )
        steps.append(y)
    assert len(graph.all_variables) == 1  # the steps reuse the layer's weights
    got = assert_same_under_layouts(graph, mesh, devices, [full, *steps])
    for t in range(4):
        np.testing.assert_allclose(got[1 + t], got[0][:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.tf
def test_compress_mean_and_local_1d_halo_exchange(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:8,hidden:8")
    kk, _ = _x(mesh, "batch:8,hidden:4,w:2", 1)
    k, v = layers.local_1d_halo_exchange(kk, kk, D("hidden", 4), D("w", 2), True)
    kp, _ = layers.local_1d_halo_exchange(kk, kk, None, D("w", 2), False)
    outs = [layers.compress_mean(x, "hidden", 2), k, kp]
    got = assert_same_under_layouts(graph, mesh, devices, outs)
    np.testing.assert_allclose(got[0], xv.reshape(8, 4, 2).mean(2), rtol=1e-6)
    assert got[1].shape == (8, 4, 4) and got[2].shape == (8, 4, 6)
    # each block's left halo is the previous block; the first block's is zeros
    np.testing.assert_array_equal(got[1][:, 1:, :2], got[1][:, :-1, 2:])
    assert not got[1][:, 0, :2].any()
    # without blocks dim: zero padding on both sides
    assert not got[2][:, :, :2].any() and not got[2][:, :, 4:].any()
