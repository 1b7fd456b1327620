"""Mesh TensorFlow's selection and blocking helpers (``top_1``,
``nth_largest_element``, ``reduce_first``, ``sample_with_temperature``,
``pool_tensor_1d``/``stride_tensor_1d``, ``halo_exchange``, ``anonymize``,
``gather(output_shape=)``): values equal one device's under the 1-D, 2-D and
replicated layouts, every op's ``communication()`` agrees with what it
records, and the collectives are the expected ones."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    MODEL_SPLIT,
    SPLIT_2D,
    assert_communication_as_recorded,
    assert_same_under_layouts,
    upstream_for,
    weighted_sum,
)

import mtf_core as mtf

pytestmark = pytest.mark.tf

SHAPE = "batch:4,hidden:8"
XV = np.random.RandomState(0).permutation(32).reshape(4, 8).astype(np.float32)


def _graph():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    return graph, mesh, mtf.import_tf_tensor(mesh, XV, SHAPE)


def test_top_1_nth_elements_and_reduce_first_match_numpy_under_every_layout(
    devices: list[str],
) -> None:
    graph, mesh, x = _graph()
    top_v, top_i = mtf.top_1(x, "hidden")
    outs = [
        top_v,
        top_i,
        mtf.nth_largest_element(x, 2, "hidden"),
        mtf.nth_smallest_element(x, 1, "hidden"),
        mtf.reduce_first(x, "hidden"),
        mtf.reduce_first(x, "batch"),
    ]
    got = assert_same_under_layouts(graph, mesh, devices, outs)
    srt = np.sort(XV, axis=1)
    np.testing.assert_array_equal(got[0], XV.max(1))
    np.testing.assert_array_equal(got[1], XV.argmax(1))
    np.testing.assert_array_equal(got[2], srt[:, -3])
    np.testing.assert_array_equal(got[3], srt[:, 1])
    np.testing.assert_array_equal(got[4], XV[:, 0])
    np.testing.assert_array_equal(got[5], XV[0, :])
    assert top_i.dtype == "int32" and top_v.shape == mtf.convert_to_shape("batch:4")


def test_reduce_first_over_a_split_dim_allreduces_its_result_once(
    devices: list[str],
) -> None:
    def build():
        graph, mesh, x = _graph()
        return graph, mesh, mtf.reduce_first(x, "hidden")

    rec = assert_communication_as_recorded(devices, build)
    assert rec["one_device"] == rec["batch_split"] == []
    # [batch:4] float32 per device: 16 bytes, 2 under the 2-D split
    assert rec["model_split"] == [("allreduce", ("model",), 16)]
    assert rec["split_2d"] == [("allreduce", ("model",), 8)]


def test_nth_largest_element_communicates_as_its_top_k_says(
    devices: list[str],
) -> None:
    def build():
        graph, mesh, x = _graph()
        return graph, mesh, mtf.nth_largest_element(x, 1, "hidden")

    rec = assert_communication_as_recorded(devices, build)
    assert rec["one_device"] == rec["batch_split"] == []
    assert rec["model_split"] and all(r[1] == ("model",) for r in rec["model_split"])


@pytest.mark.parametrize(
    ("fn", "want"),
    [
        (
            lambda x: mtf.pool_tensor_1d(x, "hidden", pool_size=2),
            XV.reshape(4, 4, 2).mean(2),
        ),
        (
            lambda x: mtf.pool_tensor_1d(x, "hidden", mtf.reduce_max, 2),
            XV.reshape(4, 4, 2).max(2),
        ),
        (lambda x: mtf.stride_tensor_1d(x, "hidden", 2), XV[:, ::2]),
    ],
    ids=["mean_by_2", "max_by_2", "stride_2"],
)
def test_pool_and_stride_tensor_1d_match_numpy_with_gradients(
    devices: list[str], fn, want
) -> None:
    graph, mesh, x = _graph()
    y = fn(x)
    assert y.shape.get_dim_by_name("hidden").size == want.shape[1]
    up = upstream_for(y, np.random.RandomState(1))
    (dx,) = mtf.gradients([weighted_sum(y, up)], [x])
    got_y, _ = assert_same_under_layouts(graph, mesh, devices, [y, dx])
    np.testing.assert_allclose(got_y, want, rtol=1e-6)


def test_pool_tensor_1d_refuses_a_pool_size_that_does_not_divide() -> None:
    _, _, x = _graph()
    with pytest.raises(mtf.ShapeError, match="pool_size 3 does not divide .*hidden:8"):
        mtf.pool_tensor_1d(x, "hidden", pool_size=3)
    with pytest.raises(mtf.ShapeError, match="n=8 but dimension hidden:8"):
        mtf.nth_largest_element(x, 8, "hidden")


def test_sample_with_temperature_is_argmax_at_zero_and_follows_peaks(
    devices: list[str],
) -> None:
    graph, mesh, x = _graph()
    greedy = mtf.sample_with_temperature(x, "hidden", 0.0)
    # logits with one overwhelming peak per row: any sample picks it
    peaked = mtf.import_tf_tensor(
        mesh, np.eye(4, 8, 3, dtype=np.float32) * 100.0, SHAPE
    )
    sampled = mtf.sample_with_temperature(peaked, "hidden", 1.0)
    noisy = mtf.sample_with_temperature(x * 0.0, "hidden", 1.0)
    got = assert_same_under_layouts(graph, mesh, devices, [greedy, sampled, noisy])
    np.testing.assert_array_equal(got[0], XV.argmax(1))
    np.testing.assert_array_equal(got[1], [3, 4, 5, 6])
    assert got[2].dtype == np.int32 and ((got[2] >= 0) & (got[2] < 8)).all()
    with pytest.raises(ValueError, match="temperature -1.0 must be a number >= 0"):
        mtf.sample_with_temperature(x, "hidden", -1.0)


def _halo_reference(xv: np.ndarray, halo: int, left_only: bool) -> np.ndarray:
    """[batch, blocks, size] -> each block with ``halo`` neighbours' positions
    on the left (and right), zeros past the ends."""
    b, n, k = xv.shape
    flat = xv.reshape(b, n * k)
    padded = np.pad(flat, ((0, 0), (halo, 0 if left_only else halo)))
    width = k + halo * (1 if left_only else 2)
    return np.stack([padded[:, i * k : i * k + width] for i in range(n)], axis=1)


@pytest.mark.parametrize("halo", [2, 4])
@pytest.mark.parametrize("left_only", [False, True], ids=["both", "left"])
def test_halo_exchange_matches_numpy_and_shifts_over_the_blocks_axis(
    devices: list[str], halo: int, left_only: bool
) -> None:
    xv = np.arange(1, 4 * 8 * 3 + 1, dtype=np.float32).reshape(4, 8, 3)
    fn = mtf.left_halo_exchange if left_only else mtf.halo_exchange

    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        x = mtf.import_tf_tensor(mesh, xv, "batch:4,hidden:8,w:3")
        return graph, mesh, fn(x, "hidden", "w", halo)

    graph, mesh, y = build()
    width = 3 + halo * (1 if left_only else 2)
    assert y.shape == mtf.convert_to_shape(f"batch:4,hidden:8,w:{width}")
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    np.testing.assert_array_equal(got, _halo_reference(xv, halo, left_only))
    rec = assert_communication_as_recorded(
        devices, build, [LAYOUTS[0], MODEL_SPLIT, SPLIT_2D]
    )
    assert rec["one_device"] == []
    # each neighbour shift crosses the model axis, and nothing else does
    assert rec["model_split"] and {r[1] for r in rec["model_split"]} == {("model",)}


def test_halo_exchange_gradient_sums_the_margins_back(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(
        mesh, np.ones((4, 8, 3), np.float32), "batch:4,hidden:8,w:3"
    )
    y = mtf.halo_exchange(x, "hidden", "w", 1)
    (dx,) = mtf.gradients([mtf.reduce_sum(y)], [x])
    (got,) = assert_same_under_layouts(graph, mesh, devices, [dx])
    # each position is read once by its block and once more by each neighbour
    # block whose halo covers it (edge positions of inner blocks).
    want = np.ones((4, 8, 3), np.float32)
    want[:, :-1, -1] += 1
    want[:, 1:, 0] += 1
    np.testing.assert_array_equal(got, want)


def test_anonymize_replicates_and_keeps_values(devices: list[str]) -> None:
    def build():
        graph, mesh, x = _graph()
        return graph, mesh, mtf.anonymize(x)

    graph, mesh, y = build()
    assert mtf.is_anonymous(y.shape) and not mtf.is_anonymous(
        mtf.convert_to_shape(SHAPE)
    )
    assert y.shape.dimension_names == ["_anonymous_0", "_anonymous_1"]
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    np.testing.assert_array_equal(got, XV)
    rec = assert_communication_as_recorded(devices, build)
    # the split tensor is concatenated whole onto every device: 4x8 float32
    # (128 B) is 32 B per device before each allconcat over a 4-way axis
    assert rec == {
        "one_device": [],
        "batch_split": [("allconcat", ("data",), 32)],
        "model_split": [("allconcat", ("model",), 32)],
        "split_2d": [("allconcat", ("data",), 16), ("allconcat", ("model",), 32)],
    }


def test_gather_takes_an_int_index_and_an_output_shape(devices: list[str]) -> None:
    graph, mesh, x = _graph()
    col = mtf.gather(x, 5, "hidden")
    t = mtf.gather(
        x,
        mtf.import_tf_tensor(mesh, np.array([1, 0], np.int32), "k:2"),
        "batch",
        output_shape="hidden:8,k:2",
    )
    assert t.shape == mtf.convert_to_shape("hidden:8,k:2")
    # an output_shape with new dims broadcasts (Mesh TF's einsum-based gather)
    wide = mtf.gather(x, 5, "hidden", output_shape="k:3,batch:4")
    got_col, got_t, got_wide = assert_same_under_layouts(
        graph, mesh, devices, [col, t, wide]
    )
    np.testing.assert_array_equal(got_col, XV[:, 5])
    np.testing.assert_array_equal(got_t, XV[[1, 0]].T)
    np.testing.assert_array_equal(got_wide, np.tile(XV[:, 5], (3, 1)))
    with pytest.raises(mtf.ShapeError, match="output_shape \\[hidden:8\\]"):
        mtf.gather(x, 5, "hidden", output_shape="hidden:8")


def test_import_fully_replicated_and_tensor_dim_to_mesh_dim_size(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    y = mtf.import_fully_replicated(mesh, XV, SHAPE)
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    np.testing.assert_array_equal(got, XV)
    batch = mtf.Dimension("batch", 8)
    assert mtf.tensor_dim_to_mesh_dim_size("batch:rows", "rows:2;cols:4", batch) == 2
    assert mtf.tensor_dim_to_mesh_dim_size("hidden:cols", "rows:2;cols:4", batch) == 1
    assert mtf.tensor_dim_to_size_per_split("batch:cols", "rows:2;cols:4", batch) == 2
    with pytest.raises(mtf.IndivisibleDimensionError, match="batch:6"):
        mtf.tensor_dim_to_size_per_split(
            "batch:cols", "rows:2;cols:4", mtf.Dimension("batch", 6)
        )


def test_top_k_puts_k_dim_last_as_mesh_tensorflow_does(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, XV.T.copy(), "hidden:8,batch:4")
    values, indices = mtf.top_k(x, "hidden", "k:2")
    assert values.shape == mtf.convert_to_shape("batch:4,k:2") == indices.shape
    got_v, got_i = assert_same_under_layouts(graph, mesh, devices, [values, indices])
    np.testing.assert_array_equal(got_v, -np.sort(-XV, axis=1)[:, :2])
    np.testing.assert_array_equal(got_i, np.argsort(-XV, axis=1)[:, :2])
