"""Mesh TensorFlow's README network: one hidden layer over named dims
``batch``, ``rows``, ``cols``, ``hidden`` and ``classes``, for 8x8 digit images
(scikit-learn's digits in ``examples/mnist.py``, which trains it).

The graph needs no TensorFlow and no data: the planner service exports and
plans it (``mtf-planner export --model mnist``).

>>> m = build_mnist(batch_size=16, hidden_size=32)
>>> str(m.logits.shape), len(m.updates)
('batch:16,classes:10', 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import mtf_core as mtf

IMAGE_ROWS = 8
IMAGE_COLS = 8
NUM_CLASSES = 10


@dataclass
class MnistModel:
    """The mtf graph of one training step, and the tensors a caller feeds or reads."""

    graph: mtf.Graph
    mesh: mtf.Mesh
    images: mtf.Tensor  # placeholder [batch, rows, cols]
    labels: mtf.Tensor  # placeholder [batch], int32
    logits: mtf.Tensor  # [batch, classes]
    example_loss: mtf.Tensor  # [batch]: cross entropy per example
    loss: mtf.Tensor  # scalar: mean cross entropy
    updates: list[mtf.Operation] = field(default_factory=list)


def build_mnist(
    batch_size: int,
    hidden_size: int = 1024,
    lr: float = 0.1,
    momentum: float = 0.9,
) -> MnistModel:
    """Builds the README network and one SGD (with momentum) update of w1 and w2.

    ``momentum=0`` gives plain SGD, as in the Mesh TensorFlow README.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mnist_mesh")
    batch_dim = mtf.Dimension("batch", batch_size)
    rows_dim = mtf.Dimension("rows", IMAGE_ROWS)
    cols_dim = mtf.Dimension("cols", IMAGE_COLS)
    hidden_dim = mtf.Dimension("hidden", hidden_size)
    classes_dim = mtf.Dimension("classes", NUM_CLASSES)

    images = mtf.placeholder(mesh, [batch_dim, rows_dim, cols_dim], name="images")
    labels = mtf.placeholder(mesh, [batch_dim], dtype=mtf.int32, name="labels")
    w1 = mtf.get_variable(mesh, "w1", [rows_dim, cols_dim, hidden_dim])
    w2 = mtf.get_variable(mesh, "w2", [hidden_dim, classes_dim])
    hidden = mtf.relu(mtf.einsum(images, w1, output_shape=[batch_dim, hidden_dim]))
    logits = mtf.einsum(hidden, w2, output_shape=[batch_dim, classes_dim])
    example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, mtf.one_hot(labels, classes_dim), classes_dim
    )
    loss = mtf.reduce_mean(example_loss)

    updates: list[mtf.Operation] = []
    for w, g in zip([w1, w2], mtf.gradients([loss], [w1, w2])):
        assert g is not None  # the loss depends on both weights
        if momentum:
            v = mtf.get_variable(
                mesh,
                f"{w.operation.name}_velocity",
                w.shape,
                initializer=_zeros,
                trainable=False,
            )
            v_new = v * momentum + g
            updates.append(mtf.assign(v, v_new))
            updates.append(mtf.assign(w, w - v_new * lr))
        else:
            updates.append(mtf.assign(w, w - g * lr))
    return MnistModel(graph, mesh, images, labels, logits, example_loss, loss, updates)


def _zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    return np.zeros(list(shape), dtype=np.float32)
