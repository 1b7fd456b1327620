"""``mesh_tensorflow.auto_mtf.api``: the same functions as ``auto_mtf``, and
the mesh shapes ``layout_and_mesh_shape`` tries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mtf_core import extensions


def _mesh_shape_iterator(
    num_machines: int, max_mesh_shape_dimensions: int | None = None
) -> Iterator[list[int]]:
    """Mesh shapes of ``num_machines`` (a power of two): non-increasing sizes,
    each a power of two >= 2, at most ``max_mesh_shape_dimensions`` of them.

    >>> sorted(_mesh_shape_iterator(8))
    [[2, 2, 2], [4, 2], [8]]
    """
    if num_machines == 1:
        yield [1]
        return
    limit = max_mesh_shape_dimensions

    def shapes(rest: int, largest: int, prefix: list[int]) -> Iterator[list[int]]:
        if rest == 1:
            yield prefix
            return
        if limit is not None and len(prefix) >= limit:
            return
        size = min(rest, largest)
        while size >= 2:
            if rest % size == 0:
                yield from shapes(rest // size, size, [*prefix, size])
            size //= 2

    yield from shapes(num_machines, num_machines, [])


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(extensions.load("auto_mtf"), name)
