"""Attention layers: mtf_core's ``multihead_attention`` over named dims and
Mesh TensorFlow's (``multihead_attention(query_antecedent, memory_antecedent,
mask, kv_channels, heads, is_training, ...)``), ``dot_product_attention``,
``masked_local_attention_1d`` and the attention masks and biases.

Everything is einsums, softmaxes and masks over named dims, so a ``heads``
split costs one allreduce at the output projection and a split length in
local attention costs the halo exchange's neighbour shifts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mtf_core import dtypes
from mtf_core.errors import ShapeError
from mtf_core.graph import Mesh, Tensor
from mtf_core.layers.embedding import dropout
from mtf_core.layers.initializers import (
    RandomInitializer,
    named_initializer,
    normal_initializer,
)
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.arguments import sized_dim
from mtf_core.ops.creation import CausalBias, constant, zeros
from mtf_core.ops.einsum import einsum
from mtf_core.ops.halo import left_halo_exchange
from mtf_core.ops.indexing import mtf_range
from mtf_core.ops.random import dropout as random_dropout
from mtf_core.ops.random import random_uniform
from mtf_core.ops.reshape import rename_dimension, reshape
from mtf_core.ops.slicing import concat, unstack
from mtf_core.ops.variables import as_variable, get_variable
from mtf_core.shapes import Dimension, Shape


def attention_bias_causal(
    mesh: Mesh, length_dim: Dimension, memory_length_dim: Dimension
) -> Tensor:
    """``[length, memory_length]``: 0 where key position <= query position,
    -1e9 elsewhere (added to attention logits)."""
    # Made when first lowered: a graph that is only planned never needs it.
    return CausalBias(mesh, length_dim, memory_length_dim).outputs[0]


def attention_bias_padding(memory_ids: Tensor, pad_id: int = 0) -> Tensor:
    """``-1e9`` at memory positions holding ``pad_id``, 0 elsewhere."""
    pad = constant(memory_ids.mesh, pad_id, (), memory_ids.dtype)
    return ew.cast(ew.equal(memory_ids, pad), "float32") * -1e9


def _attention_named(
    x: Tensor,
    heads_dim: Any,
    kv_dim: Any,
    memory: Tensor | None = None,
    bias: Tensor | None = None,
    length_dim_name: str = "length",
    memory_length_dim_name: str = "memory_length",
    dropout_rate: float = 0.0,
    name: str = "attention",
    variable_dtype: Any = None,
    recompute_scores: bool = False,
) -> Tensor:
    """Multi-head dot-product attention over named dims.

    ``x [batch, length, d_model]`` attends to ``memory`` (default: ``x``, i.e.
    self-attention).  The memory's length dim is renamed ``memory_length`` so
    queries and keys keep distinct names; ``bias`` (e.g.
    :func:`attention_bias_causal`, :func:`attention_bias_padding`) is added to
    the ``[..., heads, length, memory_length]`` logits.  Weights have shapes
    ``[d_model, heads, d_kv]`` (q, k, v) and ``[heads, d_kv, d_model]`` (o),
    so a ``heads`` split needs one allreduce, at the output projection.
    ``variable_dtype`` (a dtype or VariableDType) defaults to ``x``'s dtype.
    ``recompute_scores``: the attention probabilities (logits, softmax,
    dropout, and their product with the values) are recomputed in the
    backward pass instead of kept
    (``mtf.recompute_grad``; Megatron's selective recomputation).
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
            x.mesh,
            wname,
            Shape(shape),
            x.dtype if variable_dtype is None else variable_dtype,
            initializer=normal_initializer(stddev, wname),
        )

    wq = weight("q", [io, heads, d_kv], std * d_kv.size**-0.5)  # folds 1/sqrt(d_kv)
    wk = weight("k", [io, heads, d_kv], std)
    wv = weight("v", [io, heads, d_kv], std)
    wo = weight("o", [heads, d_kv, io], (heads.size * d_kv.size) ** -0.5)
    q = einsum([x, wq], output_shape=(x.shape - [io]) + Shape([heads, d_kv]))
    k = einsum([memory, wk], output_shape=(memory.shape - [io]) + Shape([heads, d_kv]))
    v = einsum([memory, wv], output_shape=(memory.shape - [io]) + Shape([heads, d_kv]))
    logits_shape = _heads_first(q.shape - [d_kv], heads, mem_len)

    def core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # Megatron's "core attention": scores, softmax, dropout, values.
        logits = einsum([q, k], output_shape=logits_shape)
        if bias is not None:
            logits = logits + bias
        weights = dropout(red.softmax(logits, mem_len), dropout_rate)
        return einsum([weights, v], output_shape=q.shape)

    if recompute_scores:
        from mtf_core.autodiff import recompute_grad

        # Nothing [heads, length, memory_length] is held for the backward
        # pass (as with FlashAttention, whose backward recomputes them too).
        o = recompute_grad(core, [q, k, v])
    else:
        o = core(q, k, v)
    return einsum([o, wo], output_shape=x.shape)


