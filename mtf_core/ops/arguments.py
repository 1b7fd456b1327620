"""Checks of the arguments the public op functions take.

Users name a dimension by its name (``"hidden"``) or by a dimension
(``Dimension``, ``"hidden:8"``, ``("hidden", 8)``); these helpers turn either
into the tensor's own :class:`~mtf_core.shapes.Dimension`, with errors that say
which op, which tensor and what was expected.
"""

from __future__ import annotations

from typing import Any

from mtf_core.errors import ShapeError
from mtf_core.graph import Mesh, Tensor, check_tensor
from mtf_core.shapes import Dimension, convert_to_dimension


def _is_bare_name(dim: Any) -> bool:
    return isinstance(dim, str) and ":" not in dim


def sized_dim(dim: Any, what: str) -> Dimension:
    """``dim`` as a Dimension; a bare name is refused, as it has no size.

    >>> str(sized_dim("vocab:32", "one_hot"))
    'vocab:32'
    """
    if _is_bare_name(dim):
        raise ShapeError(
            f"{what}: dimension {dim!r} has no size; expected a Dimension or "
            "'name:size'"
        )
    d = convert_to_dimension(dim)
    if d is None:
        raise ShapeError(f"{what}: dimension is None; expected a Dimension")
    return d


def dim_of(x: Tensor, dim: Any, what: str) -> Dimension:
    """The dimension of ``x`` that ``dim`` names: a name, or a dimension whose
    size must be the one ``x`` has."""
    check_tensor(x, f"{what}:")
    given = None if _is_bare_name(dim) else sized_dim(dim, what)
    name = dim if given is None else given.name
    if name not in x.shape.dimension_names:
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] has no dimension {name!r}; expected one "
            f"of {x.shape.dimension_names}"
        )
    found = x.shape.get_dim_by_name(name)
    if given is not None and given.size != found.size:
        raise ShapeError(
            f"{what}: dimension {given} does not match {found} of {x.name} [{x.shape}]"
        )
    return found


def check_int(value: Any, what: str, minimum: int = 0) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ShapeError(f"{what} is {value!r}; expected an integer >= {minimum}")
    return value


def check_mesh(mesh: Any, what: str) -> Mesh:
    """``mesh`` if it is an mtf.Mesh."""
    if not isinstance(mesh, Mesh):
        raise ShapeError(f"{what}: {mesh!r} is not an mtf.Mesh")
    return mesh
