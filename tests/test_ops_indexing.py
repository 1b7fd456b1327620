"""one_hot / range / gather / top_k / argmax / cumsum: values and gradients
under every layout, what they communicate, and their errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import (
    LAYOUTS,
    MODEL_SPLIT,
    SPLIT_2D,
    LayoutCase,
    assert_communication_as_recorded,
    assert_same_under_layouts,
    check_op,
    lower,
    upstream_for,
    weighted_sum,
)

import mtf_core as mtf
from mtf_core.ops.indexing import Gather

pytestmark = pytest.mark.tf

HIDDEN = mtf.Dimension("hidden", 8)
IDS = np.array([0, 7, 3, 5, 2, 2, 6, 1], np.int32)


# --------------------------------------------------------------------------
# one_hot / range
# --------------------------------------------------------------------------


def test_one_hot_does_not_depend_on_layout_and_ignores_out_of_range_ids(
    devices: list[str],
) -> None:
    ids = np.array([0, 7, 3, 9, -1, 2, 6, 1], np.int32)
    (got,) = check_op(
        devices,
        ["batch:8"],
        lambda i: mtf.one_hot(i, HIDDEN, on_value=2.0, off_value=-1.0),
        lambda i: tf.one_hot(i, 8, 2.0, -1.0),
        values=[ids],
    )
    assert got.dtype == np.float32
    assert (got[3] == -1.0).all() and (got[4] == -1.0).all()


def test_one_hot_and_range_communicate_nothing(devices: list[str]) -> None:
    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        ids = mtf.import_tf_tensor(mesh, IDS, "batch:8")
        hot = mtf.one_hot(ids, HIDDEN, dtype=mtf.int32)
        return graph, mesh, [hot, mtf.range(mesh, HIDDEN, mtf.float32)]

    assert all(
        v == [] for v in assert_communication_as_recorded(devices, build).values()
    )


def test_range_counts_along_its_dim_under_every_layout(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    r = mtf.range(mesh, HIDDEN, dtype=mtf.int32)
    grid = mtf.range(mesh, "batch:8", mtf.float32) * 10.0 + mtf.cast(r, mtf.float32)
    got_r, got_grid = assert_same_under_layouts(graph, mesh, devices, [r, grid])
    np.testing.assert_array_equal(got_r, np.arange(8, dtype=np.int32))
    np.testing.assert_array_equal(
        got_grid, np.arange(8)[:, None] * 10.0 + np.arange(8)[None, :]
    )
    assert r.dtype == "int32" and r.operation.flops() == 0


# --------------------------------------------------------------------------
# gather
# --------------------------------------------------------------------------

GATHER_CASES = {
    # hidden plays the vocabulary: split on model under model/2-D layouts
    "embedding_lookup": (
        ["hidden:8,d:4", "batch:8"],
        lambda w, i: mtf.gather(w, i, HIDDEN),
        # (w * 1.0: TensorFlow's own gradient of gather is sparse; this densifies it)
        lambda w, i: tf.gather(w * 1.0, i),
        [np.random.RandomState(2).randn(8, 4).astype(np.float32), IDS],
    ),
    "shared_batch_dim": (
        ["batch:8,hidden:8", "batch:8,k:2"],
        lambda w, i: mtf.gather(w, i, "hidden"),
        lambda w, i: tf.gather(w, i, batch_dims=1),
        [
            np.random.RandomState(3).randn(8, 8).astype(np.float32),
            np.random.RandomState(4).randint(0, 8, (8, 2)).astype(np.int32),
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(GATHER_CASES))
def test_gather_and_its_gradient_do_not_depend_on_layout(
    devices: list[str], case: str
) -> None:
    shapes, mtf_fn, tf_fn, values = GATHER_CASES[case]
    check_op(devices, shapes, mtf_fn, tf_fn, values=values)


def test_gather_with_split_vocab_allreduces_once_over_its_axis(
    devices: list[str],
) -> None:
    weights = np.arange(32, dtype=np.float32).reshape(8, 4)
    ids = np.array([0, 7, 3, 12, -2, 2, 6, 1], np.int32)  # two out of range

    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        w = mtf.import_tf_tensor(mesh, weights, "hidden:8,d:4")
        i = mtf.import_tf_tensor(mesh, ids, "batch:8")
        return graph, mesh, [mtf.gather(w, i, HIDDEN)]

    seen = assert_communication_as_recorded(devices, build)
    assert seen["one_device"] == seen["batch_split"] == []
    # a partial [batch:8, d:4] float32 result per device is summed over model
    assert seen["model_split"] == [("allreduce", ("model",), 128)]
    assert seen["split_2d"] == [("allreduce", ("model",), 64)]
    graph, mesh, (y,) = build()
    (got,), _ = lower(graph, mesh, MODEL_SPLIT, devices, [y])
    want = weights[np.clip(ids, 0, 7)] * ((ids >= 0) & (ids < 8))[:, None]
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------
# top_k / argmax
# --------------------------------------------------------------------------


def _distinct(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values without ties (so every layout and TF pick the same order)."""
    rng = np.random.RandomState(seed)
    return rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / 10