def _heads_first(shape: Shape, heads: Dimension, mem_len: Dimension) -> Shape:
    """``[batch..., heads, length, memory_length]`` from ``[batch..., length, heads]``."""
    rest = [d for d in shape if d.name != heads.name]
    return Shape([*rest[:-1], heads, rest[-1], mem_len])


def multihead_attention(query_antecedent: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """Multi-head attention, in either of two signatures.

    * mtf_core's: ``multihead_attention(x, heads_dim, kv_dim, memory=None,
      bias=None, length_dim_name="length",
      memory_length_dim_name="memory_length", dropout_rate=0.0,
      name="attention")``;
    * Mesh TensorFlow's: ``multihead_attention(query_antecedent,
      memory_antecedent, mask, kv_channels, heads, is_training, dropout=0.0,
      dropout_broadcast_dims=None, master_dtype=float32,
      slice_dtype=float32, name="multihead_attention")``, chosen when its
      keywords (``kv_channels``, ``heads``, ``mask``, ``memory_antecedent``,
      ``is_training``) are given or the second argument is a tensor or None.
    """
    mesh_tf_keys = {"kv_channels", "heads", "mask", "memory_antecedent"}
    mesh_tf_keys |= {"is_training", "dropout_broadcast_dims"}
    second = args[0] if args else kwargs.get("heads_dim", 0)
    if mesh_tf_keys & set(kwargs) or second is None or isinstance(second, Tensor):
        return _mesh_tf_multihead_attention(query_antecedent, *args, **kwargs)
    return _attention_named(query_antecedent, *args, **kwargs)


def rename_length_to_memory_length(
    x: Tensor, length_name: str = "length", memory_length_name: str = "memory_length"
) -> Tensor:
    """``x`` with its ``length`` dim renamed ``memory_length`` (keys' and
    values' length, distinct from the queries')."""
    return rename_dimension(x, length_name, memory_length_name)


def multihead_attention_params(
    mesh: Mesh,
    heads: Dimension,
    io_channels: Dimension,
    kv_channels: Dimension,
    variable_dtype: Any,
    combine: bool = False,
    *,
    name: str = "multihead_attention",
) -> list[Tensor]:
    """The query, key, value and output weights, each ``[heads, io_channels,
    kv_channels]``: normals of stddev ``io^-0.5 * kv^-0.25`` (q, k),
    ``io^-0.5`` (v) and ``(io * heads)^-0.5`` (o).  ``combine`` stores the
    four in one ``[qkvo, ...]`` variable (one checkpoint entry)."""
    vd = dtypes.as_variable_dtype(variable_dtype)
    qk = io_channels.size**-0.5 * kv_channels.size**-0.25
    stddevs = [qk, qk, io_channels.size**-0.5, (io_channels.size * heads.size) ** -0.5]
    shape = Shape([heads, io_channels, kv_channels])
    if combine:
        qkvo = Dimension("qkvo", 4)
        wname = f"{name}_qkvo"
        seeds = [normal_initializer(s, f"{wname}_{i}") for i, s in enumerate(stddevs)]

        def init(full_shape: Sequence[int], dtype: Any = None) -> np.ndarray:
            return np.stack([f(list(full_shape[1:])) for f in seeds])

        var = get_variable(mesh, wname, Shape([qkvo]) + shape, vd, initializer=init)
        return unstack(var, qkvo)
    out = []
    for part, stddev in zip("qkvo", stddevs):
        w = get_variable(mesh, f"{name}_{part}", shape, vd)
        op = as_variable(w)
        # Seeded by the variable's final (unique) name.
        op.initializer = named_initializer(RandomInitializer("normal", stddev), op.name)
        out.append(w)
    return out


def multihead_attention_vars(
    mesh: Mesh,
    heads: Dimension,
    io_channels: Dimension,
    kv_channels: Dimension,
    master_dtype: Any,
    slice_dtype: Any,
    activation_dtype: Any,
    *,
    name: str = "multihead_attention",
) -> list[Tensor]:
    """:func:`multihead_attention_params` with ``combine=True`` (the older
    signature)."""
    vd = dtypes.VariableDType(master_dtype, slice_dtype, activation_dtype)
    return multihead_attention_params(
        mesh, heads, io_channels, kv_channels, vd, combine=True, name=name
    )


def dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    is_training: bool,
    dropout: float = 0.0,
    dropout_broadcast_dims: Any = None,
    extra_logit: Any = None,
) -> Tensor:
    """``softmax(q k + mask) v`` over the keys' length: ``q [..., length_q,
    depth_k]``, ``k [..., length_kv, depth_k]``, ``v [..., length_kv,
    depth_v]`` (dims in that order) give ``[..., length_q, depth_v]``."""
    length_kv = k.shape.dims[-2]
    logits = einsum([q, k], output_shape=Shape([*q.shape.dims[:-1], length_kv]))
    if mask is not None:
        logits = logits + mask
    weights = red.softmax(logits, length_kv, extra_logit=extra_logit)
    if dropout:
        broadcast = [] if dropout_broadcast_dims is None else dropout_broadcast_dims
        weights = random_dropout(
            weights, is_training, rate=dropout, noise_shape=weights.shape - broadcast
        )
    out_shape = Shape([*q.shape.dims[:-1], v.shape.dims[-1]])
    return einsum([weights, v], output_shape=out_shape)


