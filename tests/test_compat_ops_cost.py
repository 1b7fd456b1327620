"""The cost model prices the Mesh TensorFlow op families exactly as they
lower: ``evaluate()`` predicts the collectives (kind, axes, bytes, in order)
and flops per device a Lowering records, for a beam search (a while loop),
halo exchanges with a blocked convolution, 3-D convolution with its
gradients, and the selection helpers, under 1-D, 2-D and replicated layouts."""

from __future__ import annotations

import numpy as np
import pytest
from test_cost_agreement import assert_agrees
from test_cost_graphs import Case

import mtf_core as mtf
from mtf_core import layers
from mtf_core.beam_search import beam_search

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


@pytest.mark.parametrize(
    "build",
    [_beam_case, _blocks_case, _conv3d_case, _selection_case],
    ids=["beam_search", "conv2d_with_blocks", "conv3d", "selection"],
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
