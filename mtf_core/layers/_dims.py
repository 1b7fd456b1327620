"""How layers take dimensions: one or many, as dims, names or shape strings."""

from __future__ import annotations

from typing import Any

from mtf_core.errors import ShapeError
from mtf_core.graph import Tensor
from mtf_core.shapes import (
    Dimension,
    convert_to_dimension,
    convert_to_shape,
    dimension_name,
)


def dims(x: Any) -> list[Dimension]:
    """Sized dims from None, one dim (``Dimension``, ``"name:size"``), a list
    of them, a Shape or a shape string."""
    if x is None:
        return []
    if isinstance(x, (Dimension, str)) and not (isinstance(x, str) and "," in x):
        d = convert_to_dimension(x)
        return [d] if d is not None else []
    return list(convert_to_shape(x).dims)


def dim_refs(x: Any) -> list[Any]:
    """Dims given as names or dims (a list, a Shape, one of them, or a shape
    string), without converting bare names, which have no size."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)) and not (
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], int)
    ):
        return list(x)
    if isinstance(x, str) and ":" not in x:
        return [x]
    return dims(x)


def dim_in(x: Tensor, dim: Any, what: str) -> Dimension:
    """The dimension of ``x`` named like ``dim`` (a name or a Dimension)."""
    name = dimension_name(dim)
    if name not in x.shape.dimension_names:
        raise ShapeError(f"{what}: {x.name} [{x.shape}] has no dimension {name!r}")
    return x.shape.get_dim_by_name(name)
