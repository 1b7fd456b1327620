"""Pooling layers: non-overlapping windows (stride = window), each pooled dim
reshaped into ``[dim / k, k]`` and reduced, one dim at a time, so any layout
that splits a pooled dim into whole windows works."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.errors import ShapeError
from mtf_core.graph import Tensor
from mtf_core.ops import reduce as red
from mtf_core.ops.reshape import replace_dimensions
from mtf_core.shapes import Dimension


def _pool(x: Tensor, ksize: Sequence[int], reduce: Any, what: str) -> Tensor:
    """Non-overlapping pooling of the ``len(ksize)`` dims before the last."""
    ksize = [int(k) for k in ksize]
    if all(k == 1 for k in ksize):
        return x
    if x.shape.ndims < len(ksize) + 1:
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] needs {len(ksize)} spatial dims and channels"
        )
    pooled = list(x.shape.dims[-1 - len(ksize) : -1])
    for d, k in zip(pooled, ksize):
        if k < 1 or d.size % k:
            raise ShapeError(
                f"{what}: window {k} does not divide dimension {d} of {x.name}"
            )
    # One pooled dim at a time: the rank grows by one at most (TensorFlow's
    # CPU kernels stop at rank 8 or so).
    for d, k in zip(pooled, ksize):
        if k == 1:
            continue
        w = Dimension(f"_{d.name}_window", k)
        x = replace_dimensions(x, d, [Dimension(d.name, d.size // k), w])
        x = reduce(x, reduced_dim=w)
    return x


def max_pool2d(
    x: Tensor, ksize: Sequence[int] = (2, 2), name: str = "max_pool2d"
) -> Tensor:
    """2-D max pooling of ``x [batch..., h, w, channels]`` with windows
    ``ksize`` and the same strides (which must divide ``h`` and ``w``)."""
    return _pool(x, ksize, red.reduce_max, name)


def max_pool3d(
    x: Tensor, ksize: Sequence[int] = (2, 2, 2), name: str = "max_pool3d"
) -> Tensor:
    """3-D max pooling of ``x [batch..., d, h, w, channels]``."""
    return _pool(x, ksize, red.reduce_max, name)


def avg_pool2d(
    x: Tensor, ksize: Sequence[int] = (2, 2), name: str = "avg_pool2d"
) -> Tensor:
    """2-D average pooling of ``x [batch..., h, w, channels]``."""
    return _pool(x, ksize, red.reduce_mean, name)


def avg_pool3d(
    x: Tensor, ksize: Sequence[int] = (2, 2, 2), name: str = "avg_pool3d"
) -> Tensor:
    """3-D average pooling of ``x [batch..., d, h, w, channels]``."""
    return _pool(x, ksize, red.reduce_mean, name)
