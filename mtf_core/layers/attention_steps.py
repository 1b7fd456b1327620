"""Attention one decode step at a time, and the local-attention helpers
(Mesh TensorFlow's names and meanings).

The incremental functions write this step's key and value into caches of the
full memory length (a one-hot product, so a split memory length needs no
communication) and attend to the positions decoded so far.
"""

from __future__ import annotations

from typing import Any

from mtf_core.errors import ShapeError
from mtf_core.graph import Tensor
from mtf_core.layers.attention import dot_product_attention, multihead_attention_vars
from mtf_core.ops import elementwise as ew
from mtf_core.ops.einsum import einsum
from mtf_core.ops.halo import halo_exchange, left_halo_exchange
from mtf_core.ops.indexing import mtf_range, one_hot
from mtf_core.ops.slicing import pad
from mtf_core.shapes import Dimension, Shape


def multihead_self_attention_incremental(
    query_antecedent: Tensor,
    prev_k: Tensor,
    prev_v: Tensor,
    step_num: Tensor,
    master_dtype: Any,
    slice_dtype: Any,
    name: str = "multihead_attention",
) -> tuple[Tensor, Tensor, Tensor]:
    """One step of causal self-attention: ``query_antecedent [batch...,
    io_channels]`` (this position), caches ``prev_k``/``prev_v [batch...,
    heads, memory_length, kv_channels]``, scalar ``step_num``.  Returns the
    output ``[batch..., io_channels]`` and the caches with this step's key
    and value written at ``step_num``."""
    x = query_antecedent
    batch_dims = list(x.shape.dims[:-1])
    io = x.shape.dims[-1]
    heads, memory_length, kv = prev_k.shape.dims[-3:]
    wq, wk, wv, wo = multihead_attention_vars(
        x.mesh, heads, io, kv, master_dtype, slice_dtype, x.dtype, name=name
    )
    step_shape = Shape([*batch_dims, heads, kv])
    q = einsum([x, wq], output_shape=step_shape)
    here = one_hot(step_num, memory_length, dtype=prev_k.dtype)
    k = prev_k + ew.multiply(
        einsum([x, wk], output_shape=step_shape), here, output_shape=prev_k.shape
    )
    v = prev_v + ew.multiply(
        einsum([x, wv], output_shape=step_shape), here, output_shape=prev_v.shape
    )
    later = ew.greater(mtf_range(x.mesh, memory_length, "int32"), step_num)
    mask = ew.cast(later, q.dtype) * -1e9
    o = dot_product_attention(q, k, v, mask, is_training=False)
    return einsum([o, wo], output_shape=x.shape), k, v


def multihead_encdec_attention_incremental(
    query_antecedent: Tensor,
    wq: Tensor,
    wo: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    name: str = "multihead_attention",
) -> Tensor:
    """One step of attention to an encoder's keys and values ``k``/``v
    [batch..., heads, memory_length, kv_channels]`` with the weights ``wq``,
    ``wo`` (see :func:`multihead_attention_params`)."""
    del name
    heads, _, kv = k.shape.dims[-3:]
    dims = list(query_antecedent.shape.dims[:-1])
    q = einsum([query_antecedent, wq], output_shape=Shape([*dims, heads, kv]))
    o = dot_product_attention(q, k, v, mask, is_training=False)
    return einsum([o, wo], output_shape=query_antecedent.shape)


def local_1d_halo_exchange(
    k: Tensor, v: Tensor, num_w_blocks: Any, w_dim: Dimension, mask_right: bool
) -> tuple[Tensor, Tensor]:
    """Keys and values of each block of ``w_dim`` extended by a block's worth
    of neighbours (the left one only with ``mask_right``): a halo exchange
    over ``num_w_blocks`` when the blocks are a dim, zero padding without."""
    if num_w_blocks is not None:
        exchange = left_halo_exchange if mask_right else halo_exchange
        return (
            exchange(k, num_w_blocks, w_dim, w_dim.size),
            exchange(v, num_w_blocks, w_dim, w_dim.size),
        )
    widths = [w_dim.size, 0] if mask_right else [w_dim.size, w_dim.size]
    return pad(k, widths, w_dim.name), pad(v, widths, w_dim.name)


def compress_mean(x: Tensor, dim: Any, compression_factor: int) -> Tensor:
    """``x`` with ``dim`` shrunk ``compression_factor`` times, each group of
    consecutive positions replaced by its mean."""
    from mtf_core.ops.selection import pool_tensor_1d

    if not isinstance(compression_factor, int) or compression_factor < 1:
        raise ShapeError(
            f"compress_mean: compression_factor {compression_factor!r} must be a "
            "positive integer"
        )
    return pool_tensor_1d(x, dim, pool_size=compression_factor)
