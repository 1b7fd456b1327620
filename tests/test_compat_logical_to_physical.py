"""Mesh TF's ``auto_logical_to_physical_tpu`` and processor-coordinate helpers
(``mtf_core.compat``): a logical mesh mapped onto a TPU-shaped grid of cores,
as arithmetic, without a TPU."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from mtf_core.compat.coordinates import (
    pnum_to_processor_coordinates,
    processor_coordinates_to_pnum,
)
from mtf_core.compat.simd_mesh_impl import (
    auto_logical_to_physical_tpu,
    physical_shape_3d_from_topology_proto_4d,
    ring_2d,
)
from mtf_core.errors import ArgumentError


def test_coordinates_are_row_major_and_invert():
    assert pnum_to_processor_coordinates([2, 3, 4], 23) == [1, 2, 3]
    assert pnum_to_processor_coordinates([2, 3, 4], 5) == [0, 1, 1]
    for p in range(24):
        c = pnum_to_processor_coordinates([2, 3, 4], p)
        assert processor_coordinates_to_pnum([2, 3, 4], c) == p


def test_coordinates_reject_values_outside_the_mesh():
    with pytest.raises(ArgumentError, match=r"processor number 6 .*\[2, 3\]"):
        pnum_to_processor_coordinates([2, 3], 6)
    with pytest.raises(ArgumentError, match=r"coordinates \[2, 0\]"):
        processor_coordinates_to_pnum([2, 3], [2, 0])
    with pytest.raises(ArgumentError, match="list of integers"):
        pnum_to_processor_coordinates("2,3", 0)  # type: ignore[arg-type]


def _closes_ring(chips: Sequence[tuple[int, int]], closed: bool = True) -> bool:
    """Every chip next to the one before it (and, if ``closed``, the last
    next to the first)."""
    pairs = zip(chips, [*chips[1:], chips[0]] if closed else chips[1:])
    return all(abs(a - c) + abs(b - d) == 1 for (a, b), (c, d) in pairs)


def test_ring_2d_walks_neighbours():
    assert ring_2d(2, 2) == [(0, 0), (0, 1), (1, 1), (1, 0)]
    assert ring_2d(4, 3) == [
        (0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2), (3, 2),
        (3, 1), (3, 0), (2, 0), (1, 0),
    ]  # fmt: skip
    for rows, cols in [(2, 2), (4, 4), (8, 8), (2, 8), (8, 2), (4, 16)]:
        ring = ring_2d(rows, cols)
        assert sorted(ring) == [(r, c) for r in range(rows) for c in range(cols)]
        assert _closes_ring(ring)
    assert ring_2d(1, 3) == [(0, 0), (0, 1), (0, 2)]
    assert ring_2d(3, 2) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_one_dim_follows_the_chip_ring_two_cores_per_chip():
    # ring of 2x2 chips: (0,0) (0,1) (1,1) (1,0); both cores of a chip in turn
    assert auto_logical_to_physical_tpu([8], [2, 2, 2]) == [0, 1, 2, 3, 6, 7, 4, 5]
    assert auto_logical_to_physical_tpu([8], [2, 2, 2], return_coordinates=True) == [
        [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1],
        [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 1],
    ]  # fmt: skip


def test_later_dims_fill_a_column_of_chips_when_it_fits_exactly():
    # [2, 4] on 2x2 chips: each tile (the 4) is one column of 2 chips.
    assert auto_logical_to_physical_tpu([2, 4], [2, 2, 2]) == [0, 1, 4, 5, 2, 3, 6, 7]
    # size-1 logical dims are dropped first
    assert auto_logical_to_physical_tpu([1, 2, 1, 4], [2, 2, 2]) == [
        0, 1, 4, 5, 2, 3, 6, 7,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("logical", "physical", "tile"),
    [([4, 32], [8, 8, 2], (4, 4)), ([2, 64], [8, 8, 2], (4, 8)),
     ([8, 16], [8, 8, 2], (8, 1)), ([16, 4, 2], [8, 8, 2], (2, 2))],
)  # fmt: skip
def test_each_tile_is_a_rectangle_of_chips_walked_as_a_ring(
    logical: list[int], physical: list[int], tile: tuple[int, int]
):
    coords = auto_logical_to_physical_tpu(logical, physical, return_coordinates=True)
    per_tile = math.prod(logical[1:])
    for t in range(logical[0]):
        chips = [(r, c) for r, c, _ in coords[t * per_tile : (t + 1) * per_tile]]
        rows = sorted({r for r, _ in chips})
        cols = sorted({c for _, c in chips})
        assert (len(rows), len(cols)) == tile
        assert rows == list(range(rows[0], rows[0] + tile[0]))
        assert cols == list(range(cols[0], cols[0] + tile[1]))
        if len(logical) == 2:  # the tile's chips (two cores each) in ring order
            closed = min(tile) > 1
            assert _closes_ring(chips[::2], closed)


@pytest.mark.parametrize(
    ("logical", "physical"),
    # Mesh TF's own cases (testLogicalToPhysical), and more
    [([128], [8, 8, 2]), ([8, 16], [8, 8, 2]), ([32, 4], [8, 8, 2]),
     ([2, 32, 4], [256]), ([4, 4, 8], [8, 8, 2]), ([64, 2], [8, 8, 2]),
     ([2, 2, 2, 2, 2, 2, 2], [8, 8, 2]), ([6], [3, 1, 2]), ([4, 8], [2, 2, 2, 4])],
)  # fmt: skip
def test_result_is_a_permutation(logical: list[int], physical: list[int]):
    got = auto_logical_to_physical_tpu(logical, physical)
    assert sorted(got) == list(range(math.prod(physical)))


def test_other_grids_keep_row_major_order():
    assert auto_logical_to_physical_tpu([12], [3, 2, 2]) == list(range(12))
    # four cores per chip but the default of two per chip: no ring
    assert auto_logical_to_physical_tpu([16], [2, 2, 4]) == list(range(16))
    assert auto_logical_to_physical_tpu([4], [4], return_coordinates=True) == [
        [0], [1], [2], [3],
    ]  # fmt: skip
    with_four = auto_logical_to_physical_tpu([16], [2, 2, 4], logical_cores_per_chip=4)
    assert with_four == [0, 1, 2, 3, 4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11]


def test_topology_shape_is_folded_to_three_dims():
    assert physical_shape_3d_from_topology_proto_4d([2, 4, 8, 2]) == [32, 2, 2]
    assert physical_shape_3d_from_topology_proto_4d([2, 4, 8, 2], fold_xy=True) == [
        8, 8, 2,
    ]  # fmt: skip
    # x=2, y=2, z=1 -> [y*z, x, cores] = [2, 2, 2]: the 2x2 ring
    assert auto_logical_to_physical_tpu([8], [2, 2, 1, 2]) == [0, 1, 2, 3, 6, 7, 4, 5]
    with pytest.raises(ArgumentError, match=r"\[x, y, z, cores\]"):
        physical_shape_3d_from_topology_proto_4d([2, 2, 2])


class _Topology:
    mesh_shape = (2, 2, 1, 1)


class _Assignment:
    """Replica r on chip x = r % 2, y = r // 2 (a TPU device assignment's
    coordinates, as Mesh TF reads them)."""

    num_replicas = 4
    topology = _Topology()

    def coordinates(self, replica: int, logical_core: int) -> list[int]:
        return [replica % 2, replica // 2, 0, logical_core]


def test_one_core_per_chip_numbers_by_device_assignment():
    # chip ring (0,0) (0,1) (1,1) (1,0); row + 2*col is the replica's x + 2*y
    got = auto_logical_to_physical_tpu(
        [4], [2, 2, 1], device_assignment=_Assignment(), logical_cores_per_chip=1
    )
    assert got == [0, 2, 3, 1]
    row_major = auto_logical_to_physical_tpu([4], [2, 2, 1], logical_cores_per_chip=1)
    assert row_major == [0, 1, 3, 2]


def test_shapes_of_different_size_are_rejected():
    with pytest.raises(ArgumentError, match=r"\[8, 16\] \(128 processors\)"):
        auto_logical_to_physical_tpu([8, 16], [8, 4, 2])


def test_mesh_tensorflow_names(compat_installed: None):
    import mesh_tensorflow as mtf

    assert mtf.simd_mesh_impl.auto_logical_to_physical_tpu([8], [2, 2, 2])[4] == 6
    assert mtf.pnum_to_processor_coordinates([2, 3], 4) == [1, 1]
    assert mtf.processor_coordinates_to_pnum(mtf.Shape("a:2;b:3"), [1, 1]) == 4


@pytest.fixture()
def compat_installed():
    import mtf_core.compat as compat

    compat.install()
    yield
    compat.uninstall()
