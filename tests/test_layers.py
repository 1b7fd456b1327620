"""Layers: values against NumPy / TensorFlow references, under several layouts."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core import layers
from mtf_core.errors import ConfigError, LayoutError, ShapeError

D = mtf.Dimension
BATCH, LEN, MODEL = D("batch", 2), D("length", 4), D("d_model", 8)
HEADS, KV, FF = D("heads", 4), D("d_kv", 2), D("d_ff", 8)


def _graph():
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "m")


def _lower(graph, mesh, devices, shape="all:1", rules="", feeds=None):
    n = mtf.convert_to_shape(shape).size
    impl = mtf.PlacementMeshImpl(shape, rules, devices[:n])
    return mtf.Lowering(graph, {mesh: impl}, feeds=feeds or {})


def _value(low, t):
    return low.export_to_tf_tensor(t).numpy()


def _var(low, graph, name):
    (v,) = [v for v in graph.all_variables if v.name == name]
    return low.variables.export(v)


def _x(mesh, shape, seed=0):
    arr = np.random.RandomState(seed).randn(
        *mtf.convert_to_shape(shape).to_integer_list()
    )
    return mtf.constant(mesh, arr.astype(np.float32), shape), arr.astype(np.float32)


@pytest.mark.tf
def test_dense_reduces_given_dims_and_adds_new_dims(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:2,a:3,b:4")
    y = layers.dense(x, new_dims="c:5", reduced_dims=["a", "b"], name="d")
    assert y.shape == mtf.convert_to_shape("batch:2,c:5")
    low = _lower(graph, mesh, devices, "all:2", "batch:all")
    w = _var(low, graph, "d_kernel")
    assert w.shape == (3, 4, 5)
    np.testing.assert_allclose(
        _value(low, y), np.einsum("nab,abc->nc", xv, w), rtol=1e-5, atol=1e-6
    )


def test_dense_rejects_a_new_dim_the_input_already_has():
    graph, mesh = _graph()
    x = mtf.zeros(mesh, "batch:2,a:3")
    with pytest.raises(ShapeError, match="already a dimension"):
        layers.dense(x, new_dims="batch:2", reduced_dims="a")


@pytest.mark.tf
def test_layer_norm_and_rms_norm_match_numpy(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:4,d_model:8")
    ln = layers.layer_norm(x, "d_model", name="ln")
    rms = layers.rms_norm(x, MODEL, name="rms")
    low = _lower(graph, mesh, devices, "all:2", "d_model:all")
    mu = xv.mean(-1, keepdims=True)
    var = ((xv - mu) ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(
        _value(low, ln), (xv - mu) / np.sqrt(var + 1e-6), rtol=1e-4, atol=1e-5
    )
    ms = (xv**2).mean(-1, keepdims=True)
    np.testing.assert_allclose(
        _value(low, rms), xv / np.sqrt(ms + 1e-6), rtol=1e-4, atol=1e-5
    )


@pytest.mark.tf
def test_embedding_under_vocab_split_looks_up_rows_with_one_allreduce(devices):
    graph, mesh = _graph()
    ids_v = np.array([[0, 5, 7, 2], [3, 3, 1, 6]], np.int32)
    ids = mtf.constant(mesh, ids_v, "batch:2,length:4", "int32")
    emb = layers.embedding(ids, "vocab:8", MODEL, name="emb")
    low = _lower(graph, mesh, devices, "all:4", "vocab:all")
    table = _var(low, graph, "emb")
    np.testing.assert_allclose(_value(low, emb), table[ids_v], rtol=1e-6)
    reduces = low.counters.of_kind("allreduce")
    assert [(r.op_type, r.mesh_axes) for r in reduces] == [("Gather", ("all",))]


def _np_attention(x, mem, wq, wk, wv, wo, bias):
    q = np.einsum("bld,dhk->blhk", x, wq)
    k = np.einsum("bmd,dhk->bmhk", mem, wk)
    v = np.einsum("bmd,dhk->bmhk", mem, wv)
    logits = np.einsum("blhk,bmhk->bhlm", q, k) + bias
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("bhlm,bmhk->blhk", w, v)
    return np.einsum("blhk,hkd->bld", o, wo)


@pytest.mark.tf
@pytest.mark.parametrize(
    ("shape", "rules"),
    [("all:1", ""), ("all:4", "heads:all"), ("x:2;y:2", "batch:x;heads:y")],
)
def test_causal_self_attention_matches_numpy(devices, shape, rules):
    graph, mesh = _graph()
    x, xv = _x(mesh, [BATCH, LEN, MODEL])
    bias = layers.attention_bias_causal(mesh, LEN, D("memory_length", 4))
    y = layers.multihead_attention(x, HEADS, KV, bias=bias, name="att")
    assert y.shape == x.shape
    low = _lower(graph, mesh, devices, shape, rules)
    w = {s: _var(low, graph, f"att_{s}") for s in "qkvo"}
    causal = np.where(np.arange(4)[None, :] <= np.arange(4)[:, None], 0.0, -1e9)
    want = _np_attention(xv, xv, w["q"], w["k"], w["v"], w["o"], causal)
    np.testing.assert_allclose(_value(low, y), want, rtol=1e-4, atol=1e-5)
    if rules == "heads:all":
        # heads split: only the output projection sums over heads.
        reduces = low.counters.of_kind("allreduce")
        assert len(reduces) == 1 and reduces[0].op_type == "Einsum"
        op = graph.operation_by_name(reduces[0].op_name)
        assert set(op.reduced_dims) == {"heads", "d_kv"}


@pytest.mark.tf
def test_encoder_decoder_attention_ignores_padded_memory(devices):
    mem_len = D("memory_length", 3)
    ids_v = np.array([[4, 2, 0], [5, 0, 0]], np.int32)  # 0 = padding
    outs = []
    for seed in (1, 2):  # different memory values at the padded positions
        graph, mesh = _graph()
        x, _ = _x(mesh, [BATCH, LEN, MODEL])
        mem_v = np.random.RandomState(7).randn(2, 3, 8).astype(np.float32)
        mem_v[ids_v == 0] = np.random.RandomState(seed).randn(3, 8)
        memory = mtf.constant(mesh, mem_v, [BATCH, mem_len, MODEL])
        ids = mtf.constant(mesh, ids_v, [BATCH, mem_len], "int32")
        bias = layers.attention_bias_padding(ids)
        y = layers.multihead_attention(x, HEADS, KV, memory=memory, bias=bias, name="a")
        outs.append(_value(_lower(graph, mesh, devices), y))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_attention_rejects_memory_without_a_length_dim():
    graph, mesh = _graph()
    x = mtf.zeros(mesh, [BATCH, LEN, MODEL])
    memory = mtf.zeros(mesh, [BATCH, D("other", 3), MODEL])
    with pytest.raises(ShapeError, match="memory_length"):
        layers.multihead_attention(x, HEADS, KV, memory=memory)


@pytest.mark.tf
def test_dense_relu_dense_with_split_d_ff_matches_numpy_and_allreduces_once(devices):
    graph, mesh = _graph()
    x, xv = _x(mesh, [BATCH, LEN, MODEL])
    y = layers.dense_relu_dense(x, FF, name="ffn")
    low = _lower(graph, mesh, devices, "all:4", "d_ff:all")
    wi, wo = _var(low, graph, "ffn_wi_kernel"), _var(low, graph, "ffn_wo_kernel")
    want = np.maximum(xv @ wi, 0.0) @ wo
    np.testing.assert_allclose(_value(low, y), want, rtol=1e-4, atol=1e-5)
    reduces = low.counters.of_kind("allreduce")
    assert [(r.op_type, r.mesh_axes) for r in reduces] == [("Einsum", ("all",))]
    assert reduces[0].bytes_per_device == 2 * 4 * 8 * 4


@pytest.mark.tf
def test_cross_entropy_with_z_loss_and_label_smoothing_matches_numpy(devices):
    graph, mesh = _graph()
    logits, lv = _x(mesh, "batch:3,vocab:8")
    ids_v = np.array([1, 7, 4], np.int32)
    ids = mtf.constant(mesh, ids_v, "batch:3", "int32")
    loss = layers.sparse_softmax_cross_entropy(
        logits, ids, "vocab", z_loss=1e-2, label_smoothing=0.1
    )
    low = _lower(graph, mesh, devices, "all:4", "vocab:all")
    lse = np.log(np.exp(lv).sum(-1))
    target = np.full((3, 8), 0.1 / 8)
    target[np.arange(3), ids_v] += 0.9
    want = lse - (lv * target).sum(-1) + 1e-2 * lse**2
    np.testing.assert_allclose(_value(low, loss), want, rtol=1e-5)


@pytest.mark.tf
def test_dropout_zeroes_about_rate_and_scales_the_rest(devices):
    graph, mesh = _graph()
    x = mtf.ones(mesh, "batch:8,d_model:256")
    assert layers.dropout(x, 0.0) is x
    y = layers.dropout(x, 0.25)
    v = _value(_lower(graph, mesh, devices, "all:2", "batch:all"), y)
    assert set(np.unique(v)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.2 < (v == 0).mean() < 0.3
    with pytest.raises(ConfigError, match="1.5"):
        layers.dropout(x, 1.5)


def _conv_graph(seed=0):
    graph, mesh = _graph()
    x, xv = _x(mesh, "batch:4,h:6,w:5,c_in:4", seed)
    y = layers.conv2d(x, "c_out:4", filter_size=(3, 2), padding="VALID", name="cv")
    loss = mtf.reduce_sum(mtf.square(y))
    f = [v for v in graph.trainable_variables if v.name == "cv_filters"][0].outputs[0]
    dx, df = mtf.gradients([loss], [x, f])
    return graph, mesh, xv, y, dx, df


@pytest.mark.tf
@pytest.mark.parametrize(
    ("shape", "rules"),
    [
        ("all:1", ""),
        ("all:4", "batch:all"),
        ("all:2", "c_in:all"),
        ("x:2;y:2", "batch:x;c_out:y"),
    ],
)
def test_conv2d_and_its_gradients_match_tensorflow(devices, shape, rules):
    import tensorflow as tf

    graph, mesh, xv, y, dx, df = _conv_graph()
    assert y.shape == mtf.convert_to_shape("batch:4,h:4,w:4,c_out:4")
    low = _lower(graph, mesh, devices, shape, rules)
    fv = _var(low, graph, "cv_filters")
    xt, ft = tf.constant(xv), tf.constant(fv)
    with tf.GradientTape() as tape:
        tape.watch([xt, ft])
        yt = tf.nn.conv2d(xt, ft, 1, "VALID")
        lt = tf.reduce_sum(tf.square(yt))
    gx, gf = tape.gradient(lt, [xt, ft])
    np.testing.assert_allclose(_value(low, y), yt.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_value(low, dx), gx.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_value(low, df), gf.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.tf
def test_conv2d_refuses_a_layout_that_splits_spatial_dims(devices):
    graph, mesh, *_ = _conv_graph()
    with pytest.raises(LayoutError, match="spatial dimension 'h'"):
        _lower(graph, mesh, devices, "all:2", "h:all")


def test_a_constant_made_by_a_function_is_made_only_when_its_value_is_read():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    calls = []

    def make():
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(2, 3)

    t = mtf.constant(mesh, make, "a:2;b:3", "float32")
    op = t.operation
    assert calls == [] and t.shape == mtf.Shape("a:2;b:3")
    np.testing.assert_array_equal(op.value, np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(op.value, np.arange(6).reshape(2, 3))
    assert calls == [1]  # made once
    wrong = mtf.constant(mesh, lambda: np.zeros((3, 2)), "a:2;b:3", "float32")
    with pytest.raises(mtf.GraphError, match=r"value of shape \[3, 2\] does not match"):
        _ = wrong.operation.value


def test_planning_a_causal_model_never_makes_its_attention_bias():
    from layout_planner.choices import plan_transformer
    from mtf_core.models import TransformerConfig
    from mtf_core.ops.creation import causal_bias_values as _causal_bias

    cfg = TransformerConfig(
        num_layers=2, d_model=64, heads=4, d_kv=16, d_ff=128, vocab=128,
        length=4093, batch=8,
    )  # fmt: skip
    before = _causal_bias.cache_info().misses
    plan_transformer(cfg, 8, "h100-nvlink-ib", workers=1)
    assert _causal_bias.cache_info().misses == before
    graph, mesh = _graph()
    bias = layers.attention_bias_causal(mesh, D("length", 3), D("memory_length", 3))
    want = np.where(np.arange(3)[None, :] <= np.arange(3)[:, None], 0.0, -1e9)
    np.testing.assert_array_equal(bias.operation.value, want)
