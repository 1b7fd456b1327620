"""Layers built from mtf ops (Mesh TensorFlow's ``mtf.layers``).

Every layer is plain mtf ops over named dims, so it lowers under any layout;
which dims get split is the layout's business, not the layer's.  Weights are
mtf variables with deterministic initializers (seeded by the variable's name),
so a model starts from the same values whatever mesh it is laid out on.

>>> import mtf_core as mtf
>>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
>>> x = mtf.zeros(mesh, "batch:2,d_model:4")
>>> str(mtf.layers.dense(x, new_dims="d_ff:8", name="ff").shape)
'batch:2,d_ff:8'
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mtf_core.errors import ConfigError, ShapeError
from mtf_core.graph import Mesh, Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.arguments import sized_dim
from mtf_core.ops.creation import constant
from mtf_core.ops.einsum import einsum
from mtf_core.ops.indexing import gather
from mtf_core.ops.random import dropout as random_dropout
from mtf_core.ops.reshape import rename_dimension
from mtf_core.ops.variables import get_variable
from mtf_core.shapes import (
    Dimension,
    Shape,
    convert_to_dimension,
    convert_to_shape,
    dimension_name,
)

# --------------------------------------------------------------------------
# initializers: callable(shape, dtype) -> full numpy value
# --------------------------------------------------------------------------


def _zeros_initializer() -> Any:
    def init(shape: Sequence[int], dtype: Any) -> Any:
        return np.zeros(list(shape), dtype="float32")

    return init


def _ones_initializer() -> Any:
    def init(shape: Sequence[int], dtype: Any) -> Any:
        return np.ones(list(shape), dtype="float32")

    return init


def normal_initializer(stddev: float, seed_name: str) -> Callable[..., np.ndarray]:
    """Truncated-at-2-sigma normal values, seeded by ``seed_name`` (deterministic,
    so every layout starts from the same weights)."""
    seed = zlib.crc32(seed_name.encode())

    def init(shape: Sequence[int], dtype: Any) -> np.ndarray:
        rng = np.random.default_rng(seed)
        v = rng.standard_normal(list(shape), dtype=np.float32)
        return np.clip(v, -2.0, 2.0) * np.float32(stddev)

    return init


def _dims(x: Any) -> list[Dimension]:
    if x is None:
        return []
    if isinstance(x, (Dimension, str)) and not (isinstance(x, str) and "," in x):
        d = convert_to_dimension(x)
        return [d] if d is not None else []
    return list(convert_to_shape(x).dims)


def _dim_refs(x: Any) -> list[Any]:
    """Dims given as names or dims (a list, a Shape, one of them, or a shape
    string), without converting bare names, which have no size."""
    if isinstance(x, (list, tuple)) and not (
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int)
    ):
        return list(x)
    if isinstance(x, str) and ":" not in x:
        return [x]
    return _dims(x)


def _dim_in(x: Tensor, dim: Any, what: str) -> Dimension:
    """The dimension of ``x`` named like ``dim`` (a name or a Dimension)."""
    name = dimension_name(dim)
    if name not in x.shape.dimension_names:
        raise ShapeError(f"{what}: {x.name} [{x.shape}] has no dimension {name!r}")
    return x.shape.get_dim_by_name(name)


# --------------------------------------------------------------------------
# dense, norms
# --------------------------------------------------------------------------


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
    dim) and adds ``new_dims`` (``output_dim`` is Mesh TensorFlow's old name).

    The kernel has shape ``reduced_dims + new_dims``; by default it is drawn
    from a normal distribution with stddev ``1/sqrt(size of reduced_dims)``.
    """
    new = _dims(new_dims if new_dims is not None else output_dim)
    if not new:
        raise ShapeError(f"dense {name!r}: give new_dims (the output dimensions)")
    reduced = (
        [_dim_in(x, d, f"dense {name!r}") for d in _dim_refs(reduced_dims)]
        if reduced_dims is not None
        else [x.shape.dims[-1]]
    )
    for d in new:
        if d.name in x.shape.dimension_names and d not in reduced:
            raise ShapeError(
                f"dense {name!r}: new dimension {d} is already a dimension of "
                f"{x.name} [{x.shape}] and is not reduced"
            )
    kname = f"{name}_kernel"
    if kernel_initializer is None:
        fan_in = math.prod(d.size for d in reduced)
        kernel_initializer = normal_initializer(fan_in**-0.5, kname)
    w = get_variable(x.mesh, kname, Shape(reduced + new), x.dtype, kernel_initializer)
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


