"""``layers.conv2d_transpose_with_blocks`` / ``conv3d_transpose_with_blocks``
(Mesh TF's U-Net upsamples with them): the blocked result is TensorFlow's
transposed convolution of the whole image, blocked the same way, under
layouts that split the blocks dims (no communication in the forward pass),
the batch and both; filters other than the strides are refused by name."""

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
BLOCK_LAYOUTS = [
    ONE_DEVICE,
    LayoutCase("batch_split", "x:2", "batch:x"),
    LayoutCase("h_blocks_split", "x:2", "hb:x"),
    LayoutCase("blocks_2d", "x:2;y:2", "hb:x;wb:y"),
]


def _blocked_2d(graph_seed: int = 0):
    """A [batch:2, 4, 4, c:3] image cut into 2 x 2 blocks of 2 x 2."""
    image = np.random.RandomState(graph_seed).randn(2, 4, 4, 3).astype(np.float32)
    blocks = image.reshape(2, 2, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, blocks, "batch:2,hb:2,wb:2,h:2,w:2,c:3")
    return graph, mesh, x, image


def test_conv2d_transpose_with_blocks_is_the_whole_images_transpose(
    devices: list[str],
) -> None:
    import tensorflow as tf

    graph, mesh, x, image = _blocked_2d()
    y = layers.conv2d_transpose_with_blocks(
        x, D("out", 4), h_blocks_dim=D("hb", 2), w_blocks_dim=D("wb", 2), name="up"
    )
    assert y.shape == mtf.Shape("batch:2,hb:2,wb:2,h:4,w:4,out:4")
    (dx,) = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x])
    got, got_dx = assert_same_under_layouts(
        graph, mesh, devices, [y, dx], layouts=BLOCK_LAYOUTS
    )
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    (var,) = graph.all_variables
    filters = low.variables.export(var)  # [2, 2, out, c]
    xt = tf.constant(image)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        whole = tf.nn.conv2d_transpose(xt, filters, [2, 8, 8, 4], 2, "SAME")
        loss = tf.reduce_sum(tf.square(whole))
    want = whole.numpy().reshape(2, 2, 4, 2, 4, 4).transpose(0, 1, 3, 2, 4, 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    want_dx = tape.gradient(loss, xt).numpy()
    want_dx = want_dx.reshape(2, 2, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-4, atol=1e-4)


def test_split_blocks_upsample_without_communication(devices: list[str]) -> None:
    def build():
        graph, mesh, x, _ = _blocked_2d()
        y = layers.conv2d_transpose_with_blocks(
            x, D("out", 4), h_blocks_dim=D("hb", 2), w_blocks_dim=D("wb", 2)
        )
        return graph, mesh, y

    rec = assert_communication_as_recorded(devices, build, BLOCK_LAYOUTS)
    assert all(r == [] for r in rec.values()), rec


def test_conv3d_transpose_with_blocks_is_the_whole_volumes_transpose(
    devices: list[str],
) -> None:
    import tensorflow as tf

    volume = np.random.RandomState(1).randn(1, 4, 4, 2, 2).astype(np.float32)
    blocks = volume.reshape(1, 2, 2, 2, 2, 1, 2, 2).transpose(0, 1, 3, 5, 2, 4, 6, 7)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, blocks, "batch:1,db:2,hb:2,wb:1,d:2,h:2,w:2,c:2")
    y = layers.conv3d_transpose_with_blocks(
        x, D("out", 3), d_blocks_dim=D("db", 2), h_blocks_dim=D("hb", 2), name="up3"
    )
    assert y.shape == mtf.Shape("batch:1,db:2,hb:2,wb:1,d:4,h:4,w:4,out:3")
    layouts = [ONE_DEVICE, LayoutCase("blocks_2d", "x:2;y:2", "db:x;hb:y")]
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y], layouts=layouts)
    _, low = lower(graph, mesh, ONE_DEVICE, devices, [y])
    filters = low.variables.export(graph.all_variables[0])  # [2, 2, 2, out, c]
    whole = tf.nn.conv3d_transpose(volume, filters, [1, 8, 8, 4, 3], 2, "SAME")
    want = (
        whole.numpy().reshape(1, 2, 4, 2, 4, 1, 4, 3).transpose(0, 1, 3, 5, 2, 4, 6, 7)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_transpose_with_blocks_refuses_overlapping_filters_and_valid_padding() -> None:
    _, _, x, _ = _blocked_2d()
    hb = D("hb", 2)
    with pytest.raises(mtf.ShapeError, match=r"filter_size \(4, 4\) differs from "):
        layers.conv2d_transpose_with_blocks(x, D("out", 4), (4, 4), h_blocks_dim=hb)
    with pytest.raises(mtf.ShapeError, match="needs padding 'SAME', got 'VALID'"):
        layers.conv2d_transpose_with_blocks(
            x, D("out", 4), padding="VALID", h_blocks_dim=hb
        )
    # without blocks dims it is conv2d_transpose, any filter
    y = layers.conv2d_transpose_with_blocks(x, D("out", 4), (4, 4), name="plain")
    assert y.shape.get_dim_by_name("h").size == 4


def test_mesh_tensorflow_layers_have_them() -> None:
    import mtf_core.compat as compat

    compat.install()
    try:
        import mesh_tensorflow as mtf_tf

        assert mtf_tf.layers.conv2d_transpose_with_blocks is (
            layers.conv2d_transpose_with_blocks
        )
        assert mtf_tf.layers.conv3d_transpose_with_blocks is (
            layers.conv3d_transpose_with_blocks
        )
    finally:
        compat.uninstall()
