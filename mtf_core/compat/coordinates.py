"""Mesh TF's free functions between processor numbers and mesh coordinates.

``mtf.pnum_to_processor_coordinates(mesh_shape, pnum)`` and its inverse
``mtf.processor_coordinates_to_pnum(mesh_shape, coord)``: row-major order,
the last mesh dimension varying fastest (as mtf_core's ``MeshImpl`` methods of
the same names number a mesh's processors).

>>> pnum_to_processor_coordinates([2, 3], 4)
[1, 1]
>>> processor_coordinates_to_pnum([2, 3], [1, 1])
4
"""

from __future__ import annotations

from collections.abc import Sequence

from mtf_core.errors import ArgumentError
from mtf_core.shapes import Shape


def mesh_sizes(mesh_shape: Shape | Sequence[int]) -> list[int]:
    """The sizes of ``mesh_shape`` (a Shape or a list of integers)."""
    if isinstance(mesh_shape, Shape):
        return [d.size for d in mesh_shape.dims]
    if isinstance(mesh_shape, (str, bytes)) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in mesh_shape
    ):
        raise ArgumentError(
            f"mesh shape {mesh_shape!r}: expected a Shape or a list of integers"
        )
    return list(mesh_shape)


def pnum_to_processor_coordinates(
    mesh_shape: Shape | Sequence[int], pnum: int
) -> list[int]:
    """The coordinates of processor ``pnum`` in ``mesh_shape``."""
    sizes = mesh_sizes(mesh_shape)
    total = 1
    for n in sizes:
        total *= n
    if not 0 <= pnum < total:
        raise ArgumentError(
            f"processor number {pnum} is outside the mesh {sizes} "
            f"(expected 0 <= pnum < {total})"
        )
    coords = []
    for n in reversed(sizes):
        pnum, c = divmod(pnum, n)
        coords.append(c)
    return coords[::-1]


def processor_coordinates_to_pnum(
    mesh_shape: Shape | Sequence[int], coord: Sequence[int]
) -> int:
    """The processor number at ``coord`` in ``mesh_shape``."""
    sizes = mesh_sizes(mesh_shape)
    if len(coord) != len(sizes) or any(not 0 <= c < n for c, n in zip(coord, sizes)):
        raise ArgumentError(
            f"coordinates {list(coord)} are not in the mesh {sizes} "
            f"(expected {len(sizes)} coordinates, each 0 <= c < its size)"
        )
    pnum = 0
    for c, n in zip(coord, sizes):
        pnum = pnum * n + c
    return pnum
