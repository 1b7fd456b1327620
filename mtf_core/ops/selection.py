"""Picking elements along a dimension: ``top_1``, ``nth_largest_element``,
``reduce_first``, ``sample_with_temperature``, and the 1-D pooling/striding
helpers built on them (Mesh TensorFlow's names and meanings).

Each is composed of existing ops (``top_k``, ``range``, ``reduce_*``,
``reshape``, ``random_uniform``), so each part already says what it costs and
communicates under a layout: e.g. ``reduce_first`` over a split dim is one
allreduce of the result, like any sum over a split dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops.arguments import check_int, dim_of
from mtf_core.ops.indexing import gather, mtf_range
from mtf_core.ops.random import random_uniform
from mtf_core.ops.reduce import reduce_mean, reduce_sum
from mtf_core.ops.reshape import replace_dimensions, reshape
from mtf_core.ops.top_k import argmax, top_k
from mtf_core.shapes import Dimension


def top_1(
    x: Tensor, reduced_dim: Any, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """The largest value along ``reduced_dim`` and its int32 index (the first
    on ties), both with ``reduced_dim`` dropped."""
    d = dim_of(x, reduced_dim, "top_1")
    one = Dimension("_one", 1)
    values, indices = top_k(x, d, one, name=name)
    return (
        reshape(values, values.shape - [one]),
        reshape(indices, indices.shape - [one]),
    )


def nth_largest_element(
    x: Tensor, n: int, reduced_dim: Any, name: str | None = None
) -> Tensor:
    """The ``n``-th largest value along ``reduced_dim`` (``n`` counts from 0,
    so ``n=0`` is the maximum); ``reduced_dim`` is dropped."""
    d = dim_of(x, reduced_dim, "nth_largest_element")
    n = check_int(n, "nth_largest_element: n")
    if n >= d.size:
        raise ShapeError(
            f"nth_largest_element: n={n} but dimension {d} of {x.name} has only "
            f"{d.size} elements"
        )
    k_dim = Dimension("_top_k_", n + 1)
    values, _ = top_k(x, d, k_dim, name=name)
    return gather(values, n, k_dim)


def nth_smallest_element(
    x: Tensor, n: int, reduced_dim: Any, name: str | None = None
) -> Tensor:
    """The ``n``-th smallest value along ``reduced_dim`` (``n=0``: the minimum)."""
    return ew.negative(nth_largest_element(ew.negative(x), n, reduced_dim, name))


def reduce_first(tensor: Tensor, reduced_dim: Any) -> Tensor:
    """The first element along ``reduced_dim`` (which is dropped).

    A masked sum, so a split ``reduced_dim`` costs one allreduce of the result
    (every device but the first contributes zeros).
    """
    d = dim_of(tensor, reduced_dim, "reduce_first")
    first = ew.cast(ew.equal(mtf_range(tensor.mesh, d, "int32"), 0), tensor.dtype)
    return reduce_sum(tensor * first, reduced_dim=d)


def sample_with_temperature(
    logits: Tensor, dim: Any, temperature: float = 1.0, name: str | None = None
) -> Tensor:
    """An int32 sample along ``dim`` from ``softmax(logits / temperature)``;
    ``temperature=0`` is ``argmax``.  ``dim`` is dropped; the other dims are
    batch dims.

    Gumbel-max: ``argmax(logits + temperature * gumbel_noise)``, whose argmax
    is distributed as the softmax of ``logits / temperature``.
    """
    d = dim_of(logits, dim, "sample_with_temperature")
    if not isinstance(temperature, (int, float)) or not temperature >= 0.0:
        raise ArgumentError(
            f"sample_with_temperature: temperature {temperature!r} must be a "
            "number >= 0"
        )
    if temperature != 0.0:
        if logits.dtype != dtypes.float32:
            logits = ew.cast(logits, dtypes.float32)
        u = random_uniform(
            logits.mesh, logits.shape, minval=1e-9, maxval=1.0, name=name
        )
        gumbel = ew.negative(ew.log(ew.negative(ew.log(u))))
        logits = logits + gumbel * float(temperature)
    return argmax(logits, d, name)


def pool_tensor_1d(
    tensor: Tensor,
    pool_dim: Any,
    reduce_fn: Callable[..., Tensor] = reduce_mean,
    pool_size: int = 2,
) -> Tensor:
    """Pools windows of ``pool_size`` consecutive positions of ``pool_dim``
    with ``reduce_fn(t, reduced_dim=...)``; ``pool_dim`` keeps its name and
    shrinks ``pool_size`` times (e.g. mean of ``[2, 5, 9, 15]`` by 2 is
    ``[3.5, 12]``)."""
    d = dim_of(tensor, pool_dim, "pool_tensor_1d")
    pool_size = check_int(pool_size, "pool_tensor_1d: pool_size", 1)
    if d.size % pool_size:
        raise ShapeError(
            f"pool_tensor_1d: pool_size {pool_size} does not divide dimension {d} "
            f"of {tensor.name}"
        )
    high = Dimension(d.name, d.size // pool_size)
    low = Dimension("_low", pool_size)
    return reduce_fn(replace_dimensions(tensor, d, [high, low]), reduced_dim=low)


def stride_tensor_1d(tensor: Tensor, pool_dim: Any, pool_size: int = 2) -> Tensor:
    """Keeps every ``pool_size``-th position of ``pool_dim`` (the first of each
    window): ``[2, 5, 9, 15]`` by 2 is ``[2, 9]``."""
    return pool_tensor_1d(tensor, pool_dim, reduce_first, pool_size)
