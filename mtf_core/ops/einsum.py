"""Einsum over named dimensions (and matmul).

Lowering: a local ``tf.einsum`` on each device's slices, then a sum over the
mesh axes that split reduced-out dimensions.  That sum is left pending
(:class:`LazyAllreduceSum`) so that sums of einsums reduce once.

An op whose tensors put two different dimension names on one mesh axis cannot
be computed slice by slice (the slices would not line up); such layouts are
rejected with a LayoutError naming the dims and the axis.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext, allreduce_collectives
from mtf_core.errors import GraphTypeError, ShapeError
from mtf_core.graph import (
    Operation,
    Tensor,
    check_same_dtype,
    check_same_mesh,
    check_tensor,
)
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.ops._local import einsum_equation
from mtf_core.ops.onehot_einsum import (
    OneHotEinsumPlan,
    lower_onehot_einsum,
    plan_onehot_einsum,
)
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Shape, convert_to_shape, dimension_name


class Einsum(Operation):
    """``einsum(inputs, output_shape)``: multiply and sum out absent dims."""

    op_type = "Einsum"

    def __init__(
        self, inputs: Sequence[Tensor], output_shape: Any, name: str | None = None
    ) -> None:
        inputs = list(inputs)
        if not inputs:
            raise ShapeError("einsum needs at least one input")
        check_same_mesh(inputs)
        dt = check_same_dtype(inputs, "einsum")
        super().__init__(inputs, name=name or "einsum")
        self._reduced: tuple[str, ...] | None = None
        output_shape = convert_to_shape(output_shape)
        known: dict[str, int] = {}
        for t in inputs:
            for d in t.shape:
                if d.name in known and known[d.name] != d.size:
                    raise ShapeError(
                        f"einsum: dimension {d.name!r} has size {known[d.name]} in one "
                        f"input and {d.size} in {t.name}"
                    )
                known[d.name] = d.size
        for d in output_shape:
            if d.name not in known:
                raise ShapeError(
                    f"einsum: output dimension {d} is in no input "
                    f"(inputs have {sorted(known)}); use broadcast to add dims"
                )
            if known[d.name] != d.size:
                raise ShapeError(
                    f"einsum: output dimension {d} has size {d.size} but the inputs "
                    f"have {d.name}:{known[d.name]}"
                )
        self._add_output(output_shape, dt)

    @property
    def reduced_dims(self) -> list[str]:
        # Cached (the shapes never change): the planner asks many times.
        if self._reduced is None:
            out = set(self._outputs[0].shape.dimension_names)
            seen: list[str] = []
            for t in self._inputs:
                for d in t.shape.dims:
                    if d.name not in out and d.name not in seen:
                        seen.append(d.name)
            self._reduced = tuple(seen)
        return list(self._reduced)

    @functools.cached_property  # shapes never change
    def onehot_plan(self) -> OneHotEinsumPlan | None:
        """How :meth:`lower` computes this einsum as a lookup, when one input
        is a ``one_hot`` (None: a plain ``tf.einsum``).  ``flops`` still counts
        the einsum, so the cost model and the lowering's counters agree."""
        return plan_onehot_einsum(self.inputs, self.outputs[0].shape.dimension_names)

    def flops(self) -> float:
        sizes = {d.name: d.size for t in self.inputs + self.outputs for d in t.shape}
        points = math.prod(sizes.values())
        if len(self.inputs) == 1:
            return float(points)  # a sum: one add per input element
        return float(2 * (len(self.inputs) - 1) * points)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None] * len(self.inputs)
        grads: list[Tensor | None] = []
        for i, t in enumerate(self.inputs):
            others = [dy] + [x for j, x in enumerate(self.inputs) if j != i]
            grads.append(_einsum_or_broadcast(others, t.shape))
        return grads

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        ctx.check_op(self)
        out = self.outputs[0]
        return allreduce_collectives(
            ctx, out.shape, out.dtype, ctx.reduced_axes(self.reduced_dims)
        )

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        out = self.outputs[0]
        impl.ctx.check_op(self)
        plan = self.onehot_plan
        if plan is not None:
            # Same local values as tf.einsum on the slices, without the
            # multiplications by zero (see mtf_core.ops.onehot_einsum).
            res = lower_onehot_einsum(plan, self.inputs, lowering, impl)
        else:
            eq = einsum_equation([t.shape for t in self.inputs], out.shape)
            ins = [lowering.tensors[t] for t in self.inputs]
            res = impl.slicewise(lambda *s: tf.einsum(eq, *s), *ins)
        axes = impl.ctx.reduced_axes(self.reduced_dims)
        if axes:
            res = LazyAllreduceSum(impl, res, axes, self)
        lowering.set_tensor_lowering(out, res)


def _einsum_or_broadcast(inputs: list[Tensor], output_shape: Shape) -> Tensor:
    """Gradient helper: einsum, broadcasting output dims no input has."""
    have = {d.name for t in inputs for d in t.shape}
    missing = [d for d in output_shape if d.name not in have]
    if not missing:
        return einsum(inputs, output_shape=output_shape)
    from mtf_core.ops.reduce import broadcast

    partial = einsum(inputs, output_shape=output_shape - missing)
    return broadcast(partial, output_shape)


def einsum(
    xs: Sequence[Tensor] | Tensor,
    *more: Any,
    output_shape: Any = None,
    reduced_dims: Any = None,
    name: str | None = None,
) -> Tensor:
    """Einstein summation over named dims.

    ``einsum([a, b], output_shape)`` (Mesh TensorFlow) or ``einsum(a, b,
    output_shape=...)``.  Without ``output_shape`` the output keeps every input
    dim except ``reduced_dims`` (names or dims) or, when those are not given
    either, the dims that appear in exactly one input (numpy's implicit mode).
    """
    if isinstance(xs, Tensor):
        xs = [xs]
    elif not isinstance(xs, Iterable):
        raise GraphTypeError(f"einsum: xs is {xs!r}; expected a list of mtf.Tensors")
    xs = list(xs)
    rest = list(more)
    while rest and isinstance(rest[0], Tensor):
        xs.append(rest.pop(0))
    xs = [check_tensor(x, "einsum: input") for x in xs]
    if rest:
        if output_shape is not None:
            raise ShapeError("einsum: output_shape given twice")
        output_shape = rest.pop(0)
    if output_shape is None:
        counts: dict[str, int] = {}
        dims = {}
        for t in xs:
            for d in t.shape:
                counts[d.name] = counts.get(d.name, 0) + 1
                dims[d.name] = d
        if reduced_dims is None:
            drop = {n for n in dims if counts[n] > 1}
        else:  # Mesh TensorFlow: every input dim except reduced_dims
            drop = {dimension_name(d) for d in reduced_dims}
        output_shape = Shape([dims[n] for n in dims if n not in drop])
    return Einsum(xs, output_shape, name=name).outputs[0]


def matmul(
    a: Tensor,
    b: Tensor,
    output_shape: Any = None,
    reduced_dims: Any = None,
    name: str | None = None,
) -> Tensor:
    return einsum(
        [a, b], output_shape=output_shape, reduced_dims=reduced_dims, name=name
    )
