"""Reductions (sum, max, min, any, all and the composites mean, logsumexp,
softmax, log_softmax) and ``broadcast``.

Lowering: a local reduction of each slice, then an allreduce over the mesh axes
that split reduced dims (sum: pending, so that sums fuse; max/min: at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext, allreduce_collectives
from mtf_core.errors import ArgumentError, ShapeError
from mtf_core.graph import Operation, Tensor, check_tensor
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.ops import elementwise as ew
from mtf_core.ops._local import align, maybe_transpose
from mtf_core.ops.arguments import dim_of
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape, convert_to_shape

#: Reductions :class:`Reduce` knows, with the ``tf.math`` function of each.
REDUCTIONS = {
    "SUM": "reduce_sum",
    "MAX": "reduce_max",
    "MIN": "reduce_min",
    "LOGICAL_OR": "reduce_any",
    "LOGICAL_AND": "reduce_all",
}


class Reduce(Operation):
    """Reduces ``x`` to ``output_shape`` (a subset of its dims, any order)."""

    op_type = "Reduce"

    def __init__(
        self,
        x: Tensor,
        output_shape: Shape,
        reduction: str = "SUM",
        name: str | None = None,
    ) -> None:
        if reduction not in REDUCTIONS:
            raise ArgumentError(
                f"unknown reduction {reduction!r}; expected one of {sorted(REDUCTIONS)}"
            )
        for d in output_shape:
            if d not in x.shape.dims:
                raise ShapeError(
                    f"reduce: output dimension {d} is not a dimension of {x.name} [{x.shape}]"
                )
        super().__init__([x], name=name or f"reduce_{reduction.lower()}")
        self.reduction = reduction
        self._add_output(output_shape, x.dtype)

    @property
    def reduced_dims(self) -> list[Dimension]:
        return [d for d in self.inputs[0].shape if d not in self.outputs[0].shape.dims]

    def flops(self) -> float:
        return float(self.inputs[0].size)

    @property
    def has_gradient(self) -> bool:
        return self.reduction in ("SUM", "MAX", "MIN")

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None or not self.has_gradient:
            return [None]
        x = self.inputs[0]
        g = broadcast(dy, x.shape)
        if self.reduction == "SUM":
            return [g]
        hit = ew.cast(ew.equal(x, broadcast(self.outputs[0], x.shape)), x.dtype)
        return [g * hit]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        out = self.outputs[0]
        in_names = x.shape.dimension_names
        red_axes = [in_names.index(d.name) for d in self.reduced_dims]
        kept = [n for n in in_names if n in out.shape.dimension_names]
        perm = [kept.index(n) for n in out.shape.dimension_names]
        fn = getattr(tf.math, REDUCTIONS[self.reduction])

        def local(s: Any) -> Any:
            return maybe_transpose(tf, fn(s, axis=red_axes) if red_axes else s, perm)

        res = impl.slicewise(local, lowering.tensors[x])
        axes = impl.ctx.reduced_axes([d.name for d in self.reduced_dims])
        if axes:
            if self.reduction == "SUM":
                res = LazyAllreduceSum(impl, res, axes, self)
            else:
                res = impl.allreduce(res, axes, self.reduction)
        lowering.set_tensor_lowering(out, res)

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        out = self.outputs[0]
        return allreduce_collectives(
            ctx,
            out.shape,
            out.dtype,
            ctx.reduced_axes([d.name for d in self.reduced_dims]),
            pending=self.reduction == "SUM",
            reduction=self.reduction,
        )

    def attrs(self) -> dict[str, Any]:
        return {"reduction": self.reduction}


def _output_shape(x: Tensor, output_shape: Any, reduced_dim: Any) -> Shape:
    check_tensor(x, "reduce:")
    if output_shape is not None and reduced_dim is not None:
        raise ShapeError("give output_shape or reduced_dim, not both")
    if output_shape is not None:
        return convert_to_shape(output_shape)
    if reduced_dim is None:
        return Shape([])
    dims = (
        reduced_dim
        if isinstance(reduced_dim, (list, tuple, Shape))
        and not (
            isinstance(reduced_dim, tuple)
            and len(reduced_dim) == 2
            and isinstance(reduced_dim[1], int)
        )
        else [reduced_dim]
    )
    # A dim of the tensor's name but another size is a mistake, not a
    # dim to skip (Mesh TF's ``shape - dim`` refuses it too).
    names = {dim_of(x, d, "reduce").name for d in dims}
    return Shape([d for d in x.shape if d.name not in names])


def _reduce(
    reduction: str, x: Tensor, output_shape: Any, reduced_dim: Any, name: str | None
) -> Tensor:
    shape = _output_shape(x, output_shape, reduced_dim)
    if shape == x.shape:
        return x
    if set(shape.dimension_names) == set(x.shape.dimension_names):
        return transpose(x, shape)
    return Reduce(x, shape, reduction, name).outputs[0]


def reduce_sum(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    return _reduce("SUM", x, output_shape, reduced_dim, name)


def reduce_max(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    return _reduce("MAX", x, output_shape, reduced_dim, name)


def reduce_min(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    return _reduce("MIN", x, output_shape, reduced_dim, name)


def reduce_any(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    return _reduce("LOGICAL_OR", x, output_shape, reduced_dim, name)


def reduce_all(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    return _reduce("LOGICAL_AND", x, output_shape, reduced_dim, name)


def reduce_mean(
    x: Tensor,
    output_shape: Any = None,
    reduced_dim: Any = None,
    name: str | None = None,
) -> Tensor:
    shape = _output_shape(x, output_shape, reduced_dim)
    count = x.shape.size // max(shape.size, 1)
    return reduce_sum(x, output_shape=shape, name=name) * (1.0 / count)


def reduce_logsumexp(
    x: Tensor,
    reduced_dim: Any = None,
    output_shape: Any = None,
    extra_logit: Any = None,
) -> Tensor:
    """``log(sum(exp(x)))`` over the reduced dims; ``extra_logit`` (a number,
    or a tensor of the output's dims) joins the sum as one more logit, as in
    Mesh TensorFlow (an implicit "none of these" entry)."""
    shape = _output_shape(x, output_shape, reduced_dim)
    m = ew.stop_gradient(reduce_max(x, output_shape=shape))
    if extra_logit is not None:
        extra_logit = _extra_logit(extra_logit, shape)
        m = ew.maximum(m, extra_logit)
    total = reduce_sum(ew.exp(x - m), output_shape=shape)
    if extra_logit is not None:
        total = total + ew.exp(extra_logit - m)
    return ew.log(total) + m


def softmax(x: Tensor, reduced_dim: Any, extra_logit: Any = None) -> Tensor:
    """Softmax over ``reduced_dim``; with ``extra_logit``, the normalizer also
    counts ``exp(extra_logit)``, so the outputs sum to less than one."""
    if extra_logit is not None:
        return ew.exp(log_softmax(x, reduced_dim, extra_logit))
    shape = _output_shape(x, None, reduced_dim)
    m = ew.stop_gradient(reduce_max(x, output_shape=shape))
    e = ew.exp(x - m)
    return e / reduce_sum(e, output_shape=shape)


def log_softmax(x: Tensor, reduced_dim: Any, extra_logit: Any = None) -> Tensor:
    return x - reduce_logsumexp(x, reduced_dim, extra_logit=extra_logit)


def _extra_logit(v: Any, shape: Shape) -> Any:
    """``extra_logit`` with its gradient stopped (as in Mesh TensorFlow): a
    tensor of the output's dims, or a number."""
    if isinstance(v, Tensor):
        if not set(v.shape.dimension_names) <= set(shape.dimension_names):
            raise ShapeError(
                f"extra_logit {v.name} [{v.shape}] has dims the output [{shape}] "
                "does not; expected a subset of its dims"
            )
        return ew.stop_gradient(v)
    try:
        if isinstance(v, bool | str | bytes):
            raise TypeError
        return float(v)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"extra_logit {v!r}: expected a number or an mtf.Tensor"
        ) from None


