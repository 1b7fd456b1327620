"""Embeddings and mtf_core's rate-only dropout."""

from __future__ import annotations

from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ConfigError
from mtf_core.graph import Mesh, Tensor
from mtf_core.layers._dims import dims
from mtf_core.layers.initializers import (
    named_initializer,
    normal_initializer,
    provided_or,
)
from mtf_core.ops.arguments import sized_dim
from mtf_core.ops.indexing import gather
from mtf_core.ops.random import dropout as random_dropout
from mtf_core.ops.variables import get_variable
from mtf_core.shapes import Shape


def embedding_weights(
    mesh: Mesh,
    vocab_dim: Any,
    output_dim: Any,
    variable_dtype: Any = None,
    name: str = "embedding",
    ensemble_dim: Any = None,
    initializer: Any = None,
    *,
    stddev: float = 1.0,
    dtype: Any = None,
) -> Tensor:
    """The ``[ensemble_dim..., vocab, output_dim]`` table of :func:`embedding`
    (Mesh TensorFlow's signature).  ``initializer`` defaults to a normal of
    ``stddev`` (clipped at 2 sigma), seeded by ``name``; ``variable_dtype``
    (a dtype or VariableDType) defaults to ``dtype`` or float32."""
    v = sized_dim(vocab_dim, f"embedding_weights {name!r}")
    d = sized_dim(output_dim, f"embedding_weights {name!r}")
    vd = dtypes.as_variable_dtype(
        variable_dtype if variable_dtype is not None else (dtype or "float32")
    )
    init = (
        provided_or("normal", stddev, normal_initializer(stddev, name))
        if initializer is None
        else initializer
    )
    shape = Shape([*dims(ensemble_dim), v, d])
    return get_variable(
        mesh, name, shape, vd, initializer=named_initializer(init, name)
    )


def embedding(
    indices: Tensor,
    vocab_dim: Any,
    output_dim: Any,
    variable_dtype: Any = None,
    name: str = "embedding",
    *,
    weights: Tensor | None = None,
    dtype: Any = None,
) -> Tensor:
    """Looks ``indices`` up in a learned ``[vocab, output_dim]`` table.

    A gather: when ``vocab`` is split, each device looks up the ids in its part
    of the table and one allreduce over the vocab axis combines them.
    """
    v = sized_dim(vocab_dim, f"embedding {name!r}")
    if weights is None:
        weights = embedding_weights(
            indices.mesh, v, output_dim, variable_dtype, name, dtype=dtype
        )
    return gather(weights, indices, v)


def dropout(x: Tensor, rate: float, noise_shape: Any = None) -> Tensor:
    """Zeroes each element with probability ``rate``, scales the rest by
    ``1/(1-rate)``.  ``rate == 0`` returns ``x`` unchanged (no random op)."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"dropout rate must be in [0, 1), got {rate!r}")
    if rate == 0.0:
        return x
    return random_dropout(x, rate=rate, noise_shape=noise_shape)
