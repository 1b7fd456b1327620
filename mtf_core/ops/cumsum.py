"""``cumsum`` along one dimension.

When the dimension is split over mesh axis ``m`` (``n`` devices), each device
adds to its local cumsum the sum of the blocks before (after, when reversed)
its own, from an allconcat of the ``n`` block totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.graph import Operation, Tensor
from mtf_core.ops.arguments import dim_of
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension


class Cumsum(Operation):
    """``cumsum(x, dim, exclusive)`` (``reverse`` sums from the end)."""

    op_type = "Cumsum"

    def __init__(
        self,
        x: Tensor,
        dim: Dimension,
        exclusive: bool,
        reverse: bool,
        name: str | None = None,
    ) -> None:
        super().__init__([x], name=name or "cumsum")
        self.dim = dim
        self.exclusive = exclusive
        self.reverse = reverse
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return float(self.inputs[0].size)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        return [cumsum(dy, self.dim, self.exclusive, reverse=not self.reverse)]

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        m = ctx.effective_mesh_axis(self.dim.name)
        if m is None:
            return []
        x = self.inputs[0]
        k = self.dim.size // ctx.mesh_shape[m].size
        return [
            CollectiveSpec(
                "allconcat", (ctx.axis_name(m),), ctx.slice_bytes(x.shape, x.dtype) // k
            )
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        axis = x.shape.index(self.dim.name)
        ex, rev = self.exclusive, self.reverse
        laid = lowering.tensors[x]
        res = impl.slicewise(
            lambda s: tf.cumsum(s, axis, exclusive=ex, reverse=rev), laid
        )
        m = impl.ctx.effective_mesh_axis(self.dim.name)
        if m is not None:
            n = impl.shape[m].size
            totals = impl.slicewise(
                lambda s: tf.reduce_sum(s, axis, keepdims=True), laid
            )
            totals = impl.allconcat(totals, m, axis)
            bshape = [1] * len(x.shape)
            bshape[axis] = n

            def add_blocks_before(s: Any, t: Any, c: Any) -> Any:
                j = tf.range(n)
                before = j > c if rev else j < c
                w = tf.reshape(tf.cast(before, s.dtype), bshape)
                return s + tf.reduce_sum(t * w, axis, keepdims=True)

            res = impl.slicewise(
                add_blocks_before, res, totals, impl.laid_out_pcoordinate(m)
            )
        lowering.set_tensor_lowering(self.outputs[0], res)

    def attrs(self) -> dict[str, Any]:
        return {
            "dim": self.dim.name,
            "exclusive": self.exclusive,
            "reverse": self.reverse,
        }


def cumsum(
    x: Tensor,
    dim: Any,
    exclusive: bool = False,
    reverse: bool = False,
    name: str | None = None,
) -> Tensor:
    """Cumulative sum of ``x`` along ``dim`` (``exclusive``: without the current
    element; ``reverse``: from the end)."""
    return Cumsum(
        x, dim_of(x, dim, "cumsum"), bool(exclusive), bool(reverse), name
    ).outputs[0]