class Broadcast(Operation):
    """Broadcasts ``x`` to ``output_shape`` (a superset of its dims)."""

    op_type = "Broadcast"

    def __init__(self, x: Tensor, output_shape: Shape, name: str | None = None) -> None:
        for d in x.shape:
            if d not in output_shape.dims:
                raise ShapeError(
                    f"broadcast: {x.name} dimension {d} is missing from [{output_shape}]"
                )
        super().__init__([x], name=name or "broadcast")
        self._add_output(output_shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        return [
            None if dy is None else reduce_sum(dy, output_shape=self.inputs[0].shape)
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x, out = self.inputs[0], self.outputs[0]
        local_shape = impl.slice_shape(out.shape)
        res = impl.slicewise(
            lambda s: tf.broadcast_to(align(tf, s, x.shape, out.shape), local_shape),
            lowering.tensors[x],
        )
        lowering.set_tensor_lowering(out, res)


def broadcast(x: Tensor, new_shape: Any) -> Tensor:
    check_tensor(x, "broadcast:")
    new_shape = convert_to_shape(new_shape)
    if new_shape == x.shape:
        return x
    return Broadcast(x, new_shape).outputs[0]


def transpose(x: Tensor, new_shape: Any) -> Tensor:
    """Reorders dims (a broadcast to the same dims in another order)."""
    check_tensor(x, "transpose:")
    new_shape = convert_to_shape(new_shape)
    if set(new_shape.dimension_names) != set(x.shape.dimension_names):
        raise ShapeError(
            f"transpose: [{new_shape}] must have exactly the dims of [{x.shape}]"
        )
    return Broadcast(x, new_shape, name="transpose").outputs[0]
