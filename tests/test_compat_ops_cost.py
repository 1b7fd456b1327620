"""The cost model prices the Mesh TensorFlow op families exactly as they
lower: ``evaluate()`` predicts the collectives (kind, axes, bytes, in order)
and flops per device a Lowering records, for a beam search (a while loop),
halo exchanges with a blocked convolution, 3-D convolution with its
gradients, the selection helpers, 2-D pooling (``layers`` and Mesh TF's
``PoolOperation``) and 1-D/separable/transposed convolutions with their
gradients, batch norm with ``pool_tensor_1d`` and ``anonymize``, local
attention, and ``slicewise``/``depend``/``Print``, under 1-D, 2-D and
replicated layouts."""

from __future__ import annotations

import numpy as np
import pytest
from test_cost_agreement import assert_agrees
from test_cost_graphs import Case

import mtf_core as mtf
from mtf_core import layers
from mtf_core.beam_search import beam_search
from mtf_core.compat.pool import PoolOperation

pytestmark = pytest.mark.tf

D = mtf.Dimension
LAYOUTS_2x2 = [
    ("all:1", ""),
    ("x:4", "batch:x"),
    ("x:4", "vocab:x"),
    ("x:2;y:2", "batch:x;vocab:y"),
]


def _beam_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    batch, beam, length, vocab = (
        D("batch", 4),
        D("beam", 2),
        D("length", 3),
        D("vocab", 8),
    )
    table = np.random.RandomState(0).randn(8, 8).astype(np.float32)
    emb = mtf.import_tf_tensor(m, table, [D("prev", 8), vocab])

    def logits_fn(step, ids, states):
        prev = mtf.gather(ids, step - 1, length)
        return mtf.gather(emb, prev, D("prev", 8)), states

    ids0 = mtf.zeros(m, [batch, beam, length], dtype="int32")
    seqs, scores = beam_search(logits_fn, ids0, alpha=0.6)
    return Case(g, m, [seqs, scores], LAYOUTS_2x2)


def _blocks_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(1).randn(4, 4, 2, 3, 2).astype(np.float32),
        "batch:4,hblocks:4,h:2,w:3,c:2",
    )
    y = layers.conv2d_with_blocks(
        x, D("vocab", 4), (3, 3), h_blocks_dim=D("hblocks", 4)
    )
    (dx,) = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x])
    layouts = [("all:1", ""), ("x:4", "hblocks:x"), ("x:2;y:2", "batch:x;hblocks:y")]
    return Case(g, m, [y, dx], layouts)


def _conv3d_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(2).randn(4, 2, 3, 3, 4).astype(np.float32),
        "batch:4,d:2,h:3,w:3,c:4",
    )
    y = layers.conv3d(x, D("vocab", 4), (1, 3, 3), name="c3")
    loss = mtf.reduce_sum(mtf.square(y))
    f = g.all_variables[0].outputs[0]
    dx, df = mtf.gradients([loss], [x, f])
    layouts = [
        ("all:1", ""),
        ("x:4", "batch:x"),
        ("x:4", "c:x"),
        ("x:2;y:2", "batch:x;vocab:y"),
    ]
    return Case(g, m, [loss, dx, df], layouts)


def _selection_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(3).permutation(64).reshape(8, 8).astype(np.float32),
        "batch:8,vocab:8",
    )
    outs = [
        mtf.reduce_first(x, "vocab"),
        mtf.nth_largest_element(x, 2, "vocab"),
        mtf.top_1(x, "vocab")[0],
        mtf.stride_tensor_1d(x, "vocab", 2),
        mtf.left_halo_exchange(mtf.reshape(x, "batch:8,vocab:4,w:2"), "vocab", "w", 1),
    ]
    return Case(g, m, outs, LAYOUTS_2x2)


# Layouts for the image/sequence cases: dims batch and c split.
LAYOUTS_BC = [
    ("all:1", ""),
    ("x:4", "batch:x"),
    ("x:4", "c:x"),
    ("x:2;y:2", "batch:x;c:y"),
]