@pytest.mark.parametrize("k", [2, 3])
def test_top_k_values_indices_and_gradient_do_not_depend_on_layout(
    devices: list[str], k: int
) -> None:
    x = _distinct((8, 8), seed=k)
    kd = mtf.Dimension("k", k)
    check_op(
        devices,
        ["batch:8,hidden:8"],
        lambda t: mtf.top_k(t, "hidden", kd)[0],
        lambda t: tf.math.top_k(t, k).values,
        values=[x],
    )
    (idx,) = check_op(
        devices,
        ["batch:8,hidden:8"],
        lambda t: mtf.top_k(t, HIDDEN, kd)[1],
        lambda t: tf.math.top_k(t, k).indices,
        values=[x],
        grads=False,
    )
    assert idx.dtype == np.int32


def test_top_k_on_a_split_dim_allconcats_only_the_candidates(
    devices: list[str],
) -> None:
    def build(k: int):
        def inner():
            graph = mtf.Graph()
            mesh = mtf.Mesh(graph, "mesh")
            x = mtf.import_tf_tensor(mesh, _distinct((8, 8), 0), "batch:8,hidden:8")
            return graph, mesh, list(mtf.top_k(x, "hidden", mtf.Dimension("k", k)))

        return inner

    # hidden:8 on model:4 holds 2 per device: for k=2 each device sends its
    # [8, 2] values (float32) and indices (int32); for k=3 it must gather x.
    seen = assert_communication_as_recorded(devices, build(2), [MODEL_SPLIT, SPLIT_2D])
    assert seen["model_split"] == [
        ("allconcat", ("model",), 64),
        ("allconcat", ("model",), 64),
    ]
    assert seen["split_2d"] == [
        ("allconcat", ("model",), 32),
        ("allconcat", ("model",), 32),
    ]
    seen = assert_communication_as_recorded(devices, build(3), [MODEL_SPLIT])
    assert seen["model_split"] == [("allconcat", ("model",), 64)]


def test_argmax_picks_the_first_of_ties_under_every_layout(
    devices: list[str],
) -> None:
    x = np.zeros((8, 8), np.float32)
    x[0, [1, 5]] = 3.0  # tie across two model devices
    x[1, [6, 7]] = 2.0  # tie within one device
    x[2, :] = -1.0  # all equal
    x[3:, :] = _distinct((5, 8), 5)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    t = mtf.import_tf_tensor(mesh, x, "batch:8,hidden:8")
    am = mtf.argmax(t, HIDDEN)
    assert str(am.shape) == "batch:8" and am.dtype == "int32"
    (got,) = assert_same_under_layouts(graph, mesh, devices, [am])
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))
    assert list(got[:3]) == [1, 6, 0]


# --------------------------------------------------------------------------
# cumsum
# --------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("dim", ["hidden", "batch"])
def test_cumsum_and_its_gradient_do_not_depend_on_layout(
    devices: list[str], exclusive: bool, dim: str
) -> None:
    axis = 0 if dim == "batch" else 1
    check_op(
        devices,
        ["batch:8,hidden:8"],
        lambda x: mtf.cumsum(x, dim, exclusive=exclusive),
        lambda x: tf.cumsum(x, axis, exclusive=exclusive),
    )


def test_cumsum_on_a_split_dim_allconcats_only_block_totals(
    devices: list[str],
) -> None:
    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        x = mtf.import_tf_tensor(mesh, np.ones((8, 8), np.float32), "batch:8,hidden:8")
        return graph, mesh, [mtf.cumsum(x, HIDDEN)]

    seen = assert_communication_as_recorded(devices, build)
    assert seen["one_device"] == seen["batch_split"] == []
    # one [batch:8, 1] float32 total per device
    assert seen["model_split"] == [("allconcat", ("model",), 32)]
    assert seen["split_2d"] == [("allconcat", ("model",), 16)]


