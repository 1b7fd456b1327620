"""``mesh_tensorflow.auto_mtf.valid_layouts``: which tensor dims may go on
which mesh dims.

A dim may be split if no operation needs it whole (``op.unsplittable_dims``)
and it is not anonymous (named ``_...``); it may go on a mesh dim whose size
divides every size the dim has in the graph.
"""

from __future__ import annotations

import math
from typing import Any

from mtf_core.graph import Graph
from mtf_core.shapes import convert_to_shape


class LayoutValidator:
    """Valid (tensor dim, mesh dim) assignments of ``mtf_graph`` on a mesh."""

    def __init__(self, mtf_graph: Graph, mesh_shape: Any) -> None:
        names: set[str] = set()
        unsplittable: set[str] = set()
        gcd: dict[str, int] = {}
        for op in mtf_graph.operations:
            unsplittable |= op.unsplittable_dims
            for t in [*op.inputs, *op.outputs]:
                for d in t.shape.dims:
                    names.add(d.name)
                    gcd[d.name] = math.gcd(gcd.get(d.name, 0), d.size)
        self._splittable = {
            n for n in names if n not in unsplittable and not n.startswith("_")
        }
        self._gcd = gcd
        self._mesh = {d.name: d.size for d in convert_to_shape(mesh_shape).dims}

    @property
    def splittable_mtf_dimension_names(self) -> set[str]:
        return set(self._splittable)

    @property
    def mesh_dimension_name_to_size(self) -> dict[str, int]:
        return dict(self._mesh)

    def is_valid_assignment(
        self, mtf_dimension_name: str, mesh_dimension_name: str
    ) -> bool:
        return (
            mtf_dimension_name in self._splittable
            and self._gcd[mtf_dimension_name] % self._mesh[mesh_dimension_name] == 0
        )
