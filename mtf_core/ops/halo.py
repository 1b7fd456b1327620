"""Halo exchange: each block of a blocked dimension gets the margins of its
neighbours (for convolutions and local attention over a split length).

``x`` has a ``blocks_dim`` (the blocks, usually split over a mesh axis) and a
``block_size_dim`` (positions inside a block, whole on each device).  The
halo is made of ``shift`` along ``blocks_dim`` (a neighbour exchange over the
mesh axis when it is split, nothing otherwise), ``slice`` and ``concat`` along
``block_size_dim``, so it is priced and laid out as those ops are.
"""

from __future__ import annotations

from typing import Any

from mtf_core.graph import Tensor
from mtf_core.ops.arguments import check_int, dim_of
from mtf_core.ops.shift import shift
from mtf_core.ops.slicing import concat
from mtf_core.ops.slicing import slice as mtf_slice


def _margins(
    x: Tensor, blocks_dim: Any, block_size_dim: Any, halo_size: int, what: str
) -> tuple[Any, Any, int, int]:
    blocks = dim_of(x, blocks_dim, what)
    size = dim_of(x, block_size_dim, what)
    halo_size = check_int(halo_size, f"{what}: halo_size")
    return blocks, size, halo_size // size.size, halo_size % size.size


def halo_exchange(
    x: Tensor, blocks_dim: Any, block_size_dim: Any, halo_size: int, wrap: bool = False
) -> Tensor:
    """``x`` with each block extended by ``halo_size`` positions of the
    blocks before and after it along ``block_size_dim`` (zeros past the ends,
    or the other end's with ``wrap``); ``block_size_dim`` grows by
    ``2 * halo_size``."""
    blocks, size, whole, part = _margins(
        x, blocks_dim, block_size_dim, halo_size, "halo_exchange"
    )
    if halo_size == 0:
        return x
    parts = [x]
    for i in range(1, whole + 1):
        parts = [shift(x, i, blocks, wrap), *parts, shift(x, -i, blocks, wrap)]
    if part:
        left = mtf_slice(x, 0, part, size.name)
        right = mtf_slice(x, size.size - part, part, size.name)
        parts = [
            shift(right, whole + 1, blocks, wrap),
            *parts,
            shift(left, -(whole + 1), blocks, wrap),
        ]
    return concat(parts, size.name)


def left_halo_exchange(
    x: Tensor, blocks_dim: Any, block_size_dim: Any, halo_size: int, wrap: bool = False
) -> Tensor:
    """Like :func:`halo_exchange` from the left only: ``block_size_dim`` grows
    by ``halo_size`` (what causal local attention needs)."""
    blocks, size, whole, part = _margins(
        x, blocks_dim, block_size_dim, halo_size, "left_halo_exchange"
    )
    if halo_size == 0:
        return x
    parts = [x]
    for i in range(1, whole + 1):
        parts = [shift(x, i, blocks, wrap), *parts]
    if part:
        right = mtf_slice(x, size.size - part, part, size.name)
        parts = [shift(right, whole + 1, blocks, wrap), *parts]
    return concat(parts, size.name)
