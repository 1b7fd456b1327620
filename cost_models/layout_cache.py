"""A LayoutContext that remembers its answers.

Pricing a layout asks the same few questions (which mesh axis splits ``d``?
how many bytes is a slice of this shape?) thousands of times, and the rules
and the mesh of a context never change, so :class:`CachedLayoutContext`
answers each question once, by asking :class:`mtf_core.comm.LayoutContext`
(the code the lowering runs), and then from a dict.  Shapes are looked up by
identity first: hashing a Shape hashes every Dimension, and most tensors of a
graph share their Shape objects.

:func:`layout_context` makes one for a graph (checking every tensor's layout
up front, as the lowering does); :class:`LayoutSizes` answers the two
questions op pricing asks most from one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.comm import LayoutContext
from mtf_core.errors import GraphError, LayoutError
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.layout import LayoutRules, LayoutRulesLike, TensorLayout
from mtf_core.shapes import Shape, ShapeLike


class CachedLayoutContext(LayoutContext):
    """:class:`LayoutContext` with memoized per-dim and per-shape answers.

    Errors (a layout the lowering rejects) are never cached: they are raised
    again on every call, by the base class.
    """

    def __init__(self, mesh_shape: Shape, rules: LayoutRules, *args: Any) -> None:
        super().__init__(mesh_shape, rules, *args)
        # A name no rule mentions is split by no axis; ask the base class
        # about the others once.
        #: ``{dim name: mesh axis}`` for every name the rules split.
        self.split_axes: dict[str, int] = {}
        for name, _ in self.rules:
            if (axis := LayoutContext.mesh_axis(self, name)) is not None:
                self.split_axes[name] = axis
        self._live_axes: dict[str, int] = {}
        for name in self.split_axes:
            if (axis := LayoutContext.effective_mesh_axis(self, name)) is not None:
                self._live_axes[name] = axis
        self._layout_of: dict[int, tuple[Shape, TensorLayout]] = {}
        self._bytes_of: dict[tuple[int, str], tuple[Shape, int]] = {}
        self._elem_bytes: dict[str, int] = {}
        self._axis_sizes = [d.size for d in self.mesh_shape.dims]

    @classmethod
    def wrap(cls, ctx: LayoutContext) -> CachedLayoutContext:
        """``ctx`` itself if it caches already, else a caching copy of it."""
        if isinstance(ctx, CachedLayoutContext):
            return ctx
        return cls(ctx.mesh_shape, ctx.rules)

    def mesh_axis(self, dim: Any) -> int | None:
        return self.split_axes.get(dim if isinstance(dim, str) else dim.name)

    def devices_splitting(self, dim_names: Iterable[str]) -> int:
        split = self.split_axes
        axes = {a for n in dim_names if (a := split.get(n)) is not None}
        return math.prod(self._axis_sizes[a] for a in axes)

    def effective_mesh_axis(self, dim: Any) -> int | None:
        return self._live_axes.get(dim if isinstance(dim, str) else dim.name)

    def tensor_layout(self, shape: Any) -> TensorLayout:
        if type(shape) is not Shape:
            return super().tensor_layout(shape)
        hit = self._layout_of.get(id(shape))
        if hit is not None and hit[0] is shape:
            return hit[1]
        layout = self._tensor_layout(shape)
        self._layout_of[id(shape)] = (shape, layout)
        return layout

    def _tensor_layout(self, shape: Shape) -> TensorLayout:
        # LayoutRules.tensor_layout from the memoized axes, for layouts it
        # accepts (no mesh axis twice, every split size divisible); anything
        # else goes to the base class, which raises the lowering's error.
        axes: list[int | None] = []
        used = 0
        split = self.split_axes
        for d in shape.dims:
            a = split.get(d.name)
            if a is not None:
                if used >> a & 1 or d.size % self._axis_sizes[a]:
                    return super().tensor_layout(shape)
                used |= 1 << a
            axes.append(a)
        return TensorLayout(tuple(axes))

    def slice_bytes(self, shape: Any, dtype: Any) -> int:
        if type(shape) is not Shape or type(dtype) is not str:
            return super().slice_bytes(shape, dtype)
        key = (id(shape), dtype)
        hit = self._bytes_of.get(key)
        if hit is not None and hit[0] is shape:
            return hit[1]
        nbytes = self._slice_bytes(shape, dtype)
        self._bytes_of[key] = (shape, nbytes)
        return nbytes

    def _slice_bytes(self, shape: Shape, dtype: str) -> int:
        # The base class's arithmetic from the memoized axes, for layouts it
        # accepts (no mesh axis twice, every split size divisible); anything
        # else goes to the base class, which raises the lowering's error.
        elem = self._elem_bytes.get(dtype)
        if elem is None:
            elem = self._elem_bytes[dtype] = dtypes.size_bytes(dtype)
        nbytes = elem
        used = 0
        split = self.split_axes
        for d in shape.dims:
            a = split.get(d.name)
            if a is None:
                nbytes *= d.size
                continue
            n = self._axis_sizes[a]
            if used >> a & 1 or d.size % n:
                return super().slice_bytes(shape, dtype)
            used |= 1 << a
            nbytes *= d.size // n
        return nbytes


def layout_context(
    graph: Graph,
    mesh_shape: ShapeLike,
    layout_rules: LayoutRulesLike,
    operations: Sequence[Operation] | None = None,
) -> LayoutContext:
    """A LayoutContext for ``graph``, with the layout of every tensor of
    ``operations`` (default: every op) checked the way the lowering checks
    the ops it lowers up front (LayoutError naming the tensor)."""
    ctx = CachedLayoutContext.make(mesh_shape, layout_rules)
    meshes = {op.mesh for op in graph.operations}
    if len(meshes) > 1:
        raise GraphError(
            f"graph uses {len(meshes)} meshes ({sorted(m.name for m in meshes)}); "
            "the cost model prices one mesh"
        )
    for op in graph.operations if operations is None else operations:
        for t in op.outputs:
            try:
                ctx.tensor_layout(t.shape)
            except LayoutError as e:
                raise type(e)(f"tensor {t.name}: {e}") from None
    return ctx


class LayoutSizes:
    """Slice bytes and work division under one layout.

    Answers what ``ctx.slice_bytes`` and ``ctx.devices_splitting`` answer, by
    tensor, from a :class:`CachedLayoutContext` (slice bytes by shape: most
    tensors share a few shapes; layouts the lowering rejects raise as there).
    """

    def __init__(self, ctx: LayoutContext) -> None:
        self._ctx = CachedLayoutContext.wrap(ctx)

    def slice_bytes(self, t: Tensor) -> int:
        return self._ctx.slice_bytes(t.shape, t.dtype)

    def slice_dims(self, t: Tensor) -> list[int]:
        return self._ctx.slice_shape(t.shape)

    def devices_splitting(self, dim_names: Iterable[str]) -> int:
        return self._ctx.devices_splitting(dim_names)
