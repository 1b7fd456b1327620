"""Layers built from mtf ops (Mesh TensorFlow's ``mtf.layers``).

>>> # h = mtf.layers.dense(x, new_dims=[hidden], name="h")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.einsum import einsum
from mtf_core.ops.variables import get_variable
from mtf_core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape


def _dims(x: Any) -> list[Dimension]:
    if x is None:
        return []
    if isinstance(x, (Dimension, str)):
        d = convert_to_dimension(x)
        return [d] if d is not None else []
    return list(convert_to_shape(x).dims)


def dense(
    x: Tensor,
    new_dims: Any = None,
    reduced_dims: Any = None,
    use_bias: bool = True,
    activation: Any = None,
    name: str = "dense",
    kernel_initializer: Any = None,
    output_dim: Any = None,
) -> Tensor:
    """``activation(x @ w + b)``: reduces ``reduced_dims`` (default: x's last
    dim) and adds ``new_dims`` (``output_dim`` is Mesh TensorFlow's old name)."""
    new = _dims(new_dims if new_dims is not None else output_dim)
    reduced = _dims(reduced_dims) if reduced_dims is not None else [x.shape.dims[-1]]
    w = get_variable(
        x.mesh, f"{name}_kernel", Shape(reduced + new), x.dtype, kernel_initializer
    )
    out_shape = (x.shape - reduced) + Shape(new)
    y = einsum([x, w], output_shape=out_shape)
    if use_bias:
        b = get_variable(
            x.mesh, f"{name}_bias", Shape(new), x.dtype, _zeros_initializer()
        )
        y = y + b
    if activation is not None:
        y = activation(y)
    return y


def _zeros_initializer() -> Any:
    def init(shape: Sequence[int], dtype: Any) -> Any:
        import numpy as np

        return np.zeros(list(shape), dtype="float32")

    return init


def _ones_initializer() -> Any:
    def init(shape: Sequence[int], dtype: Any) -> Any:
        import numpy as np

        return np.ones(list(shape), dtype="float32")

    return init


def layer_norm(
    x: Tensor, dim: Any, epsilon: float = 1e-6, name: str = "layer_norm"
) -> Tensor:
    """Normalizes over ``dim`` and applies a learned scale and bias."""
    d = convert_to_dimension(dim)
    assert d is not None
    scale = get_variable(
        x.mesh, f"{name}_scale", Shape([d]), x.dtype, _ones_initializer()
    )
    bias = get_variable(
        x.mesh, f"{name}_bias", Shape([d]), x.dtype, _zeros_initializer()
    )
    rest = x.shape - [d]
    mean = red.reduce_mean(x, output_shape=rest)
    centered = x - mean
    var = red.reduce_mean(ew.square(centered), output_shape=rest)
    return centered * ew.rsqrt(var + epsilon) * scale + bias


def softmax_cross_entropy_with_logits(
    logits: Tensor, targets: Tensor, vocab_dim: Any
) -> Tensor:
    """Per-example cross entropy; ``targets`` is a distribution (e.g. one_hot)."""
    d = convert_to_dimension(vocab_dim)
    assert d is not None
    lse = red.reduce_logsumexp(logits, reduced_dim=d)
    return lse - red.reduce_sum(logits * targets, reduced_dim=d)