def _mesh_tf_multihead_attention(
    query_antecedent: Tensor,
    memory_antecedent: Tensor | None,
    mask: Tensor | None,
    kv_channels: Dimension,
    heads: Dimension,
    is_training: bool,
    dropout: float = 0.0,
    dropout_broadcast_dims: Any = None,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    name: str = "multihead_attention",
) -> Tensor:
    x = query_antecedent
    batch_dims = list(x.shape.dims[:-2])
    length, io = x.shape.dims[-2:]
    wq, wk, wv, wo = multihead_attention_vars(
        x.mesh, heads, io, kv_channels, master_dtype, slice_dtype, x.dtype, name=name
    )
    memory = memory_antecedent
    if memory is None:
        memory = rename_length_to_memory_length(x, length.name)
    mem_length, mem_io = memory.shape.dims[-2:]
    if list(memory.shape.dims[:-2]) != batch_dims or mem_io != io:
        raise ShapeError(
            f"multihead_attention {name!r}: memory [{memory.shape}] must have the "
            f"batch dims and channels {io} of the query [{x.shape}]"
        )
    q = einsum([x, wq], output_shape=Shape([*batch_dims, heads, length, kv_channels]))
    kv_shape = Shape([*batch_dims, heads, mem_length, kv_channels])
    k = einsum([memory, wk], output_shape=kv_shape)
    v = einsum([memory, wv], output_shape=kv_shape)
    o = dot_product_attention(
        q, k, v, mask, is_training, dropout, dropout_broadcast_dims
    )
    return einsum([o, wo], output_shape=Shape([*batch_dims, length, io]))


def attention_mask_ignore_padding(inputs: Tensor, dtype: Any = "float32") -> Tensor:
    """``-1e9`` at memory positions whose id is 0 (padding): ``[...,
    memory_length]`` from ids ``[..., length]``."""
    memory = rename_length_to_memory_length(inputs)
    zero = constant(inputs.mesh, 0, (), inputs.dtype)
    return ew.cast(ew.equal(memory, zero), dtype) * -1e9


def attention_mask_autoregressive(query_pos: Tensor, dtype: Any = "float32") -> Tensor:
    """``-1e9`` where the memory position is after the query position:
    ``[..., length, memory_length]`` from positions ``[..., length]``."""
    memory_pos = rename_length_to_memory_length(query_pos)
    return ew.cast(ew.less(query_pos, memory_pos), dtype) * -1e9


