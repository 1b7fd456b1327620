"""``layers.masked_local_attention_1d_incremental`` (one decode step of local
attention over a ring of the last ``window`` keys) and
``layers.local_2d_halo_exchange``: values against the full layer and NumPy,
equal under the 1-D, 2-D and replicated layouts."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import (
    ONE_DEVICE,
    LayoutCase,
    assert_communication_as_recorded,
    assert_same_under_layouts,
    lower,
)

import mtf_core as mtf
from mtf_core import layers

pytestmark = pytest.mark.tf

D = mtf.Dimension
WINDOW = 3


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_incremental_local_attention_steps_equal_the_layer_of_window_blocks(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xv = np.random.RandomState(0).randn(8, 6, 4).astype(np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "batch:8,length:6,io:4")
    heads, kv, length = D("hidden", 4), D("d_kv", 2), D("length", 6)
    params = layers.multihead_attention_params(
        mesh, heads, D("io", 4), kv, "float32", name="local"
    )
    # blocks of WINDOW positions (two here): each position sees the last
    # WINDOW positions, zeros before the first, as the ring does
    full = layers.masked_local_attention_1d(
        x, kv, heads, False, window_size=WINDOW, length_per_split=WINDOW, params=params
    )
    ring = mtf.Shape([D("batch", 8), heads, D("window", WINDOW), kv])
    k = v = mtf.zeros(mesh, ring)
    steps = []
    for t in range(6):
        step = mtf.constant(mesh, t, (), "int32")
        y, k, v = layers.masked_local_attention_1d_incremental(
            mtf.gather(x, step, length), k, v, step, params=params
        )
        assert y.shape == mtf.Shape("batch:8,io:4") and k.shape == ring
        steps.append(y)
    got = assert_same_under_layouts(graph, mesh, devices, [full, *steps, *params])
    for t in range(6):
        np.testing.assert_allclose(got[1 + t], got[0][:, t], rtol=1e-5, atol=1e-5)
    # step 0: this key plus WINDOW - 1 empty (zero) slots, as in Mesh TF
    wq, wk, wv, wo = got[7:]
    q, k0, v0 = (np.einsum("bi,hik->bhk", xv[:, 0], w) for w in (wq, wk, wv))
    logits = np.concatenate(
        [np.einsum("bhk,bhk->bh", q, k0)[..., None], np.zeros((8, 4, WINDOW - 1))],
        -1,
    )
    o = _softmax(logits)[..., :1] * v0
    want = np.einsum("bhk,hik->bi", o, wo)
    np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-5)


def test_incremental_local_attention_makes_its_weights_and_checks_the_ring() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "batch:2,io:4")
    ring = mtf.Shape("batch:2,heads:2,window:3,d_kv:2")
    step = mtf.constant(mesh, 0, (), "int32")
    layers.masked_local_attention_1d_incremental(
        x, mtf.zeros(mesh, ring), mtf.zeros(mesh, ring), step, name="dec"
    )
    assert [v.name for v in graph.all_variables] == ["dec_qkvo"]
    with pytest.raises(mtf.ShapeError, match="prev_v .*window:2.* differs from prev_k"):
        layers.masked_local_attention_1d_incremental(
            x,
            mtf.zeros(mesh, ring),
            mtf.zeros(mesh, "batch:2,heads:2,window:2,d_kv:2"),
            step,
        )


def _blocks(mesh):
    image = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
    blocks = image.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3)  # [hb, wb, h, w]
    batch = np.stack([blocks, -blocks])  # two images
    x = mtf.import_tf_tensor(mesh, batch, "batch:2,hidden:2,wb:2,h:2,w:2")
    return image, x


@pytest.mark.parametrize("mask_right", [True, False], ids=["left_only", "both"])
def test_local_2d_halo_exchange_gives_each_block_its_neighbours(
    devices: list[str], mask_right: bool
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    image, x = _blocks(mesh)
    k, v = layers.local_2d_halo_exchange(
        x, -x, D("hidden", 2), D("h", 2), D("wb", 2), D("w", 2), mask_right
    )
    layouts = [
        ONE_DEVICE,
        LayoutCase("batch_split", "x:2", "batch:x"),
        LayoutCase("h_blocks_split", "x:2", "hidden:x"),
        LayoutCase("blocks_2d", "x:2;y:2", "hidden:x;wb:y"),
    ]
    got_k, got_v = assert_same_under_layouts(
        graph, mesh, devices, [k, v], layouts=layouts
    )
    np.testing.assert_array_equal(got_v, -got_k)
    side = 4 if mask_right else 6
    assert got_k.shape == (2, 2, 2, side, side)
    padded = np.pad(image, [(2, 0 if mask_right else 2)] * 2)
    for i in range(2):
        for j in range(2):
            window = padded[2 * i : 2 * i + side, 2 * j : 2 * j + side]
            np.testing.assert_array_equal(got_k[0, i, j], window)
            np.testing.assert_array_equal(got_k[1, i, j], -window)


def test_local_2d_halo_exchange_without_blocks_dims_pads(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _, x = _blocks(mesh)
    k, _ = layers.local_2d_halo_exchange(x, x, None, D("h", 2), None, D("w", 2), True)
    (got,) = lower(graph, mesh, ONE_DEVICE, devices, [k])[0]
    assert got.shape == (2, 2, 2, 4, 4)
    assert not got[..., :2, :].any() and not got[..., :, :2].any()


def test_local_2d_halo_exchange_shifts_between_neighbours_when_split(
    devices: list[str],
) -> None:
    def build():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        _, x = _blocks(mesh)
        k, _ = layers.local_2d_halo_exchange(
            x, x, D("hidden", 2), D("h", 2), D("wb", 2), D("w", 2), True
        )
        return graph, mesh, k

    cases = [ONE_DEVICE, LayoutCase("h_blocks_split", "model:2", "hidden:model")]
    rec = assert_communication_as_recorded(devices, build, cases)
    assert rec["one_device"] == []
    assert rec["h_blocks_split"] and {r[0] for r in rec["h_blocks_split"]} == {"shift"}
