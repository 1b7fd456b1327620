"""Attention one decode step at a time, and the local-attention helpers
(Mesh TensorFlow's names and meanings).

The incremental functions write this step's key and value into caches of the
full memory length (a one-hot product, so a split memory length needs no
communication) and attend to the positions decoded so far.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def masked_local_attention_1d_incremental(
    x: Tensor,
    prev_k: Tensor,
    prev_v: Tensor,
    step_num: Tensor,
    master_dtype: Any = None,
    slice_dtype: Any = None,
    params: Sequence[Tensor] | None = None,
    name: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One decode step of :func:`masked_local_attention_1d`: ``x [batch...,
    io_channels]`` (this position), ``prev_k``/``prev_v [batch..., heads,
    window_length, kv_channels]`` a ring of the last ``window_length`` keys
    and values, scalar int ``step_num``.  This step's key and value replace
    slot ``step_num % window_length``; the query attends to the whole ring
    (slots not yet written hold what ``prev_k``/``prev_v`` held, as in Mesh
    TF).  From zero caches this is the full layer's output at each position
    when its blocks are ``window_length`` long (``window_size`` and
    ``length_per_split`` both ``window_length``): both see the last
    ``window_length`` positions, zero keys and values before the first.  ``params`` are the layer's
    ``(wq, wk, wv, wo)``; without them the weights are made as that layer
    makes them."""
    batch_dims = list(x.shape.dims[:-1])
    io = x.shape.dims[-1]
    heads, window, kv = prev_k.shape.dims[-3:]
    if prev_v.shape != prev_k.shape:
        raise ShapeError(
            f"masked_local_attention_1d_incremental: prev_v {prev_v.shape} differs "
            f"from prev_k {prev_k.shape}"
        )
    if params is None:
        wq, wk, wv, wo = multihead_attention_vars(
            x.mesh,
            heads,
            io,
            kv,
            master_dtype or "float32",
            slice_dtype or "float32",
            x.dtype,
            name=name or "masked_local_attention_1d",
        )
    else:
        wq, wk, wv, wo = params
    step_shape = Shape([*batch_dims, heads, kv])
    q = einsum([x, wq], output_shape=step_shape)
    slot = ew.equal(
        mtf_range(x.mesh, window, step_num.dtype), ew.mod(step_num, window.size)
    )
    k = ew.where(
        slot,
        einsum([x, wk], output_shape=step_shape),
        prev_k,
        output_shape=prev_k.shape,
    )
    v = ew.where(
        slot,
        einsum([x, wv], output_shape=step_shape),
        prev_v,
        output_shape=prev_v.shape,
    )
    o = dot_product_attention(q, k, v, None, is_training=False)
    return einsum([o, wo], output_shape=x.shape), k, v


def local_2d_halo_exchange(
    k: Tensor,
    v: Tensor,
    num_h_blocks: Any,
    h_dim: Dimension,
    num_w_blocks: Any,
    w_dim: Dimension,
    mask_right: bool,
) -> tuple[Tensor, Tensor]:
    """:func:`local_1d_halo_exchange` along both spatial dims of ``[...,
    num_h_blocks, num_w_blocks, h_dim, w_dim, ...]`` blocks: each block's keys
    and values gain a block's worth of rows and columns from its neighbours
    (above and to the left only with ``mask_right``; zeros at the edges)."""
    k, v = local_1d_halo_exchange(k, v, num_h_blocks, h_dim, mask_right)
    return local_1d_halo_exchange(k, v, num_w_blocks, w_dim, mask_right)


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
