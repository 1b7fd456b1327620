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

from mtf_core import dtypes
from mtf_core.autodiff import gradients
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.layers.losses import softmax_cross_entropy_with_logits
from mtf_core.ops.creation import placeholder
from mtf_core.ops.einsum import einsum
from mtf_core.ops.one_hot import one_hot
from mtf_core.ops.reduce import reduce_mean
from mtf_core.ops.unary import relu
from mtf_core.ops.variables import assign, get_variable
from mtf_core.shapes import Dimension

IMAGE_ROWS = 8
IMAGE_COLS = 8
NUM_CLASSES = 10


@dataclass
class MnistModel:
    """The mtf graph of one training step, and the tensors a caller feeds or reads."""

    graph: Graph
    mesh: Mesh
    images: Tensor  # placeholder [batch, rows, cols]
    labels: Tensor  # placeholder [batch], int32
    logits: Tensor  # [batch, classes]
    example_loss: Tensor  # [batch]: cross entropy per example
    loss: Tensor  # scalar: mean cross entropy
    updates: list[Operation] = field(default_factory=list)


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
    graph = Graph()
    mesh = Mesh(graph, "mnist_mesh")
    batch_dim = Dimension("batch", batch_size)
    rows_dim = Dimension("rows", IMAGE_ROWS)
    cols_dim = Dimension("cols", IMAGE_COLS)
    hidden_dim = Dimension("hidden", hidden_size)
    classes_dim = Dimension("classes", NUM_CLASSES)

    images = placeholder(mesh, [batch_dim, rows_dim, cols_dim], name="images")
    labels = placeholder(mesh, [batch_dim], dtype=dtypes.int32, name="labels")
    w1 = get_variable(mesh, "w1", [rows_dim, cols_dim, hidden_dim])
    w2 = get_variable(mesh, "w2", [hidden_dim, classes_dim])
    hidden = relu(einsum(images, w1, output_shape=[batch_dim, hidden_dim]))
    logits = einsum(hidden, w2, output_shape=[batch_dim, classes_dim])
    example_loss = softmax_cross_entropy_with_logits(
        logits, one_hot(labels, classes_dim), classes_dim
    )
    loss = reduce_mean(example_loss)

    updates: list[Operation] = []
    for w, g in zip([w1, w2], gradients([loss], [w1, w2])):
        assert g is not None  # the loss depends on both weights
        if momentum:
            v = get_variable(
                mesh,
                f"{w.operation.name}_velocity",
                w.shape,
                initializer=_zeros,
                trainable=False,
            )
            v_new = v * momentum + g
            updates.append(assign(v, v_new))
            updates.append(assign(w, w - v_new * lr))
        else:
            updates.append(assign(w, w - g * lr))
    return MnistModel(graph, mesh, images, labels, logits, example_loss, loss, updates)


def _zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    return np.zeros(list(shape), dtype=np.float32)
