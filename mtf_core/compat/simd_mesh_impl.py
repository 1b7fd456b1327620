"""``mesh_tensorflow.simd_mesh_impl``: mtf_core's SPMD backend, and Mesh TF's
maps of a logical mesh onto a physical grid of cores: ``HierarchicalTiling``
(nested tiles of a 3-D grid) and ``auto_logical_to_physical_tpu`` (a TPU
torus's chips in ring order, each tile of the later logical dims a
rectangle of chips).  Both are arithmetic on shapes; no TPU is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol, overload

from mtf_core.compat.coordinates import (
    pnum_to_processor_coordinates,
    processor_coordinates_to_pnum,
)
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


# -- auto_logical_to_physical_tpu ---------------------------------------------
#
# A TPU pod is a rows x cols grid of chips (a 2-D torus, or a 3-D one folded
# to 2-D), each chip with ``cores`` cores: the physical shape [rows, cols,
# cores], numbered row-major.  The map puts the logical mesh's last dims on
# small rectangles of chips and its first dim on the ring of those
# rectangles, so the collectives of the later (usually model-parallel) dims
# stay between neighbouring chips.

Chip = tuple[int, int]
Core = tuple[int, int, int]


class DeviceAssignment(Protocol):
    """What the map reads of a TPU device assignment: each replica's
    ``(x, y, z, ...)`` coordinates and the topology's mesh shape."""

    @property
    def num_replicas(self) -> int: ...

    @property
    def topology(self) -> Any: ...

    def coordinates(self, replica: int, logical_core: int) -> Sequence[int]: ...