def layer_norm(
    x: Tensor, dim: Any, epsilon: float = 1e-6, name: str = "layer_norm"
) -> Tensor:
    """Normalizes over ``dim`` and applies a learned scale and bias."""
    d = _dim_in(x, dim, f"layer_norm {name!r}")
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


def rms_norm(
    x: Tensor, dim: Any, epsilon: float = 1e-6, name: str = "rms_norm"
) -> Tensor:
    """``x / sqrt(mean(x^2 over dim) + eps) * scale`` (no centering, no bias)."""
    d = _dim_in(x, dim, f"rms_norm {name!r}")
    scale = get_variable(
        x.mesh, f"{name}_scale", Shape([d]), x.dtype, _ones_initializer()
    )
    ms = red.reduce_mean(ew.square(x), output_shape=x.shape - [d])
    return x * ew.rsqrt(ms + epsilon) * scale


# --------------------------------------------------------------------------
# one-hot, embedding, dropout
# --------------------------------------------------------------------------


def _one_hot_by_compare(
    ids: Tensor, vocab: Dimension, on_value: float, off_value: float, dtype: Any
) -> Tensor:
    # A comparison with a [vocab] range: every op here splits over vocab, so a
    # vocab-split layout needs no communication to build it.
    positions = constant(ids.mesh, np.arange(vocab.size), Shape([vocab]), ids.dtype)
    hit = ew.cast(ew.equal(ids, positions), dtype)
    if on_value == 1.0 and off_value == 0.0:
        return hit
    return hit * (on_value - off_value) + off_value


def embedding_weights(
    mesh: Mesh,
    vocab_dim: Any,
    output_dim: Any,
    name: str = "embedding",
    dtype: Any = "float32",
    stddev: float = 1.0,
) -> Tensor:
    """The ``[vocab, output_dim]`` table of :func:`embedding`."""
    v = sized_dim(vocab_dim, f"embedding_weights {name!r}")
    d = sized_dim(output_dim, f"embedding_weights {name!r}")
    return get_variable(
        mesh, name, Shape([v, d]), dtype, normal_initializer(stddev, name)
    )


def embedding(
    ids: Tensor,
    vocab_dim: Any,
    output_dim: Any,
    name: str = "embedding",
    dtype: Any = "float32",
    weights: Tensor | None = None,
) -> Tensor:
    """Looks ``ids`` up in a learned ``[vocab, output_dim]`` table.

    A gather: when ``vocab`` is split, each device looks up the ids in its part
    of the table and one allreduce over the vocab axis combines them.
    """
    v = sized_dim(vocab_dim, f"embedding {name!r}")
    if weights is None:
        weights = embedding_weights(ids.mesh, v, output_dim, name, dtype)
    return gather(weights, ids, v)


def dropout(x: Tensor, rate: float, noise_shape: Any = None) -> Tensor:
    """Zeroes each element with probability ``rate``, scales the rest by
    ``1/(1-rate)``.  ``rate == 0`` returns ``x`` unchanged (no random op)."""
    if not 0.0 <= rate < 1.0:
        raise ConfigError(f"dropout rate must be in [0, 1), got {rate!r}")
    if rate == 0.0:
        return x
    return random_dropout(x, rate=rate, noise_shape=noise_shape)


# --------------------------------------------------------------------------
# feed-forward and attention
# --------------------------------------------------------------------------


