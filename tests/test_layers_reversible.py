"""The reversible residual block (mtf.layers.reversible_half_residual_and_swap):
with recompute_grads, the backward pass rebuilds each block's inputs from its
outputs, so the activations held do not grow with the blocks."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import ONE_DEVICE, assert_same_under_layouts, lower

import mtf_core as mtf
from cost_models.memory import memory_model
from mtf_core.comm import LayoutContext

pytestmark = pytest.mark.tf


def _revnet(blocks: int, recompute: bool) -> tuple:
    """``blocks`` reversible blocks, each ``f`` two dense layers whose
    weights it creates; the loss and its gradients for x and every weight."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.placeholder(mesh, "batch:64,hidden:8")
    x1, x1_back, x2, x2_back = x, None, x, None
    for i in range(blocks):

        def f(t: mtf.Tensor, i: int = i) -> mtf.Tensor:
            h = mtf.layers.dense(t, "mid:32", activation=mtf.tanh, name=f"up{i}")
            return mtf.layers.dense(h, "hidden:8", name=f"down{i}")

        x1, x1_back, x2, x2_back = mtf.layers.reversible_half_residual_and_swap(
            x1, x1_back, x2, x2_back, f, recompute_grads=recompute
        )
    loss = mtf.reduce_sum(mtf.square(x1 + x2))
    weights = [v.outputs[0] for v in graph.trainable_variables]
    grads = mtf.gradients([loss], [x, *weights])
    return graph, mesh, x, [loss, *grads]


def _activation_peak(graph: mtf.Graph, outputs: list) -> int:
    ctx = LayoutContext.make("all:1", "")
    return memory_model(graph, outputs).activation_peak_bytes(ctx)


def test_recomputed_blocks_give_the_same_loss_and_gradients(devices: list[str]) -> None:
    xv = np.random.RandomState(0).randn(64, 8).astype(np.float32)
    values = {}
    for recompute in (False, True):
        graph, mesh, x, outputs = _revnet(4, recompute)
        assert all(g is not None for g in outputs)
        values[recompute] = assert_same_under_layouts(
            graph, mesh, devices, outputs, {x: xv}
        )
    assert len(values[True]) == 1 + 1 + 4 * 4  # loss, x, 4 weights per block
    for kept, rebuilt in zip(values[False], values[True]):
        # x1 = y1 - f(x2) is rebuilt in float32: rounding, not a difference
        np.testing.assert_allclose(rebuilt, kept, rtol=1e-4, atol=1e-4)


def test_recomputed_blocks_hold_as_much_for_eight_blocks_as_for_four() -> None:
    peaks = {
        (blocks, recompute): _activation_peak(*_revnet(blocks, recompute)[::3])
        for blocks in (4, 8)
        for recompute in (False, True)
    }
    # Kept: each block holds f's input [batch, hidden] and its tanh
    # [batch, mid] for the backward pass, so 4 more blocks hold 4 more.
    assert peaks[8, False] - peaks[4, False] == 4 * (64 * 32 + 64 * 8) * 4
    # Rebuilt: nothing more is held for the backward pass; what grows is the
    # weights' gradients (up 8x32 + 32, down 32x8 + 8), outputs kept to the end.
    assert peaks[8, True] - peaks[4, True] == 4 * (8 * 32 + 32 + 32 * 8 + 8) * 4
    assert peaks[8, True] < 0.5 * peaks[8, False]


def test_the_backward_pass_runs_each_blocks_f_again(devices: list[str]) -> None:
    graph, mesh, x, outputs = _revnet(3, True)
    # forward 2 einsums per block; backward 2 again plus 4 for the gradients
    assert sum(op.op_type == "Einsum" for op in graph.operations) == 3 * (2 + 2 + 4)
    (loss, *_), _ = lower(
        graph, mesh, ONE_DEVICE, devices, outputs[:1], {x: np.ones((64, 8), np.float32)}
    )
    assert np.isfinite(loss)


def test_bad_blocks_are_refused_naming_why() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    a = mtf.placeholder(mesh, "batch:4,hidden:8")
    b = mtf.placeholder(mesh, "batch:4,other:8")
    with pytest.raises(mtf.ShapeError, match="must have one shape and dtype"):
        mtf.layers.reversible_half_residual_and_swap(a, None, b, None, lambda t: t)
    with pytest.raises(mtf.ShapeError, match="expected a Tensor of x1's shape"):
        mtf.layers.reversible_half_residual_and_swap(
            a, None, a, None, lambda t: mtf.reduce_sum(t, output_shape="batch:4")
        )