def _pooling_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(4).randn(4, 4, 4, 4).astype(np.float32),
        "batch:4,h:4,w:4,c:4",
    )
    pooled = [
        layers.max_pool2d(x),
        layers.avg_pool2d(x),
        PoolOperation(x, [2, 2], [2, 2], "MAX_2D").outputs[0],
    ]
    loss = mtf.reduce_sum(mtf.square(pooled[0] + pooled[1] + pooled[2]))
    (dx,) = mtf.gradients([loss], [x])
    return Case(g, m, [*pooled, dx], LAYOUTS_BC)


def _conv1d_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(5).randn(4, 8, 4).astype(np.float32),
        "batch:4,length:8,c:4",
    )
    y = layers.conv1d(x, D("d", 4), 3, name="c1")
    z = layers.separable_conv1d(x, D("e", 4), name="s1")
    loss = mtf.reduce_sum(mtf.square(y)) + mtf.reduce_sum(mtf.square(z))
    (dx,) = mtf.gradients([loss], [x])
    img = mtf.import_tf_tensor(
        m,
        np.random.RandomState(6).randn(4, 2, 2, 4).astype(np.float32),
        "batch:4,h:2,w:2,c:4",
    )
    t = layers.conv2d_transpose(img, D("d", 4), name="ct")
    (dimg,) = mtf.gradients([mtf.reduce_sum(mtf.square(t))], [img])
    return Case(g, m, [y, z, dx, t, dimg], LAYOUTS_BC)


def _norm_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(7).randn(4, 8).astype(np.float32),
        "batch:4,c:8",
    )
    normed = layers.batch_norm(x, True, 0.9)
    normed = normed[0] if isinstance(normed, tuple) else normed
    outs = [normed, mtf.pool_tensor_1d(x, "c", pool_size=2), mtf.anonymize(x)]
    return Case(g, m, outs, LAYOUTS_BC)


def _local_attention_case() -> Case:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m,
        np.random.RandomState(8).randn(4, 8, 4).astype(np.float32),
        "batch:4,length:8,c:4",
    )
    y = layers.masked_local_attention_1d(
        x, D("kv", 2), D("heads", 4), False, window_size=2
    )
    layouts = [
        ("all:1", ""),
        ("x:4", "batch:x"),
        ("x:4", "heads:x"),
        ("x:2;y:2", "batch:x;heads:y"),
    ]
    return Case(g, m, [y], layouts)


def _slicewise_case() -> Case:
    import tensorflow as tf

    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(
        m, np.random.RandomState(9).randn(4, 8).astype(np.float32), "batch:4,c:8"
    )
    y = mtf.slicewise(
        tf.exp, [x], output_shape=x.shape, output_dtype=x.dtype,
        splittable_dims=x.shape.dims,
    )  # fmt: skip
    z = mtf.Print(mtf.depend(y * 2.0, []), [y], "y: ")
    return Case(g, m, [y, mtf.reduce_sum(z, reduced_dim=D("c", 8))], LAYOUTS_BC)


@pytest.mark.parametrize(
    "build",
    [
        _beam_case,
        _blocks_case,
        _conv3d_case,
        _selection_case,
        _pooling_case,
        _conv1d_case,
        _norm_case,
        _local_attention_case,
        _slicewise_case,
    ],
    ids=[
        "beam_search",
        "conv2d_with_blocks",
        "conv3d",
        "selection",
        "pooling",
        "conv1d_separable_transpose",
        "batch_norm_pool_1d_anonymize",
        "local_attention_1d",
        "slicewise_depend_print",
    ],
)
def test_cost_model_prices_mesh_tf_op_families_as_they_lower(build, devices) -> None:
    case = build()
    reference = None
    for mesh_shape, rules in case.layouts:
        _, values = assert_agrees(case, mesh_shape, rules, devices)
        if reference is None:
            reference = values
        for got, want in zip(values, reference):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