def dense_relu_dense(
    x: Tensor,
    hidden_dim: Any,
    output_dim: Any = None,
    dropout_rate: float = 0.0,
    activation: Callable[[Tensor], Tensor] = ew.relu,
    use_bias: bool = False,
    name: str = "dense_relu_dense",
) -> Tensor:
    """Transformer feed-forward: ``dense(activation(dense(x, d_ff)), d_model)``.

    ``output_dim`` defaults to x's last dim.  Under a ``d_ff`` split the first
    einsum needs no communication and the second ends in one allreduce.
    """
    h_dim = sized_dim(hidden_dim, f"dense_relu_dense {name!r}")
    io = (
        x.shape.dims[-1]
        if output_dim is None
        else sized_dim(output_dim, f"dense_relu_dense {name!r}")
    )
    h = dense(x, h_dim, use_bias=use_bias, activation=activation, name=f"{name}_wi")
    h = dropout(h, dropout_rate)
    return dense(h, io, reduced_dims=[h_dim], use_bias=use_bias, name=f"{name}_wo")


def attention_bias_causal(
    mesh: Mesh, length_dim: Dimension, memory_length_dim: Dimension
) -> Tensor:
    """``[length, memory_length]``: 0 where key position <= query position,
    -1e9 elsewhere (added to attention logits)."""
    q = np.arange(length_dim.size)[:, None]
    k = np.arange(memory_length_dim.size)[None, :]
    bias = np.where(k <= q, 0.0, -1e9).astype(np.float32)
    return constant(mesh, bias, Shape([length_dim, memory_length_dim]), "float32")


def attention_bias_padding(memory_ids: Tensor, pad_id: int = 0) -> Tensor:
    """``-1e9`` at memory positions holding ``pad_id``, 0 elsewhere."""
    pad = constant(memory_ids.mesh, pad_id, (), memory_ids.dtype)
    return ew.cast(ew.equal(memory_ids, pad), "float32") * -1e9


def multihead_attention(
    x: Tensor,
    heads_dim: Any,
    kv_dim: Any,
    memory: Tensor | None = None,
    bias: Tensor | None = None,
    length_dim_name: str = "length",
    memory_length_dim_name: str = "memory_length",
    dropout_rate: float = 0.0,
    name: str = "attention",
) -> Tensor:
    """Multi-head dot-product attention over named dims.

    ``x [batch, length, d_model]`` attends to ``memory`` (default: ``x``, i.e.
    self-attention).  The memory's length dim is renamed ``memory_length`` so
    queries and keys keep distinct names; ``bias`` (e.g.
    :func:`attention_bias_causal`, :func:`attention_bias_padding`) is added to
    the ``[..., heads, length, memory_length]`` logits.  Weights have shapes
    ``[d_model, heads, d_kv]`` (q, k, v) and ``[heads, d_kv, d_model]`` (o),
    so a ``heads`` split needs one allreduce, at the output projection.
    """
    heads = sized_dim(heads_dim, f"attention {name!r}")
    d_kv = sized_dim(kv_dim, f"attention {name!r}")
    io = x.shape.dims[-1]
    if memory is None:
        memory = x
    if memory.shape.dims[-1] != io:
        raise ShapeError(
            f"attention {name!r}: memory {memory.name} [{memory.shape}] must end in "
            f"x's model dimension {io}"
        )
    if length_dim_name in memory.shape.dimension_names:
        memory = rename_dimension(memory, length_dim_name, memory_length_dim_name)
    if memory_length_dim_name not in memory.shape.dimension_names:
        raise ShapeError(
            f"attention {name!r}: memory {memory.name} [{memory.shape}] has neither "
            f"{length_dim_name!r} nor {memory_length_dim_name!r}"
        )
    mem_len = memory.shape.get_dim_by_name(memory_length_dim_name)
    std = io.size**-0.5

    def weight(suffix: str, shape: list[Dimension], stddev: float) -> Tensor:
        wname = f"{name}_{suffix}"
        return get_variable(
            x.mesh, wname, Shape(shape), x.dtype, normal_initializer(stddev, wname)
        )

    wq = weight("q", [io, heads, d_kv], std * d_kv.size**-0.5)  # folds 1/sqrt(d_kv)
    wk = weight("k", [io, heads, d_kv], std)
    wv = weight("v", [io, heads, d_kv], std)
    wo = weight("o", [heads, d_kv, io], (heads.size * d_kv.size) ** -0.5)
    q = einsum([x, wq], output_shape=(x.shape - [io]) + Shape([heads, d_kv]))
    k = einsum([memory, wk], output_shape=(memory.shape - [io]) + Shape([heads, d_kv]))
    v = einsum([memory, wv], output_shape=(memory.shape - [io]) + Shape([heads, d_kv]))
    logits_shape = _heads_first(q.shape - [d_kv], heads, mem_len)
    logits = einsum([q, k], output_shape=logits_shape)
    if bias is not None:
        logits = logits + bias
    weights = red.softmax(logits, mem_len)
    weights = dropout(weights, dropout_rate)
    o = einsum([weights, v], output_shape=q.shape)
    return einsum([o, wo], output_shape=x.shape)


