"""``top_k`` and ``argmax`` along one dimension.

When the dimension is split over mesh axis ``m`` (``n`` devices, ``k``
wanted), each device takes its local top k (values and global indices), the
``n * k`` candidates are allconcatenated over ``m`` and the top k of those is
the answer.  Ties resolve to the lowest index, as on one device.  A device
holding fewer than k positions gathers the dimension whole first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import ShapeError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops._local import maybe_transpose
from mtf_core.ops.arguments import dim_of, sized_dim
from mtf_core.ops.einsum import einsum
from mtf_core.ops.one_hot import one_hot
from mtf_core.ops.reshape import gather_collectives, lower_gathered, lower_resplit
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape


class TopK(Operation):
    """``top_k(x, reduced_dim, k_dim)``: the ``k`` largest values along
    ``reduced_dim`` (descending) and their indices (int32).

    The outputs have ``x``'s other dims, then ``k_dim`` (Mesh TensorFlow's
    order); with ``k_dim=None`` (``argmax``) k is 1 and the dimension is
    dropped.
    """

    op_type = "TopK"

    def __init__(
        self,
        x: Tensor,
        reduced_dim: Dimension,
        k_dim: Dimension | None,
        name: str | None = None,
    ) -> None:
        if k_dim is not None:
            if k_dim.name in x.shape.dimension_names:
                raise ShapeError(
                    f"top_k: k_dim {k_dim} is already a dimension of {x.name} "
                    f"[{x.shape}]; give it a new name"
                )
            if k_dim.size > reduced_dim.size:
                raise ShapeError(
                    f"top_k: k_dim {k_dim} is larger than reduced_dim {reduced_dim}"
                )
        super().__init__([x], name=name or ("top_k" if k_dim else "argmax"))
        self.reduced_dim = reduced_dim
        self.k_dim = k_dim
        # Mesh TensorFlow's order: the other dims, then k_dim at the end.
        dims = [d for d in x.shape.dims if d.name != reduced_dim.name]
        if k_dim is not None:
            dims.append(k_dim)
        self._add_output(Shape(dims), x.dtype)
        self._add_output(Shape(dims), "int32")

    @property
    def k(self) -> int:
        return 1 if self.k_dim is None else self.k_dim.size

    def flops(self) -> float:
        return float(self.inputs[0].size)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dv = grad_ys[0]
        if dv is None:
            return [None]
        x = self.inputs[0]
        hot = one_hot(self.outputs[1], self.reduced_dim, dtype=dv.dtype)
        return [einsum([hot, dv], output_shape=x.shape)]

    def _plan(self, ctx: Any) -> tuple[int | None, bool]:
        """(mesh axis splitting reduced_dim, whether to gather it whole first:
        when a device holds fewer than k candidates)."""
        m = ctx.effective_mesh_axis(self.reduced_dim.name)
        if m is None:
            return None, False
        return m, self.reduced_dim.size // ctx.mesh_shape[m].size < self.k

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        m, whole = self._plan(ctx)
        x = self.inputs[0]
        if m is None:
            return []
        if whole:
            return gather_collectives(ctx, x, [self.reduced_dim.name])
        per_pos = ctx.slice_size(x.shape) // (
            self.reduced_dim.size // ctx.mesh_shape[m].size
        )
        axis = (ctx.axis_name(m),)
        return [
            CollectiveSpec(
                "allconcat", axis, per_pos * self.k * dtypes.size_bytes(x.dtype)
            ),
            CollectiveSpec("allconcat", axis, per_pos * self.k * 4),
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        names = x.shape.dimension_names
        r = names.index(self.reduced_dim.name)
        to_last = [i for i in range(len(names)) if i != r] + [r]
        k = self.k
        m, whole = self._plan(impl.ctx)
        laid = lowering.tensors[x]
        if whole:
            laid = lower_gathered(impl, laid, x.shape, [self.reduced_dim.name])
        kl = (
            self.reduced_dim.size
            if whole or m is None
            else (self.reduced_dim.size // impl.shape[m].size)
        )

        def local(s: Any, c: Any) -> tuple[Any, Any]:
            v, i = tf.math.top_k(maybe_transpose(tf, s, to_last), k)
            return v, i + c * kl

        coord = 0 if m is None or whole else impl.laid_out_pcoordinate(m)
        vals, idx = impl.slicewise_multi(local, 2, laid, coord)
        if m is not None and not whole:
            # n*k candidates, in device order; top_k is stable, so ties still
            # resolve to the lowest index.
            last = len(names) - 1
            vals = impl.allconcat(vals, m, last)
            idx = impl.allconcat(idx, m, last)

            def merge(v: Any, i: Any) -> tuple[Any, Any]:
                v2, pos = tf.math.top_k(v, k)
                return v2, tf.gather(i, pos, batch_dims=last)

            vals, idx = impl.slicewise_multi(merge, 2, vals, idx)
        kname = [] if self.k_dim is None else [self.k_dim.name]
        for t, v in zip(self.outputs, (vals, idx)):
            if self.k_dim is None:
                v = impl.slicewise(lambda s: tf.squeeze(s, -1), v)
            # else the local order (other dims, then k) is the output's
            lowering.set_tensor_lowering(t, lower_resplit(impl, v, t.shape, kname))

    def attrs(self) -> dict[str, Any]:
        return {
            "reduced_dim": str(self.reduced_dim),
            "k_dim": None if self.k_dim is None else str(self.k_dim),
        }


def top_k(
    x: Tensor, reduced_dim: Any, k_dim: Any, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """The ``k_dim.size`` largest values of ``x`` along ``reduced_dim`` and their
    int32 indices; both have ``x``'s other dims, then ``k_dim``."""
    op = TopK(x, dim_of(x, reduced_dim, "top_k"), sized_dim(k_dim, "top_k"), name)
    return op.outputs[0], op.outputs[1]


def argmax(x: Tensor, reduced_dim: Any, name: str | None = None) -> Tensor:
    """int32 index of the largest value along ``reduced_dim`` (the first one on
    ties), with ``reduced_dim`` dropped."""
    return TopK(x, dim_of(x, reduced_dim, "argmax"), None, name).outputs[1]
