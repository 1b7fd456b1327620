"""``shift``: moves a tensor along one dimension, with zeros or wrapping.

``shift`` along a split dimension (``n`` devices, blocks of ``k``) writes
``offset = q*k + r``: output block ``c`` is the last ``r`` elements of input
block ``c-q-1`` followed by the first ``k-r`` of block ``c-q``, so each device
receives two edge pieces (``shift_by_n_processors``) and sends exactly those
bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import ShapeError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops._local import take
from mtf_core.ops.arguments import dim_of
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension


def shift_pieces(
    offset: int, k: int, n: int, wrap: bool
) -> list[tuple[int, int, int, str]]:
    """How a shift by ``offset`` along a dim split into ``n`` blocks of ``k``
    moves data: ``(src_start, length, block_shift, how)`` for the two pieces of
    each output block, in output order, ``how`` in local | shift | zero."""
    q, r = divmod(offset, k)
    out = []
    for start, length, s in ((k - r, r, q + 1), (0, k - r, q)):
        if length == 0:
            continue
        if wrap:
            s %= n
        if s == 0:
            how = "local"
        elif not wrap and abs(s) >= n:
            how = "zero"
        else:
            how = "shift"
        out.append((start, length, s, how))
    return out


class Shift(Operation):
    """``shift(x, offset, dim, wrap)``: ``y[i] = x[i - offset]`` along ``dim``
    (zeros, or wrapped values, where ``i - offset`` is out of range)."""

    op_type = "Shift"

    def __init__(
        self,
        x: Tensor,
        offset: int,
        dim: Dimension,
        wrap: bool,
        name: str | None = None,
    ) -> None:
        super().__init__([x], name=name or "shift")
        self.offset = offset
        self.dim = dim
        self.wrap = wrap
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        return [None if dy is None else shift(dy, -self.offset, self.dim, self.wrap)]

    def _pieces(self, ctx: Any) -> tuple[int | None, list[tuple[int, int, int, str]]]:
        m = ctx.effective_mesh_axis(self.dim.name)
        if m is None:
            return None, []
        n = ctx.mesh_shape[m].size
        return m, shift_pieces(self.offset, self.dim.size // n, n, self.wrap)

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        m, pieces = self._pieces(ctx)
        if m is None:
            return []
        x = self.inputs[0]
        k = self.dim.size // ctx.mesh_shape[m].size
        per_position = ctx.slice_bytes(x.shape, x.dtype) // k
        # The zero-length and local pieces move nothing; shifted ones send
        # exactly their edge piece.
        return [
            CollectiveSpec("shift", (ctx.axis_name(m),), per_position * length)
            for _start, length, _s, how in pieces
            if how == "shift"
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        axis = x.shape.index(self.dim.name)
        laid = lowering.tensors[x]
        m, pieces = self._pieces(impl.ctx)
        if m is None:
            res = impl.slicewise(
                lambda s: _local_shift(tf, s, self.offset, axis, self.wrap), laid
            )
            lowering.set_tensor_lowering(self.outputs[0], res)
            return
        parts = []
        for start, length, s, how in pieces:
            piece = impl.slicewise(
                lambda v, b=start, n=length: take(tf, v, axis, b, n), laid
            )
            if how == "shift":
                piece = impl.shift_by_n_processors(piece, m, s, self.wrap)
            elif how == "zero":
                piece = impl.slicewise(tf.zeros_like, piece)
            parts.append(piece)
        res = (
            parts[0]
            if len(parts) == 1
            else impl.slicewise(lambda *p: tf.concat(list(p), axis), *parts)
        )
        lowering.set_tensor_lowering(self.outputs[0], res)

    def attrs(self) -> dict[str, Any]:
        return {"offset": self.offset, "dim": self.dim.name, "wrap": self.wrap}


def _local_shift(tf: Any, s: Any, offset: int, axis: int, wrap: bool) -> Any:
    if wrap:
        return tf.roll(s, offset, axis)
    size = int(s.shape[axis])
    if abs(offset) >= size:
        return tf.zeros_like(s)
    if offset > 0:
        kept = take(tf, s, axis, 0, size - offset)
        return tf.concat([tf.zeros_like(take(tf, s, axis, 0, offset)), kept], axis)
    kept = take(tf, s, axis, -offset, size + offset)
    return tf.concat([kept, tf.zeros_like(take(tf, s, axis, 0, -offset))], axis)


def shift(
    x: Tensor, offset: int, dim: Any, wrap: bool, name: str | None = None
) -> Tensor:
    """Shifts ``x`` by ``offset`` positions along ``dim`` (right for positive):
    ``y[i] = x[i - offset]``, with zeros (or, if ``wrap``, the values that fell
    off the other end) where ``i - offset`` is out of range.  Works when ``dim``
    is split: devices exchange only the edge pieces."""
    d = dim_of(x, dim, "shift")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ShapeError(f"shift: offset {offset!r} is not an integer")
    if offset == 0 or (wrap and offset % d.size == 0):
        return x
    return Shift(x, offset, d, bool(wrap), name).outputs[0]
