"""Normalization layers: ``layer_norm``, ``rms_norm``, ``batch_norm``.

Each is mtf reductions over named dims: when a normalized dim is split, its
mean is a sum over the split (one allreduce), priced like any other.
"""

from __future__ import annotations

from typing import Any

from mtf_core.graph import Tensor
from mtf_core.layers._dims import dim_in
from mtf_core.layers.initializers import (
    RandomInitializer,
    named_initializer,
    ones_initializer,
    zeros_initializer,
)
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.einsum import einsum
from mtf_core.ops.reshape import rename_dimension
from mtf_core.ops.variables import Assign, assign, get_variable
from mtf_core.shapes import Shape


def _norm_variable(
    x: Tensor, name: str, shape: Shape, initializer: Any, trainable: bool = True
) -> Tensor:
    """A normalization's learned (or moving) statistic of ``shape``, read in
    ``x``'s dtype."""
    return get_variable(
        x.mesh,
        name,
        shape,
        activation_dtype=x.dtype,
        initializer=initializer,
        trainable=trainable,
    )


def layer_norm(
    x: Tensor, dim: Any, epsilon: float = 1e-6, name: str = "layer_prepostprocess"
) -> Tensor:
    """Normalizes over ``dim`` and applies a learned scale and bias (both
    ``[dim]``, named ``{name}_scale`` / ``{name}_bias``)."""
    d = dim_in(x, dim, f"layer_norm {name!r}")
    scale = _norm_variable(x, f"{name}_scale", Shape([d]), ones_initializer())
    bias = _norm_variable(x, f"{name}_bias", Shape([d]), zeros_initializer())
    rest = x.shape - [d]
    mean = red.reduce_mean(x, output_shape=rest)
    centered = x - mean
    var = red.reduce_mean(ew.square(centered), output_shape=rest)
    return centered * ew.rsqrt(var + epsilon) * scale + bias


def rms_norm(
    x: Tensor, dim: Any, epsilon: float = 1e-6, name: str = "rms_norm"
) -> Tensor:
    """``x / sqrt(mean(x^2 over dim) + eps) * scale`` (no centering, no bias)."""
    d = dim_in(x, dim, f"rms_norm {name!r}")
    scale = _norm_variable(x, f"{name}_scale", Shape([d]), ones_initializer())
    ms = red.reduce_mean(ew.square(x), output_shape=x.shape - [d])
    return x * ew.rsqrt(ms + epsilon) * scale


def batch_norm(
    x: Tensor,
    is_training: bool,
    momentum: float,
    epsilon: float = 1e-9,
    dims_idx_start: int = 0,
    dims_idx_end: int = -1,
    init_zero: bool = False,
    name: str | None = None,
) -> tuple[Tensor, list[Assign]]:
    """Batch normalization over ``x``'s dims ``[dims_idx_start,
    dims_idx_end)`` (by default all but the last), as Mesh TensorFlow does.

    Returns the normalized tensor and the assignments that update the moving
    mean and variance (``momentum`` decay) when ``is_training``; at eval time
    the moving statistics normalize and the list is empty.  Scale, bias and
    the statistics have the shape of the dims not normalized.
    """
    name = name or "batch_norm"
    norm = list(x.shape.dims[dims_idx_start:dims_idx_end])
    kept = x.shape - norm

    def var(suffix: str, init: Any, trainable: bool = True) -> Tensor:
        return _norm_variable(x, f"{name}_{suffix}", kept, init, trainable)

    scale = var("scale", zeros_initializer() if init_zero else ones_initializer())
    bias = var("bias", zeros_initializer())
    moving_mean = var(
        "moving_mean",
        named_initializer(RandomInitializer("normal", 1.0), f"{name}_moving_mean"),
        trainable=False,
    )
    moving_var = var("moving_variance", ones_initializer(), trainable=False)
    if not is_training:
        norm_x = (x - moving_mean) * ew.rsqrt(moving_var + epsilon)
        return norm_x * scale + bias, []
    mean = red.reduce_mean(x, output_shape=kept)
    variance = red.reduce_mean(ew.square(x - mean), output_shape=kept)
    norm_x = (x - mean) * ew.rsqrt(variance + epsilon)
    updates = [
        assign(moving_mean, moving_mean * momentum + mean * (1.0 - momentum)),
        assign(moving_var, moving_var * momentum + variance * (1.0 - momentum)),
    ]
    return norm_x * scale + bias, updates


def corr(
    x: Tensor, dim: Any, epsilon: float = 1e-20, name: str = "pearson_correlation"
) -> Tensor:
    """Pearson correlation between the positions of ``dim`` (the random
    variables), over all other dims (the samples): ``[dim_1, dim_2]``."""
    del name
    d = dim_in(x, dim, "corr")
    centered = x - red.reduce_mean(x, output_shape=[d])
    a = rename_dimension(centered, d.name, f"{d.name}_1")
    b = rename_dimension(centered, d.name, f"{d.name}_2")
    da, db = (
        a.shape.get_dim_by_name(f"{d.name}_1"),
        b.shape.get_dim_by_name(f"{d.name}_2"),
    )

    def norm(z: Tensor, zd: Any) -> Tensor:
        return ew.sqrt(red.reduce_sum(ew.square(z), output_shape=[zd])) + epsilon

    pair = Shape([da, db])
    return einsum([a, b], output_shape=pair) / einsum(
        [norm(a, da), norm(b, db)], output_shape=pair
    )