def ring_2d(rows: int, cols: int) -> list[Chip]:
    """The chips of a ``rows x cols`` grid in ring order: each chip next to
    the one before it, and (for an even ``rows``) the last next to the first.

    Row pairs are walked out along columns 1.. and back, then column 0
    upwards closes the ring; a grid of odd rows is taken column by column.

    >>> ring_2d(2, 3)
    [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    """
    if rows < 1 or cols < 1:
        raise ArgumentError(f"ring_2d({rows}, {cols}): both sizes must be >= 1")
    if rows == 1 or cols == 1:
        return [(i // cols, i % cols) for i in range(rows * cols)]
    if rows % 2:
        return [(i % rows, i // rows) for i in range(rows * cols)]
    ring: list[Chip] = [(0, 0)]
    for pair in range(0, rows, 2):
        ring += [(pair, c) for c in range(1, cols)]
        ring += [(pair + 1, c) for c in range(cols - 1, 0, -1)]
    ring += [(r, 0) for r in range(rows - 1, 0, -1)]
    return ring


def physical_shape_3d_from_topology_proto_4d(
    mesh_shape: Sequence[int], fold_xy: bool = False
) -> list[int]:
    """A TPU topology's ``[x, y, z, cores]`` as ``[rows, cols, cores]``:
    ``[x * y, z, cores]`` with ``fold_xy``, else ``[y * z, x, cores]``."""
    if len(mesh_shape) != 4:
        raise ArgumentError(
            f"topology mesh shape {list(mesh_shape)}: expected 4 sizes [x, y, z, cores]"
        )
    x, y, z, cores = (int(n) for n in mesh_shape)
    return [x * y, z, cores] if fold_xy else [y * z, x, cores]


def _is_power_of_2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def _torus_cores(
    logical: Sequence[int], rows: int, cols: int, cores: int
) -> list[Core] | None:
    """``(row, col, core)`` of each logical processor (logical dims of size
    1 dropped; ``rows``, ``cols`` powers of 2), or None where the tiling does
    not apply (then the caller keeps the row-major order)."""
    total = rows * cols * cores
    if len(logical) == 1:
        ring = ring_2d(rows, cols)
        return [(*ring[p // cores], p % cores) for p in range(total)]
    # The first logical dim counts tiles; the others lay out within a tile.
    tiles, per_tile = logical[0], total // logical[0]
    tile_chips, extra = divmod(per_tile, cores)
    if extra or not _is_power_of_2(tile_chips):
        return None
    if len(logical) == 2 and tile_chips in (rows, cols):
        # One whole column (or row) of chips per tile.
        t_rows, t_cols = (rows, 1) if tile_chips == rows else (1, cols)
    else:  # near-square tiles that fit the grid
        t_rows = 2 ** ((tile_chips.bit_length() - 1) // 2)
        t_rows = max(min(t_rows, rows), tile_chips // cols)
        t_cols = tile_chips // t_rows
    inner = _torus_cores(logical[1:], t_rows, t_cols, cores)
    if inner is None:
        return None
    tile_ring = ring_2d(rows // t_rows, cols // t_cols)
    assert len(tile_ring) == tiles, (tile_ring, tiles)
    out: list[Core] = []
    for p in range(total):
        (tr, tc), (r, c, core) = tile_ring[p // per_tile], inner[p % per_tile]
        out.append((tr * t_rows + r, tc * t_cols + c, core))
    return out


def _device_assignment_pnums(
    physical: Sequence[int], cores: Sequence[Core], assignment: DeviceAssignment
) -> list[int]:
    """Replica ids of ``cores`` (one core per chip) under ``assignment``."""
    x_size, y_size = (int(n) for n in list(assignment.topology.mesh_shape)[:2])
    replica_at: dict[int, int] = {}
    for replica in range(assignment.num_replicas):
        x, y, z = (int(c) for c in list(assignment.coordinates(replica, 0))[:3])
        replica_at[x + y * x_size + z * x_size * y_size] = replica
    try:
        return [replica_at[row + col * physical[0]] for row, col, _ in cores]
    except KeyError as e:
        raise ArgumentError(
            f"device assignment of {assignment.num_replicas} replicas has no "
            f"replica at chip {e.args[0]} of the physical grid {list(physical)}"
        ) from None


@overload
def auto_logical_to_physical_tpu(
    logical_shape: Sequence[int],
    physical_shape: Sequence[int],
    return_coordinates: Literal[False] = False,
    device_assignment: DeviceAssignment | None = None,
    *,
    logical_cores_per_chip: int = 2,
    fold_xy: bool = False,
) -> list[int]: ...


@overload
def auto_logical_to_physical_tpu(
    logical_shape: Sequence[int],
    physical_shape: Sequence[int],
    return_coordinates: Literal[True],
    device_assignment: DeviceAssignment | None = None,
    *,
    logical_cores_per_chip: int = 2,
    fold_xy: bool = False,
) -> list[list[int]]: ...


def auto_logical_to_physical_tpu(
    logical_shape: Sequence[int],
    physical_shape: Sequence[int],
    return_coordinates: bool = False,
    device_assignment: DeviceAssignment | None = None,
    *,
    logical_cores_per_chip: int = 2,
    fold_xy: bool = False,
) -> list[int] | list[list[int]]:
    """The physical core of each logical processor: a permutation of
    ``range(prod(physical_shape))`` (or, with ``return_coordinates``, each
    one's ``[row, col, core]``).

    ``physical_shape`` is ``[rows, cols, cores]`` (a 4-D TPU topology shape
    ``[x, y, z, cores]`` is folded first, see
    :func:`physical_shape_3d_from_topology_proto_4d`).  On a grid of
    power-of-2 rows and columns with ``logical_cores_per_chip`` cores per
    chip, a 1-D logical mesh follows :func:`ring_2d` chip by chip; otherwise
    the first logical dim numbers tiles (in ring order) and the rest is laid
    out the same way inside each tile, a near-square rectangle of chips (a
    whole column or row when that is exactly its size).  Any other physical
    shape keeps the row-major order.  Physical cores are numbered row-major
    over ``[rows, cols, cores]``; with one core per chip and a TPU
    ``device_assignment``, by its replica ids instead.

    Mesh TF reads ``logical_cores_per_chip`` and ``fold_xy`` from TF flags
    (defaults 2 and False); they are arguments here.

    >>> auto_logical_to_physical_tpu([8], [2, 2, 2])
    [0, 1, 2, 3, 6, 7, 4, 5]
    """
    physical = [int(n) for n in physical_shape]
    if len(physical) == 4:
        physical = physical_shape_3d_from_topology_proto_4d(physical, fold_xy)
    logical = [int(n) for n in logical_shape]
    if any(n < 1 for n in logical + physical):
        raise ArgumentError(
            f"logical shape {logical} and physical shape {physical}: sizes must be >= 1"
        )
    if math.prod(logical) != math.prod(physical):
        raise ArgumentError(
            f"logical shape {logical} ({math.prod(logical)} processors) and "
            f"physical shape {physical} ({math.prod(physical)} cores) must have "
            "the same product"
        )
    logical = [n for n in logical if n != 1]
    total = math.prod(physical)
    cores: list[Core] | None = None
    if (
        len(physical) == 3
        and physical[2] == logical_cores_per_chip
        and _is_power_of_2(physical[0])
        and _is_power_of_2(physical[1])
        and logical
    ):
        cores = _torus_cores(logical, *physical)
    if cores is None:  # row-major order
        if return_coordinates:
            return [pnum_to_processor_coordinates(physical, p) for p in range(total)]
        return list(range(total))
    if return_coordinates:
        return [list(c) for c in cores]
    if logical_cores_per_chip == 1 and device_assignment is not None:
        return _device_assignment_pnums(physical, cores, device_assignment)
    return [processor_coordinates_to_pnum(physical, c) for c in cores]
