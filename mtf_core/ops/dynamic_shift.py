"""``dynamic_shift``: ``shift`` by an offset held in a tensor (one offset per
position of the offset's dims), Mesh TensorFlow's name and meaning.

Mesh TF's Transformer calls it to left-align decoded sequences after the
partial prompts (``sample_autoregressive(remove_partial_sequences=True)``).

It is composed of existing ops: ``y[..., i] = sum_j x[..., j] * [i == j +
offset]`` is a ``range`` compare, a ``cast`` and one ``einsum`` over a renamed
copy of ``dim``, so each part says what it costs and communicates.  When
``dim`` is split, the renamed copy is whole: the rename gathers ``x`` along
``dim``'s mesh axis and the einsum's output is split again, as any einsum
under that layout.
"""

from __future__ import annotations

from typing import Any

from mtf_core import dtypes
from mtf_core.errors import DTypeError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops.arguments import dim_of
from mtf_core.ops.einsum import einsum
from mtf_core.ops.indexing import mtf_range
from mtf_core.ops.reshape import rename_dimension
from mtf_core.ops.shift import shift


def dynamic_shift(
    x: Tensor, offset: Tensor | int, dim: Any, wrap: bool, name: str | None = None
) -> Tensor:
    """Shifts ``x`` right by ``offset`` along ``dim``: ``y[i] = x[i - offset]``,
    with zeros (or, if ``wrap``, the values that fell off the other end) where
    ``i - offset`` is out of range.

    ``offset`` is an integer tensor whose dims are dims of ``x`` other than
    ``dim`` (each position of them shifts by its own amount), or a Python int
    (then this is :func:`shift`).
    """
    d = dim_of(x, dim, "dynamic_shift")
    if not isinstance(offset, Tensor):
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise ShapeError(
                f"dynamic_shift: offset {offset!r} is neither an integer tensor "
                "nor an int"
            )
        return shift(x, offset, d, wrap, name=name)
    if d in offset.shape.dims:
        raise ShapeError(
            f"dynamic_shift: offset {offset.name} {offset.shape} has the shifted "
            f"dimension {d}; it may only have other dims of x {x.shape}"
        )
    extra = [o for o in offset.shape.dims if o not in x.shape.dims]
    if extra:
        raise ShapeError(
            f"dynamic_shift: offset {offset.name} {offset.shape} has "
            f"{', '.join(str(o) for o in extra)}, not a dimension of x {x.shape}"
        )
    if dtypes.as_dtype_name(offset.dtype) not in dtypes.INTEGER:
        raise DTypeError(
            f"dynamic_shift: offset {offset.name} is {offset.dtype}; expected an "
            "integer dtype"
        )
    source_name = f"_{d.name}_before_shift"
    source = rename_dimension(x, d.name, source_name)
    src_dim = source.shape.get_dim_by_name(source_name)
    target = mtf_range(x.mesh, src_dim, offset.dtype) + offset
    if wrap:
        target = ew.mod(target, d.size)
    here = mtf_range(x.mesh, d, offset.dtype)
    moves = ew.cast(ew.equal(here, target), x.dtype)
    return einsum([source, moves], output_shape=x.shape, name=name)
