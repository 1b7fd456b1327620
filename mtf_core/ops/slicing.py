"""Slicing ops: ``concat``, ``split``, ``stack``, ``unstack``, ``slice`` and
``pad`` (``shift`` lives in :mod:`mtf_core.ops.shift` and is re-exported here).

``concat``/``split``/``slice``/``pad`` need their dimension whole, and so does
``unstack``: they mark it unsplittable (the planner never splits it), and if a
user's layout splits it anyway they gather it first (allconcat), work locally
and split the output again (free).  ``stack`` works under any layout: each
device stacks its slices and keeps its block of the new dimension.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import ShapeError
from mtf_core.graph import (
    Operation,
    Tensor,
    check_same_dtype,
    check_same_mesh,
    check_same_shape,
)
from mtf_core.ops._local import take
from mtf_core.ops.arguments import check_int, dim_of
from mtf_core.ops.reshape import (
    gather_collectives,
    lower_gathered,
    lower_resplit,
)

# Re-exported: ``shift`` was defined here first.
from mtf_core.ops.shift import Shift as Shift
from mtf_core.ops.shift import shift as shift
from mtf_core.ops.shift import shift_pieces as shift_pieces
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape, dimension_name


def _zeros_where_missing(
    grad_ys: Sequence[Tensor | None], outputs: Sequence[Tensor]
) -> list[Tensor] | None:
    """The output gradients with zeros for the unused outputs (None if all are)."""
    if all(g is None for g in grad_ys):
        return None
    from mtf_core.ops.creation import zeros

    return [
        g if g is not None else zeros(t.mesh, t.shape, t.dtype)
        for g, t in zip(grad_ys, outputs)
    ]


class WholeDimOp(Operation):
    """An op computed locally once its dimension ``self.dim_name`` is whole.

    Under a layout that splits that dimension anyway, each input is gathered
    (allconcat) first, input by input, and each output split again (free).
    """

    dim_name: str

    def flops(self) -> float:
        return 0.0

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        out: list[CollectiveSpec] = []
        for x in self.inputs:
            out += gather_collectives(ctx, x, [self.dim_name])
        return out

    def _gathered_inputs(self, lowering: Any) -> list[Any]:
        impl = lowering.mesh_impl(self)
        return [
            lower_gathered(impl, lowering.tensors[x], x.shape, [self.dim_name])
            for x in self.inputs
        ]

    def _set_outputs(self, lowering: Any, laid: Sequence[Any]) -> None:
        impl = lowering.mesh_impl(self)
        for t, v in zip(self.outputs, laid):
            lowering.set_tensor_lowering(
                t, lower_resplit(impl, v, t.shape, [self.dim_name])
            )


# --------------------------------------------------------------------------
# concat / split
# --------------------------------------------------------------------------


class Concat(WholeDimOp):
    """``concat(xs, dim_name)``: joins tensors along one dimension."""

    op_type = "Concat"

    def __init__(
        self, xs: Sequence[Tensor], concat_dim_name: str, name: str | None = None
    ) -> None:
        xs = list(xs)
        if not xs:
            raise ShapeError("concat needs at least one tensor")
        check_same_mesh(xs)
        dtype = check_same_dtype(xs, "concat")
        sizes = [dim_of(x, concat_dim_name, "concat").size for x in xs]
        axis = xs[0].shape.index(concat_dim_name)
        rest = xs[0].shape - [concat_dim_name]
        for x in xs[1:]:
            if (
                x.shape.index(concat_dim_name) != axis
                or x.shape - [concat_dim_name] != rest
            ):
                raise ShapeError(
                    f"concat: {x.name} [{x.shape}] and {xs[0].name} [{xs[0].shape}] "
                    f"must agree on every dimension but {concat_dim_name!r}"
                )
        super().__init__(xs, name=name or "concat")
        self.dim_name = concat_dim_name
        self.sizes = sizes
        self._unsplittable = frozenset([concat_dim_name])
        self._add_output(
            xs[0].shape.resize_dimension(concat_dim_name, sum(sizes)), dtype
        )

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None] * len(self.inputs)
        return list(split(dy, self.dim_name, self.sizes))

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        axis = self.inputs[0].shape.index(self.dim_name)
        ins = self._gathered_inputs(lowering)
        impl = lowering.mesh_impl(self)
        res = impl.slicewise(lambda *s: tf.concat(list(s), axis), *ins)
        self._set_outputs(lowering, [res])

    def attrs(self) -> dict[str, Any]:
        return {"concat_dim_name": self.dim_name}


def concat(
    xs: Sequence[Tensor], concat_dim_name: str, name: str | None = None
) -> Tensor:
    """Concatenates ``xs`` along their dimension ``concat_dim_name`` (the other
    dimensions must agree); the output dimension has the summed size."""
    xs = list(xs)
    if len(xs) == 1:
        dim_of(xs[0], concat_dim_name, "concat")
        return xs[0]
    return Concat(xs, dimension_name(concat_dim_name), name).outputs[0]


class Split(WholeDimOp):
    """``split(x, dim, sizes)``: pieces of ``x`` along ``dim`` (same name)."""

    op_type = "Split"

    def __init__(
        self, x: Tensor, split_dim: Dimension, sizes: list[int], name: str | None = None
    ) -> None:
        super().__init__([x], name=name or "split")
        self.dim_name = split_dim.name
        self.sizes = sizes
        self._unsplittable = frozenset([split_dim.name])
        for s in sizes:
            self._add_output(x.shape.resize_dimension(split_dim.name, s), x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        parts = _zeros_where_missing(grad_ys, self.outputs)
        return [None if parts is None else concat(parts, self.dim_name)]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        axis = self.inputs[0].shape.index(self.dim_name)
        (x,) = self._gathered_inputs(lowering)
        sizes = self.sizes
        pieces = impl.slicewise_multi(lambda s: tf.split(s, sizes, axis), len(sizes), x)
        self._set_outputs(lowering, pieces)

    def attrs(self) -> dict[str, Any]:
        return {"split_dim": self.dim_name, "sizes": list(self.sizes)}


def split(
    x: Tensor,
    split_dim: Any,
    num_or_size_splits: int | Sequence[int],
    name: str | None = None,
) -> list[Tensor]:
    """Splits ``x`` along ``split_dim`` into ``num_or_size_splits`` equal pieces
    (an int) or pieces of the given sizes (a list); each keeps the dim's name."""
    d = dim_of(x, split_dim, "split")
    if isinstance(num_or_size_splits, int):
        n = check_int(num_or_size_splits, "split: num_or_size_splits", 1)
        if d.size % n:
            raise ShapeError(
                f"split: dimension {d} of {x.name} does not divide into {n} equal pieces"
            )
        sizes = [d.size // n] * n
    else:
        sizes = [check_int(s, "split: a size", 1) for s in num_or_size_splits]
        if sum(sizes) != d.size:
            raise ShapeError(
                f"split: sizes {sizes} sum to {sum(sizes)}, but dimension {d} of "
                f"{x.name} has size {d.size}"
            )
    return Split(x, d, sizes, name).outputs


# --------------------------------------------------------------------------
# stack / unstack
# --------------------------------------------------------------------------


class Stack(Operation):
    """``stack(xs, dim_name, axis)``: a new dimension of size ``len(xs)``."""

    op_type = "Stack"

    def __init__(
        self, xs: Sequence[Tensor], dim_name: str, axis: int, name: str | None = None
    ) -> None:
        xs = list(xs)
        check_same_mesh(xs)
        dtype = check_same_dtype(xs, "stack")
        shape = check_same_shape(xs, "stack")
        if dim_name in shape.dimension_names:
            raise ShapeError(
                f"stack: the tensors already have a dimension {dim_name!r} [{shape}]"
            )
        if not -len(shape) - 1 <= axis <= len(shape):
            raise ShapeError(
                f"stack: axis {axis} is out of range for {len(shape)}-d tensors "
                f"(expected {-len(shape) - 1} .. {len(shape)})"
            )
        axis = axis % (len(shape) + 1)
        super().__init__(xs, name=name or "stack")
        self.dim_name = dim_name
        self.axis = axis
        dims = list(shape.dims)
        dims.insert(axis, Dimension(dim_name, len(xs)))
        self._add_output(Shape(dims), dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None] * len(self.inputs)
        return list(unstack(dy, self.dim_name))

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        axis = self.axis
        ins = [lowering.tensors[x] for x in self.inputs]
        res = impl.slicewise(lambda *s: tf.stack(list(s), axis), *ins)
        out = self.outputs[0]
        # Inputs lack the new dim, so they are whole along it: each device
        # keeps its own block (a local slice, no communication).
        lowering.set_tensor_lowering(
            out, lower_resplit(impl, res, out.shape, [self.dim_name])
        )

    def attrs(self) -> dict[str, Any]:
        return {"dim_name": self.dim_name, "axis": self.axis}


def stack(
    xs: Sequence[Tensor], dim_name: str, axis: int = 0, name: str | None = None
) -> Tensor:
    """Stacks tensors of one shape along a new dimension ``dim_name`` inserted
    at position ``axis``."""
    xs = list(xs)
    if not xs:
        raise ShapeError("stack needs at least one tensor")
    return Stack(xs, dimension_name(dim_name), axis, name).outputs[0]


class Unstack(WholeDimOp):
    """``unstack(x, dim)``: ``dim.size`` tensors without ``dim``."""

    op_type = "Unstack"

    def __init__(self, x: Tensor, dim: Dimension, name: str | None = None) -> None:
        super().__init__([x], name=name or "unstack")
        self.dim_name = dim.name
        self._unsplittable = frozenset([dim.name])
        for _ in range(dim.size):
            self._add_output(x.shape - [dim.name], x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        parts = _zeros_where_missing(grad_ys, self.outputs)
        if parts is None:
            return [None]
        return [stack(parts, self.dim_name, self.inputs[0].shape.index(self.dim_name))]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        axis = self.inputs[0].shape.index(self.dim_name)
        (x,) = self._gathered_inputs(lowering)
        n = len(self.outputs)
        pieces = impl.slicewise_multi(lambda s: tf.unstack(s, n, axis), n, x)
        self._set_outputs(lowering, pieces)

    def attrs(self) -> dict[str, Any]:
        return {"dim": self.dim_name}


def unstack(x: Tensor, dim: Any, name: str | None = None) -> list[Tensor]:
    """The ``dim.size`` tensors of ``x`` along ``dim``, each without ``dim``."""
    return Unstack(x, dim_of(x, dim, "unstack"), name).outputs


# --------------------------------------------------------------------------
# slice / pad
# --------------------------------------------------------------------------


class Slice(WholeDimOp):
    """``slice(x, begin, size, dim_name)``: positions ``begin:begin+size``."""

    op_type = "Slice"

    def __init__(
        self, x: Tensor, begin: int, size: int, dim_name: str, name: str | None = None
    ) -> None:
        super().__init__([x], name=name or "slice")
        self.dim_name = dim_name
        self.begin = begin
        self.size = size
        self._unsplittable = frozenset([dim_name])
        self._add_output(x.shape.resize_dimension(dim_name, size), x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        full = self.inputs[0].shape.get_dim_by_name(self.dim_name).size
        return [pad(dy, [self.begin, full - self.begin - self.size], self.dim_name)]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        axis = self.inputs[0].shape.index(self.dim_name)
        (x,) = self._gathered_inputs(lowering)
        b, n = self.begin, self.size
        res = impl.slicewise(lambda s: take(tf, s, axis, b, n), x)
        self._set_outputs(lowering, [res])

    def attrs(self) -> dict[str, Any]:
        return {"begin": self.begin, "size": self.size, "slice_dim_name": self.dim_name}


def slice(  # noqa: A001  (Mesh TensorFlow's name)
    x: Tensor, begin: int, size: int, slice_dim_name: str, name: str | None = None
) -> Tensor:
    """Positions ``begin .. begin+size-1`` of ``x`` along ``slice_dim_name``
    (the output dimension keeps the name, with size ``size``)."""
    d = dim_of(x, slice_dim_name, "slice")
    check_int(begin, "slice: begin")
    check_int(size, "slice: size", 1)
    if begin + size > d.size:
        raise ShapeError(
            f"slice: begin {begin} + size {size} runs past dimension {d} of {x.name}"
        )
    if begin == 0 and size == d.size:
        return x
    return Slice(x, begin, size, d.name, name).outputs[0]


class Pad(WholeDimOp):
    """``pad(x, [before, after], dim_name)``: zeros on both ends of a dim."""

    op_type = "Pad"

    def __init__(
        self,
        x: Tensor,
        paddings: tuple[int, int],
        dim_name: str,
        name: str | None = None,
    ) -> None:
        super().__init__([x], name=name or "pad")
        self.dim_name = dim_name
        self.paddings = paddings
        self._unsplittable = frozenset([dim_name])
        size = x.shape.get_dim_by_name(dim_name).size + sum(paddings)
        self._add_output(x.shape.resize_dimension(dim_name, size), x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        size = self.inputs[0].shape.get_dim_by_name(self.dim_name).size
        return [slice(dy, self.paddings[0], size, self.dim_name)]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x_shape = self.inputs[0].shape
        axis = x_shape.index(self.dim_name)
        (x,) = self._gathered_inputs(lowering)
        pads = [[0, 0] for _ in x_shape]
        pads[axis] = list(self.paddings)
        res = impl.slicewise(lambda s: tf.pad(s, pads), x)
        self._set_outputs(lowering, [res])

    def attrs(self) -> dict[str, Any]:
        return {"paddings": list(self.paddings), "dim_name": self.dim_name}


def pad(
    x: Tensor, paddings: Sequence[int], dim_name: str, name: str | None = None
) -> Tensor:
    """Pads ``x`` with ``paddings = [before, after]`` zeros along ``dim_name``."""
    d = dim_of(x, dim_name, "pad")
    paddings = list(paddings)
    if len(paddings) != 2:
        raise ShapeError(f"pad: paddings {paddings!r}; expected [before, after]")
    before = check_int(paddings[0], "pad: paddings[0]")
    after = check_int(paddings[1], "pad: paddings[1]")
    if before == after == 0:
        return x
    return Pad(x, (before, after), d.name, name).outputs[0]
