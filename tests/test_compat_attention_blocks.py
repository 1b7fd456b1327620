"""``layers.local_self_attention_spatial_blocks`` and
``layers.multihead_self_attention_memory_compressed`` (Mesh TF's meanings):
values against NumPy, equal under the 1-D, 2-D and replicated layouts and a
split blocks dim (neighbour shifts only), and the cost model prices them as
they lower."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    ONE_DEVICE,
    LayoutCase,
    assert_communication_as_recorded,
    assert_same_under_layouts,
)
from test_cost_agreement import assert_agrees
from test_cost_graphs import Case

import mtf_core as mtf
from mtf_core import layers

pytestmark = pytest.mark.tf

D = mtf.Dimension
HEADS, KV = D("hidden", 4), D("d_kv", 2)
BLOCK_LAYOUTS = [*LAYOUTS, LayoutCase("blocks_split", "x:2", "wb:x")]


def _softmax(z: np.ndarray, extra_zero: bool = False) -> np.ndarray:
    m = z.max(-1, keepdims=True)
    if extra_zero:
        m = np.maximum(m, 0.0)
    e = np.exp(z - m)
    return e / (e.sum(-1, keepdims=True) + (np.exp(-m) if extra_zero else 0.0))


def _weights(values: list[np.ndarray]) -> list[np.ndarray]:
    """q, k, v, o from the combined [qkvo, heads, io, kv] variable."""
    (qkvo,) = values
    return [qkvo[i] for i in range(4)]


def _blocks_graph(mask_right: bool):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xv = np.random.RandomState(0).randn(4, 2, 3, 4).astype(np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "batch:4,wb:2,w:3,io:4")
    y = layers.local_self_attention_spatial_blocks(
        x, KV, HEADS, False, mask_right=mask_right, name="blocks"
    )
    return graph, mesh, x, xv, y


def _blocks_numpy(xv, wq, wk, wv, wo, mask_right: bool) -> np.ndarray:
    q, k, v = (np.einsum("bnwi,hik->bhnwk", xv, w) for w in (wq, wk, wv))
    zeros = np.zeros_like(k[:, :, :1])
    prev = (
        np.concatenate([zeros, k[:, :, :-1]], 2),
        np.concatenate([zeros, v[:, :, :-1]], 2),
    )
    nxt = (
        np.concatenate([k[:, :, 1:], zeros], 2),
        np.concatenate([v[:, :, 1:], zeros], 2),
    )
    if mask_right:
        mk = np.concatenate([prev[0], k], 3)
        mv = np.concatenate([prev[1], v], 3)
    else:
        mk = np.concatenate([prev[0], k, nxt[0]], 3)
        mv = np.concatenate([prev[1], v, nxt[1]], 3)
    logits = np.einsum("bhnwk,bhnmk->bhnwm", q, mk)
    if mask_right:  # this block's later positions are hidden
        w = q.shape[3]
        later = np.arange(w)[:, None] < np.arange(w)[None, :]
        logits[..., w:] += np.where(later, -1e9, 0.0)
    o = np.einsum("bhnwm,bhnmk->bhnwk", _softmax(logits), mv)
    return np.einsum("bhnwk,hik->bnwi", o, wo)


@pytest.mark.parametrize("mask_right", [False, True], ids=["both", "left"])
def test_local_self_attention_spatial_blocks_matches_numpy(
    devices: list[str], mask_right: bool
) -> None:
    graph, mesh, x, xv, y = _blocks_graph(mask_right)
    assert y.shape == x.shape
    (var,) = graph.all_variables
    got, qkvo = assert_same_under_layouts(
        graph, mesh, devices, [y, var.outputs[0]], layouts=BLOCK_LAYOUTS
    )
    want = _blocks_numpy(xv, *_weights([qkvo]), mask_right)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_split_blocks_exchange_halos_by_shifts(devices: list[str]) -> None:
    def build():
        graph, mesh, _, _, y = _blocks_graph(mask_right=False)
        return graph, mesh, y

    cases = [ONE_DEVICE, LayoutCase("blocks_split", "x:2", "wb:x")]
    rec = assert_communication_as_recorded(devices, build, cases)
    assert rec["one_device"] == []
    assert {r[0] for r in rec["blocks_split"]} == {"shift"}


def _compressed_graph(mask_right: bool):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xv = np.random.RandomState(1).randn(4, 8, 4).astype(np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "batch:4,length:8,io:4")
    y = layers.multihead_self_attention_memory_compressed(
        x, mask_right, 2, KV, HEADS, False, name="compressed"
    )
    return graph, mesh, x, xv, y


@pytest.mark.parametrize("mask_right", [False, True], ids=["all", "causal"])
def test_memory_compressed_attention_matches_numpy(
    devices: list[str], mask_right: bool
) -> None:
    graph, mesh, x, xv, y = _compressed_graph(mask_right)
    assert y.shape == x.shape
    (var,) = graph.all_variables
    got, qkvo = assert_same_under_layouts(graph, mesh, devices, [y, var.outputs[0]])
    wq, wk, wv, wo = _weights([qkvo])
    memory = xv.reshape(4, 4, 2, 4).mean(2)
    q = np.einsum("bli,hik->bhlk", xv, wq)
    k, v = (np.einsum("bmi,hik->bhmk", memory, w) for w in (wk, wv))
    logits = np.einsum("bhlk,bhmk->bhlm", q, k)
    if mask_right:  # group m ends at 2m + 1
        logits += np.where(
            np.arange(4)[None, :] * 2 + 1 > np.arange(8)[:, None], -1e9, 0
        )
    o = np.einsum("bhlm,bhmk->bhlk", _softmax(logits, extra_zero=True), v)
    want = np.einsum("bhlk,hik->bli", o, wo)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "build",
    [lambda: _blocks_graph(True), lambda: _compressed_graph(True)],
    ids=["spatial_blocks", "memory_compressed"],
)
def test_cost_model_prices_them_as_they_lower(devices: list[str], build) -> None:
    graph, mesh, _, _, y = build()
    layouts = [(c.mesh_shape, c.rules) for c in LAYOUTS]
    case = Case(graph, mesh, [y], layouts)
    for mesh_shape, rules in layouts:
        assert_agrees(case, mesh_shape, rules, devices)


def test_spatial_blocks_need_blocks_and_a_width() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with pytest.raises(mtf.ShapeError, match=r"needs \[batch..., num_w_blocks, w"):
        layers.local_self_attention_spatial_blocks(
            mtf.zeros(mesh, "w:3,io:4"), KV, HEADS, False
        )