def _heads_first(shape: Shape, heads: Dimension, mem_len: Dimension) -> Shape:
    """``[batch..., heads, length, memory_length]`` from ``[batch..., length, heads]``."""
    rest = [d for d in shape if d.name != heads.name]
    return Shape([*rest[:-1], heads, rest[-1], mem_len])


# --------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------


def softmax_cross_entropy_with_logits(
    logits: Tensor,
    targets: Tensor,
    vocab_dim: Any,
    z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-example cross entropy; ``targets`` is a distribution over ``vocab_dim``
    (e.g. ``one_hot``).

    ``label_smoothing`` mixes the targets with the uniform distribution;
    ``z_loss`` adds ``z_loss * logsumexp(logits)^2``, which keeps the softmax
    normalizer near 1 (Mesh TensorFlow's z-loss).
    """
    d = _dim_in(logits, vocab_dim, "softmax_cross_entropy_with_logits")
    if d.name not in targets.shape.dimension_names:
        raise ShapeError(
            f"softmax_cross_entropy_with_logits: targets {targets.name} "
            f"[{targets.shape}] have no vocab dimension {d.name!r}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / d.size
    lse = red.reduce_logsumexp(logits, reduced_dim=d)
    loss = lse - red.reduce_sum(logits * targets, reduced_dim=d)
    if z_loss:
        loss = loss + ew.square(lse) * z_loss
    return loss


def sparse_softmax_cross_entropy(
    logits: Tensor,
    target_ids: Tensor,
    vocab_dim: Any,
    z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy against integer targets (one-hot over ``vocab_dim``)."""
    d = _dim_in(logits, vocab_dim, "sparse_softmax_cross_entropy")
    hot = _one_hot_by_compare(target_ids, d, 1.0, 0.0, logits.dtype)
    return softmax_cross_entropy_with_logits(
        logits, hot, d, z_loss=z_loss, label_smoothing=label_smoothing
    )


# --------------------------------------------------------------------------
# convolution
# --------------------------------------------------------------------------


def conv2d(
    x: Tensor,
    output_dim: Any,
    filter_size: tuple[int, int] = (3, 3),
    strides: tuple[int, int] = (1, 1),
    padding: str = "SAME",
    use_bias: bool = True,
    name: str = "conv2d",
) -> Tensor:
    """A learned 2-D convolution of ``x [batch..., h, w, in_channels]`` to
    ``[batch..., h', w', output_dim]``.

    The filter is ``[filter_height, filter_width, in_channels, output_dim]``;
    ``h``, ``w`` and the filter's spatial dims cannot be split (each device
    convolves whole images), batch and channel dims can.
    """
    from mtf_core.ops.conv import conv2d as conv

    out = sized_dim(output_dim, f"conv2d {name!r}")
    if x.shape.ndims < 4:
        raise ShapeError(
            f"conv2d {name!r}: {x.name} [{x.shape}] must be [batch..., h, w, channels]"
        )
    cin = x.shape.dims[-1]
    fshape = Shape(
        [
            Dimension("filter_height", filter_size[0]),
            Dimension("filter_width", filter_size[1]),
            cin,
            out,
        ]
    )
    fname = f"{name}_filters"
    fan_in = filter_size[0] * filter_size[1] * cin.size
    w = get_variable(
        x.mesh, fname, fshape, x.dtype, normal_initializer(fan_in**-0.5, fname)
    )
    y = conv(x, w, strides, padding)
    if use_bias:
        b = get_variable(
            x.mesh, f"{name}_bias", Shape([out]), x.dtype, _zeros_initializer()
        )
        y = y + b
    return y
