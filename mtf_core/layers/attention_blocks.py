"""Self-attention over blocks of a sequence and over a compressed memory
(Mesh TensorFlow's ``local_self_attention_spatial_blocks`` and
``multihead_self_attention_memory_compressed``).

The blocked form attends from each block to itself and its neighbouring
blocks: keys and values get the neighbours by a halo exchange over the blocks
dim (neighbour shifts when it is split; zeros at the edges, which take part
in the softmax with logit 0, as in Mesh TF).  The compressed form attends to
the mean of each ``compression_factor`` positions.
"""

from __future__ import annotations

from typing import Any

from mtf_core.errors import ShapeError
from mtf_core.graph import Tensor
from mtf_core.layers.attention import (
    attention_bias_local_block,
    dot_product_attention,
    multihead_attention_vars,
    rename_length_to_memory_length,
)
from mtf_core.layers.attention_steps import compress_mean, local_1d_halo_exchange
from mtf_core.ops import elementwise as ew
from mtf_core.ops.einsum import einsum
from mtf_core.ops.indexing import mtf_range
from mtf_core.ops.reshape import rename_dimension
from mtf_core.shapes import Dimension, Shape


def _qkv(
    x: Tensor,
    memory: Tensor,
    heads: Dimension,
    kv_channels: Dimension,
    batch: list[Dimension],
    query_dims: list[Dimension],
    memory_dims: list[Dimension],
    master_dtype: Any,
    slice_dtype: Any,
    name: str,
) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
    """The layer's weights and ``q [batch..., heads, query_dims..., kv]``,
    ``k``/``v [batch..., heads, memory_dims..., kv]``."""
    io = x.shape.dims[-1]
    weights = multihead_attention_vars(
        x.mesh, heads, io, kv_channels, master_dtype, slice_dtype, x.dtype, name=name
    )
    wq, wk, wv, _ = weights
    q_shape = Shape([*batch, heads, *query_dims, kv_channels])
    q = einsum([x, wq], output_shape=q_shape)
    k_shape = Shape([*batch, heads, *memory_dims, kv_channels])
    k = einsum([memory, wk], output_shape=k_shape)
    v = einsum([memory, wv], output_shape=k_shape)
    return weights, q, k, v


def local_self_attention_spatial_blocks(
    query_antecedent: Tensor,
    kv_channels: Dimension,
    heads: Dimension,
    is_training: bool,
    memory_w_dim: Any = None,
    mask_right: bool = False,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    name: str | None = None,
) -> Tensor:
    """Attention within blocks of a sequence: ``query_antecedent [batch...,
    num_w_blocks, w, io_channels]``; each block attends to itself and the
    previous block, and the next one too unless ``mask_right`` (which also
    hides positions to the right within the block).  ``memory_w_dim`` is
    ignored (Mesh TF recomputes it too)."""
    del memory_w_dim
    x = query_antecedent
    if x.shape.ndims < 3:
        raise ShapeError(
            f"local_self_attention_spatial_blocks: {x.name} {x.shape} needs "
            "[batch..., num_w_blocks, w, io_channels]"
        )
    *batch, blocks, w = x.shape.dims[:-1]
    memory = rename_dimension(x, w.name, f"memory_{w.name}")
    mem_w = memory.shape.dims[-2]
    weights, q, k, v = _qkv(
        x, memory, heads, kv_channels, batch, [blocks, w], [blocks, mem_w],
        master_dtype, slice_dtype, name or "multihead_attention",
    )  # fmt: skip
    k, v = local_1d_halo_exchange(k, v, blocks, mem_w, mask_right)
    mask = attention_bias_local_block(x.mesh, w, mem_w) if mask_right else None
    o = dot_product_attention(q, k, v, mask, is_training)
    return einsum([o, weights[3]], output_shape=x.shape)


def multihead_self_attention_memory_compressed(
    x: Tensor,
    mask_right: bool,
    compression_factor: int,
    kv_channels: Dimension,
    heads: Dimension,
    is_training: bool,
    dropout: float = 0.0,
    dropout_broadcast_dims: Any = None,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    name: str = "multihead_attention",
) -> Tensor:
    """Self-attention of ``x [batch..., length, io_channels]`` to a memory of
    the means of each ``compression_factor`` consecutive positions (renamed
    ``memory_length``), with an extra logit of 0 in the softmax.  With
    ``mask_right`` a query sees only the groups whose last position is at or
    before it."""
    *batch, length, _ = x.shape.dims
    memory = rename_length_to_memory_length(
        compress_mean(x, length, compression_factor),
        length.name,
        f"memory_{length.name}",
    )
    mem_len = memory.shape.get_dim_by_name(f"memory_{length.name}")
    weights, q, k, v = _qkv(
        x, memory, heads, kv_channels, batch, [length], [mem_len],
        master_dtype, slice_dtype, name,
    )  # fmt: skip
    mask = None
    if mask_right:
        query_pos = mtf_range(x.mesh, length, "int32")
        last = mtf_range(x.mesh, mem_len, "int32") * compression_factor + (
            compression_factor - 1
        )
        mask = ew.cast(ew.greater(last, query_pos), x.dtype) * -1e9
    o = dot_product_attention(
        q, k, v, mask, is_training, dropout, dropout_broadcast_dims, extra_logit=0.0
    )
    return einsum([o, weights[3]], output_shape=x.shape)