def attention_mask_same_segment(
    query_segment: Tensor,
    memory_segment: Tensor | None = None,
    dtype: Any = "float32",
) -> Tensor:
    """``-1e9`` between positions of different segments."""
    memory = rename_length_to_memory_length(
        query_segment if memory_segment is None else memory_segment
    )
    return ew.cast(ew.not_equal(query_segment, memory), dtype) * -1e9


def attention_bias_local_block(
    mesh: Mesh, block_length: Dimension, memory_length: Dimension, dtype: Any = "int32"
) -> Tensor:
    """``[block_length, memory_length]`` (memory length twice the block): 0 on
    the previous block's half, and on the current block's half ``-1e9`` to
    the right of each query position."""
    mem = Dimension(memory_length.name, block_length.size)
    earlier = zeros(mesh, Shape([block_length, mem]), dtype=dtype)
    later = ew.cast(
        ew.less(mtf_range(mesh, block_length, dtype), mtf_range(mesh, mem, dtype)),
        dtype,
    )
    return ew.cast(concat([earlier, later], mem.name), "float32") * -1e9


def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
    """``x`` times uniform noise in ``[1 - epsilon, 1 + epsilon]``."""
    if epsilon == 0:
        return x
    noise = random_uniform(
        x.mesh, x.shape, minval=1.0 - epsilon, maxval=1.0 + epsilon, dtype=x.dtype
    )
    return x * noise


def masked_local_attention_1d(
    x: Tensor,
    kv_channels: Dimension,
    heads: Dimension,
    is_training: bool,
    window_size: int = 128,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    length_per_split: int | None = None,
    return_kv: list[Tensor] | None = None,
    params: Sequence[Tensor] | None = None,
    name: str | None = None,
) -> Tensor:
    """Causal attention to a window: position ``p`` sees ``(p - window_size,
    p]``.  ``x [batch..., length, io_channels]``.

    The length is cut into blocks (the largest divisor of
    ``length_per_split`` up to ``max(window_size, 128)``) along a dim named
    like ``length``, so it splits as ``length`` does; each block's keys and
    values get the previous ``window_size`` positions by a left halo
    exchange (neighbour shifts when the length is split).
    """
    name = name or "masked_local_attention_1d"
    batch_dims = list(x.shape.dims[:-2])
    length, io = x.shape.dims[-2:]
    if params is None:
        wq, wk, wv, wo = multihead_attention_vars(
            x.mesh,
            heads,
            io,
            kv_channels,
            master_dtype,
            slice_dtype,
            x.dtype,
            name=name,
        )
    else:
        wq, wk, wv, wo = params
    qkv_shape = Shape([*batch_dims, heads, length, kv_channels])
    q = einsum([x, wq], output_shape=qkv_shape)
    k = einsum([x, wk], output_shape=qkv_shape)
    v = einsum([x, wv], output_shape=qkv_shape)
    if return_kv is not None:
        return_kv.extend([k, v])
    per_split = length.size if length_per_split is None else length_per_split
    block = max(window_size, 128)
    while per_split % block:
        block -= 1
    q_block = Dimension("query_block_length", block)
    m_block = Dimension("memory_block_length", block)
    blocks = Dimension(length.name, length.size // block)
    q = reshape(q, Shape([*batch_dims, heads, blocks, q_block, kv_channels]))
    kv_shape = Shape([*batch_dims, heads, blocks, m_block, kv_channels])
    k = left_halo_exchange(reshape(k, kv_shape), blocks, m_block, window_size)
    v = left_halo_exchange(reshape(v, kv_shape), blocks, m_block, window_size)
    padded = Dimension("memory_block_length", window_size + block)
    mpos = mtf_range(x.mesh, padded, "float32")
    qpos = mtf_range(x.mesh, q_block, "float32") + float(window_size)
    mask = ew.cast(ew.greater(mpos, qpos), x.dtype) * -1e9  # no looking ahead
    # nor back by a block or more
    mask = mask + ew.cast(ew.less_equal(mpos, qpos - float(block)), x.dtype) * -1e9
    o = dot_product_attention(q, k, v, mask, is_training)
    o = reshape(o, Shape([*batch_dims, heads, length, kv_channels]))
    return einsum([o, wo], output_shape=Shape([*batch_dims, length, io]))