def test_indexing_ops_and_their_gradients_predict_what_they_communicate(
    devices: list[str],
) -> None:
    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        rng = np.random.RandomState(6)
        w = mtf.import_tf_tensor(
            mesh, rng.randn(8, 8).astype(np.float32), "hidden:8,d:8"
        )
        ids = mtf.import_tf_tensor(mesh, IDS, "batch:8")
        emb = mtf.gather(w, ids, HIDDEN)  # [batch, d]
        c = mtf.cumsum(emb, "d:8", exclusive=True)
        vals, _ = mtf.top_k(c, "batch", "k:4")
        y = vals * mtf.one_hot(mtf.argmax(c, "batch"), "k:4") + mtf.cast(
            mtf.range(mesh, "k:4"), mtf.float32
        )
        upstream = upstream_for(y, np.random.RandomState(0))
        return graph, mesh, [y, *mtf.gradients([weighted_sum(y, upstream)], [w])]

    custom = LayoutCase("d_and_k_split", "a:2;b:4", "d:b;k:a;hidden:a")
    seen = assert_communication_as_recorded(devices, build, [*LAYOUTS, custom])
    assert seen["one_device"] == []
    assert {kind for kind, _, _ in seen["split_2d"]} == {"allreduce", "allconcat"}


# --------------------------------------------------------------------------
# attrs, splittability, errors
# --------------------------------------------------------------------------


def test_indexing_ops_have_json_attrs_and_split_every_dim() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "batch:8,hidden:8")
    ids = mtf.zeros(mesh, "batch:8", mtf.int32)
    ops = [
        mtf.one_hot(ids, HIDDEN).operation,
        mtf.range(mesh, HIDDEN).operation,
        mtf.gather(x, ids, HIDDEN).operation,
        mtf.top_k(x, HIDDEN, "k:2")[0].operation,
        mtf.argmax(x, "hidden").operation,
        mtf.cumsum(x, "hidden", exclusive=True).operation,
    ]
    for op in ops:
        json.dumps(op.attrs())
        assert op.unsplittable_dims() == frozenset(), op
    assert ops[0].attrs()["output_dim"] == "hidden:8"
    assert ops[3].attrs() == {"reduced_dim": "hidden:8", "k_dim": "k:2"}


def test_gather_with_vocab_and_batch_on_one_axis_is_a_layout_error(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.zeros(mesh, "hidden:8,d:4")
    i = mtf.zeros(mesh, "batch:8", mtf.int32)
    y = mtf.gather(w, i, HIDDEN)
    case = LayoutCase("clash", "model:4", "hidden:model;batch:model")
    with pytest.raises(mtf.LayoutError, match="'batch' and 'hidden'.*'model'"):
        lower(graph, mesh, case, devices, [y])


def test_indexing_ops_reject_bad_input() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "batch:8,hidden:8")
    ids = mtf.zeros(mesh, "batch:8", mtf.int32)
    with pytest.raises(mtf.DTypeError, match="float32; expected an integer"):
        mtf.one_hot(x, "classes:4")
    with pytest.raises(mtf.ShapeError, match="already a dimension"):
        mtf.one_hot(ids, "batch:8")
    with pytest.raises(mtf.ShapeError, match="has no size"):
        mtf.one_hot(ids, "classes")
    with pytest.raises(mtf.ShapeError, match="no dimension 'vocab'"):
        mtf.gather(x, ids, "vocab")
    with pytest.raises(mtf.ShapeError, match="does not match hidden:8"):
        mtf.gather(x, ids, "hidden:9")
    with pytest.raises(mtf.ShapeError, match="must not have the gathered"):
        Gather(x, mtf.zeros(mesh, "hidden:8", mtf.int32), HIDDEN)
    # mtf.gather allows it (Mesh TensorFlow does): positions along a dim
    # named like the gathered one, which the result keeps
    picked = mtf.gather(x, mtf.zeros(mesh, "hidden:3", mtf.int32), "hidden")
    assert picked.shape == mtf.convert_to_shape("hidden:3,batch:8")
    with pytest.raises(mtf.ShapeError, match="larger than reduced_dim"):
        mtf.top_k(x, "hidden", "k:9")
    with pytest.raises(mtf.ShapeError, match="already a dimension"):
        mtf.top_k(x, "hidden", "batch:2")
    with pytest.raises(mtf.ShapeError, match="no dimension 'nope'"):
        mtf.cumsum(x, "nope")
    with pytest.raises(mtf.ShapeError, match="not an mtf.Mesh"):
        mtf.range(graph, HIDDEN)
