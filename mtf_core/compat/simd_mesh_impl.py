"""``mesh_tensorflow.simd_mesh_impl``: mtf_core's SPMD backend, and Mesh TF's
``HierarchicalTiling`` (a logical mesh tiled onto a 3-D physical grid).

TPU-only helpers (``auto_logical_to_physical_tpu``, which reads a TPU
topology) have no counterpart; see docs/compatibility.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mtf_core.errors import ArgumentError
from mtf_core.lowering.spmd import *  # noqa: F403
from mtf_core.lowering.spmd import SimdMeshImpl  # noqa: F401
from mtf_core.shapes import Dimension, Shape


def _tiles(spec: Sequence[Any], physical_shape: Sequence[int]) -> list[list[int]]:
    """Each level's tile shape; the one ``None`` level takes what is left."""
    given = [list(t) if t else None for _, t in spec]
    if sum(t is None for t in given) > 1:
        raise ArgumentError(
            f"HierarchicalTiling {spec!r}: at most one tile may be None"
        )
    used = [math.prod(t[a] for t in given if t) for a in range(len(physical_shape))]
    for a, (n, u) in enumerate(zip(physical_shape, used)):
        if n % u:
            raise ArgumentError(
                f"HierarchicalTiling {spec!r}: tiles use {u} along axis {a}, which "
                f"does not divide the physical size {n} ({list(physical_shape)})"
            )
    rest = [n // u for n, u in zip(physical_shape, used)]
    tiles = [t if t is not None else rest for t in given]
    if any(math.prod(t[a] for t in tiles) != n for a, n in enumerate(physical_shape)):
        raise ArgumentError(
            f"HierarchicalTiling {spec!r}: tiles do not cover {list(physical_shape)}"
        )
    return tiles


class HierarchicalTiling:
    """Mesh dims made of nested tiles of a physical grid.

    ``spec`` lists ``(mesh_dim_name, tile_shape)`` from the outermost level
    to the innermost; a ``None`` tile is the rest of the grid.  Each mesh dim's
    size is its tile's volume.  The innermost level varies fastest in
    physical position, so its devices are neighbours (e.g. model parallelism
    innermost keeps its collectives local).

    >>> t = HierarchicalTiling([("dp", None), ("mp", [1, 1, 2])], [2, 2, 2])
    >>> str(t.mesh_shape), t.logical_to_physical
    ('dp:4,mp:2', [0, 1, 2, 3, 4, 5, 6, 7])
    """

    def __init__(self, spec: Sequence[Any], physical_shape: Sequence[int]) -> None:
        physical = [int(n) for n in physical_shape]
        tiles = _tiles(spec, physical)
        self._mesh_shape = Shape(
            [Dimension(name, math.prod(t)) for (name, _), t in zip(spec, tiles)]
        )
        # Stride of each level along each axis: inner levels are finer.
        strides = []
        for k in range(len(tiles)):
            strides.append(
                [math.prod(t[a] for t in tiles[k + 1 :]) for a in range(len(physical))]
            )
        out = []
        for pnum in range(self._mesh_shape.size):
            coords = [0] * len(physical)
            rem = pnum
            for k in reversed(range(len(tiles))):
                size = math.prod(tiles[k])
                idx, rem = rem % size, rem // size
                for a in reversed(range(len(physical))):
                    idx, c = divmod(idx, tiles[k][a])
                    coords[a] += c * strides[k][a]
            core = 0
            for a, n in enumerate(physical):
                core = core * n + coords[a]
            out.append(core)
        self._logical_to_physical = out

    @property
    def mesh_shape(self) -> Shape:
        return self._mesh_shape

    @property
    def logical_to_physical(self) -> list[int]:
        """Physical (row-major) core of each logical processor number."""
        return list(self._logical_to_physical)

    @staticmethod
    def spec_to_mesh_shape(spec: Sequence[Any], num_processors: int) -> Shape:
        """The mesh shape of ``spec`` on ``num_processors`` processors, before
        the physical grid is known."""
        sizes = [math.prod(t) if t else None for _, t in spec]
        known = math.prod(s for s in sizes if s is not None)
        if num_processors % known:
            raise ArgumentError(
                f"spec {spec!r} uses {known} processors per tile, which does not "
                f"divide {num_processors}"
            )
        return Shape(
            [
                Dimension(name, s if s is not None else num_processors // known)
                for (name, _), s in zip(spec, sizes)
            ]
        )
