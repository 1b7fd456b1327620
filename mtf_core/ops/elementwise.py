"""Elementwise ops: binary ops with named-dim broadcasting, ``where``,
``add_n``, ``cast`` and ``stop_gradient``; the unary math and activations live
in :mod:`mtf_core.ops.unary` and are re-exported here.

Broadcasting is by name: the output has the union of the inputs' dims (first
input's order, then new dims of the others), or an explicit ``output_shape``.
None of these ops communicate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, DTypeError, GraphTypeError, ShapeError
from mtf_core.graph import (
    Operation,
    Tensor,
    check_same_dtype,
    check_same_mesh,
    check_same_shape,
    check_tensor,
)
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.ops._local import align, tf_function
from mtf_core.ops.creation import constant, zeros_like

# Re-exported: the unary ops were defined here first.
from mtf_core.ops.unary import UNARY as UNARY
from mtf_core.ops.unary import GradFn as GradFn
from mtf_core.ops.unary import UnaryOp as UnaryOp
from mtf_core.ops.unary import abs as abs
from mtf_core.ops.unary import ceil as ceil
from mtf_core.ops.unary import cos as cos
from mtf_core.ops.unary import elu as elu
from mtf_core.ops.unary import exp as exp
from mtf_core.ops.unary import floor as floor
from mtf_core.ops.unary import gelu as gelu
from mtf_core.ops.unary import is_finite as is_finite
from mtf_core.ops.unary import log as log
from mtf_core.ops.unary import logical_not as logical_not
from mtf_core.ops.unary import negative as negative
from mtf_core.ops.unary import reciprocal as reciprocal
from mtf_core.ops.unary import relu as relu
from mtf_core.ops.unary import round as round
from mtf_core.ops.unary import rsqrt as rsqrt
from mtf_core.ops.unary import sigmoid as sigmoid
from mtf_core.ops.unary import sign as sign
from mtf_core.ops.unary import silu as silu
from mtf_core.ops.unary import sin as sin
from mtf_core.ops.unary import softplus as softplus
from mtf_core.ops.unary import sqrt as sqrt
from mtf_core.ops.unary import square as square
from mtf_core.ops.unary import swish as swish
from mtf_core.ops.unary import tanh as tanh
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Shape, convert_to_shape


def leaky_relu(x: Tensor, alpha: float = 0.2) -> Tensor:
    return maximum(x, x * alpha)


# --------------------------------------------------------------------------
# binary with named broadcasting
# --------------------------------------------------------------------------

BINARY: dict[str, str] = {
    "add": "math.add",
    "sub": "math.subtract",
    "multiply": "math.multiply",
    "divide": "math.divide",
    "minimum": "math.minimum",
    "maximum": "math.maximum",
    "pow": "math.pow",
    "less": "math.less",
    "less_equal": "math.less_equal",
    "greater": "math.greater",
    "greater_equal": "math.greater_equal",
    "equal": "math.equal",
    "not_equal": "math.not_equal",
    "logical_and": "math.logical_and",
    "logical_or": "math.logical_or",
    "floordiv": "math.floordiv",
    "mod": "math.floormod",
}
COMPARISONS = frozenset(
    {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal"}
)
DIFFERENTIABLE_BINARY = frozenset(
    {"add", "sub", "multiply", "divide", "minimum", "maximum", "pow"}
)


def broadcast_shape(shapes: Sequence[Shape]) -> Shape:
    """The output shape of an elementwise op on ``shapes``, by Mesh TF's rule
    (its ``_infer_binary_broadcast_shape``), folded left: of two shapes, the
    one whose dims hold the other's in the same order (``[a, b]`` for ``[b]``
    and ``[a, b]``, whichever comes first), else the first's dims and then
    the second's new ones.  A name's sizes must agree."""
    if len(shapes) == 2:  # most calls: two equal shapes, or one a scalar's
        a, b = shapes
        if not b.dims or a == b:
            return a
        if not a.dims:
            return b
    out = shapes[0]
    for s in shapes[1:]:
        out = _broadcast_two(out, s)
    return out


def _broadcast_two(a: Shape, b: Shape) -> Shape:
    sizes = {d.name: d.size for d in a.dims}
    for d in b.dims:
        size = sizes.get(d.name)
        if size is not None and size != d.size:
            raise ShapeError(
                f"dimension {d.name!r} has size {size} in one input "
                f"and {d.size} in another"
            )
    if _is_subsequence(a.dims, b.dims):
        return b
    if _is_subsequence(b.dims, a.dims):
        return a
    return Shape([*a.dims, *(d for d in b.dims if d.name not in sizes)])


def _is_subsequence(short: Sequence[Any], long: Sequence[Any]) -> bool:
    """Whether ``short``'s items appear in ``long`` in the same order."""
    rest = iter(long)
    return all(any(x == y for y in rest) for x in short)


def _broadcast(fn_name: str, tensors: Sequence[Tensor]) -> Shape:
    """:func:`broadcast_shape` of ``tensors``' shapes, its error naming them."""
    try:
        return broadcast_shape([t.shape for t in tensors])
    except ShapeError as e:
        named = " and ".join(f"{t.name} [{t.shape}]" for t in tensors)
        raise ShapeError(f"{fn_name}: {named}: {e}") from None


def _as_tensor(x: Any, like: Tensor) -> Tensor:
    if isinstance(x, Tensor):
        return x
    # Converting 0.5 to an int32 tensor's dtype would silently make it 0.
    if like.dtype in dtypes.INTEGER and isinstance(x, float) and not x.is_integer():
        raise DTypeError(
            f"scalar {x!r} cannot combine with {like.name} of dtype {like.dtype}; "
            "cast the tensor to a floating dtype first"
        )

    return constant(like.mesh, x, (), like.dtype)


class BinaryOp(Operation):
    """``z = f(x, y)`` with named-dimension broadcasting."""

    op_type = "Binary"

    def __init__(
        self,
        fn_name: str,
        x: Tensor,
        y: Tensor,
        output_shape: Any = None,
        name: str | None = None,
    ) -> None:
        if fn_name not in BINARY:
            raise ArgumentError(
                f"unknown binary op {fn_name!r}; expected one of {sorted(BINARY)}"
            )
        check_same_mesh([x, y])
        check_same_dtype([x, y], fn_name)
        if fn_name == "divide" and x.dtype not in dtypes.FLOATING:
            # TensorFlow's divide of integers is a float64 the op's dtype
            # would not say.
            raise DTypeError(
                f"divide: {x.name} and {y.name} have dtype {x.dtype}; expected a "
                "floating dtype (use floordiv for whole-number division, or cast "
                "to float32 first)"
            )
        shape = _broadcast(fn_name, [x, y])
        super().__init__([x, y], name=name or fn_name)
        self.fn_name = fn_name
        if output_shape is not None:
            output_shape = convert_to_shape(output_shape)
            if set(output_shape.dimension_names) != set(shape.dimension_names):
                raise ShapeError(
                    f"{fn_name}: output_shape [{output_shape}] must have exactly the "
                    f"inputs' dims [{shape}]"
                )
            shape = output_shape
        out_dtype = "bool" if fn_name in COMPARISONS else x.dtype
        self._add_output(shape, out_dtype)

    @property
    def has_gradient(self) -> bool:
        return self.fn_name in DIFFERENTIABLE_BINARY

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        from mtf_core.ops.reduce import reduce_sum

        dz = grad_ys[0]
        if dz is None or not self.has_gradient:
            return [None, None]
        x, y = self.inputs
        z = self.outputs[0]
        f = self.fn_name
        if f == "add":
            gx, gy = dz, dz
        elif f == "sub":
            gx, gy = dz, negative(dz)
        elif f == "multiply":
            gx, gy = dz * y, dz * x
        elif f == "divide":
            gx, gy = dz / y, negative(dz * z / y)
        elif f == "pow":
            gx = dz * y * pow(x, y - 1.0)
            gy = dz * z * log(maximum(x, 1e-30))
        else:  # minimum / maximum: the gradient goes to the selected input
            pick_x = greater_equal(x, y) if f == "maximum" else less_equal(x, y)
            mask = cast(pick_x, dz.dtype)
            gx, gy = dz * mask, dz * (1.0 - mask)
        return [
            reduce_sum(gx, output_shape=x.shape),
            reduce_sum(gy, output_shape=y.shape),
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        fn = tf_function(tf, BINARY[self.fn_name])
        x, y = self.inputs
        out = self.outputs[0]
        impl = lowering.mesh_impl(self)
        if self.fn_name == "add" and _lower_pending_sum(lowering, self, fn):
            return
        lx, ly = lowering.tensors[x], lowering.tensors[y]
        xs, ys, zs = x.shape, y.shape, out.shape
        res = impl.slicewise(
            lambda a, b: fn(align(tf, a, xs, zs), align(tf, b, ys, zs)),
            lx,
            ly,
        )
        lowering.set_tensor_lowering(out, res)

    def attrs(self) -> dict[str, Any]:
        return {"fn": self.fn_name}


def _lower_pending_sum(
    lowering: Any, op: Operation, local_sum: Callable[..., Any]
) -> bool:
    """Lowers ``op`` (a sum of its inputs) as a pending allreduce when every
    input is still pending over the same mesh axes, with the op's shape:
    ``local_sum`` adds the unreduced slices, and the sum is reduced once, when
    something needs it.  False (nothing lowered) otherwise."""
    out = op.outputs[0]
    raws = [lowering.raw_tensor(t) for t in op.inputs]
    if not (
        all(isinstance(r, LazyAllreduceSum) and r.is_pending for r in raws)
        and len({r.mesh_axes for r in raws}) == 1
        and all(t.shape == out.shape for t in op.inputs)
    ):
        return False
    impl = lowering.mesh_impl(op)
    summed = impl.slicewise(local_sum, *[r.laid_out for r in raws])
    lowering.set_tensor_lowering(
        out, LazyAllreduceSum(impl, summed, raws[0].mesh_axes, raws[0].op)
    )
    return True


def _binary(fn_name: str) -> Callable[..., Tensor]:
    def op(x: Any, y: Any, output_shape: Any = None, name: str | None = None) -> Tensor:
        if not isinstance(x, Tensor) and not isinstance(y, Tensor):
            raise ShapeError(
                f"{fn_name} needs at least one mtf.Tensor, got {x!r} and {y!r}"
            )
        if not isinstance(x, Tensor):
            x = _as_tensor(x, y)
        if not isinstance(y, Tensor):
            y = _as_tensor(y, x)
        return BinaryOp(fn_name, x, y, output_shape=output_shape, name=name).outputs[0]

    op.__name__ = fn_name
    op.__doc__ = f"Elementwise {fn_name} with named-dimension broadcasting."
    return op


add = _binary("add")
sub = _binary("sub")
subtract = sub
multiply = _binary("multiply")
divide = _binary("divide")
minimum = _binary("minimum")
maximum = _binary("maximum")
pow = _binary("pow")  # noqa: A001
less = _binary("less")
less_equal = _binary("less_equal")
greater = _binary("greater")
greater_equal = _binary("greater_equal")
equal = _binary("equal")
not_equal = _binary("not_equal")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")
floordiv = _binary("floordiv")
mod = _binary("mod")


# --------------------------------------------------------------------------
# where, add_n, cast, stop_gradient
# --------------------------------------------------------------------------


class WhereOp(Operation):
    """``where(cond, x, y)`` with named broadcasting of all three."""

    op_type = "Where"

    def __init__(
        self,
        cond: Tensor,
        x: Tensor,
        y: Tensor,
        output_shape: Any = None,
        name: str | None = None,
    ) -> None:
        check_same_mesh([cond, x, y])
        if cond.dtype != "bool":
            raise DTypeError(
                f"where: condition {cond.name} has dtype {cond.dtype}; expected bool"
            )
        check_same_dtype([x, y], "where")
        # Mesh TF's where is x * cond + y * !cond: its shape, so.
        shape = broadcast_shape(
            [_broadcast("where", [x, cond]), _broadcast("where", [y, cond])]
        )
        super().__init__([cond, x, y], name=name or "where")
        if output_shape is not None:
            shape = convert_to_shape(output_shape)
        self._add_output(shape, x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        from mtf_core.ops.reduce import reduce_sum

        dz = grad_ys[0]
        if dz is None:
            return [None, None, None]
        cond, x, y = self.inputs
        zero = zeros_like(dz)
        return [
            None,
            reduce_sum(where(cond, dz, zero), output_shape=x.shape),
            reduce_sum(where(cond, zero, dz), output_shape=y.shape),
        ]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        c, x, y = self.inputs
        zs = self.outputs[0].shape
        impl = lowering.mesh_impl(self)

        def fn(a: Any, b: Any, d: Any) -> Any:
            a, b, d = (
                align(tf, a, c.shape, zs),
                align(tf, b, x.shape, zs),
                align(tf, d, y.shape, zs),
            )
            target = tf.broadcast_dynamic_shape(
                tf.broadcast_dynamic_shape(tf.shape(a), tf.shape(b)), tf.shape(d)
            )
            return tf.where(
                tf.broadcast_to(a, target),
                tf.broadcast_to(b, target),
                tf.broadcast_to(d, target),
            )

        res = impl.slicewise(
            fn, lowering.tensors[c], lowering.tensors[x], lowering.tensors[y]
        )
        lowering.set_tensor_lowering(self.outputs[0], res)


def where(condition: Tensor, x: Any, y: Any, output_shape: Any = None) -> Tensor:
    if not isinstance(x, Tensor):
        x = _as_tensor(x, y)
    if not isinstance(y, Tensor):
        y = _as_tensor(y, x)
    return WhereOp(condition, x, y, output_shape).outputs[0]


class AddN(Operation):
    """Sum of tensors of one shape; pending allreduces over the same axes are
    summed before one reduction."""

    op_type = "AddN"

    def __init__(self, xs: Sequence[Tensor], name: str | None = None) -> None:
        xs = list(xs)
        check_same_mesh(xs)
        dtype = check_same_dtype(xs, "add_n")
        shape = check_same_shape(xs, "add_n")
        super().__init__(xs, name=name or "add_n")
        self._add_output(shape, dtype)

    def flops(self) -> float:
        return float(self.outputs[0].size * max(len(self.inputs) - 1, 1))

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [grad_ys[0]] * len(self.inputs)

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf

        def local_sum(*s: Any) -> Any:
            return tf.add_n(list(s))

        if _lower_pending_sum(lowering, self, local_sum):
            return
        ins = [lowering.tensors[t] for t in self.inputs]
        res = lowering.mesh_impl(self).slicewise(local_sum, *ins)
        lowering.set_tensor_lowering(self.outputs[0], res)


def add_n(xs: Sequence[Tensor]) -> Any:
    """The sum of ``xs``, broadcast by dim names as ``add`` does; the sum of
    no tensors is the number 0 (as in Mesh TF, where programs write
    ``loss += mtf.add_n(extra_losses)``)."""
    if isinstance(xs, Tensor) or not isinstance(xs, Iterable):
        raise GraphTypeError(f"add_n: xs is {xs!r}; expected a list of mtf.Tensors")
    xs = list(xs)
    if not xs:
        return 0
    if len(xs) == 1:
        return xs[0]
    tensors = [x for x in xs if isinstance(x, Tensor)]
    if len(tensors) == len(xs) and all(x.shape == xs[0].shape for x in xs):
        return AddN(xs).outputs[0]
    total = xs[0]
    for x in xs[1:]:
        total = add(total, x)
    return total


class CastOp(Operation):
    op_type = "Cast"

    def __init__(self, x: Tensor, dtype: Any, name: str | None = None) -> None:
        super().__init__([x], name=name or "cast")
        self._add_output(x.shape, dtypes.as_dtype_name(dtype))

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        x = self.inputs[0]
        if dy is None or not dtypes.is_floating(x.dtype):
            return [None]
        return [cast(dy, x.dtype)]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        dt = self.outputs[0].dtype
        res = lowering.mesh_impl(self).slicewise(
            lambda s: tf.cast(s, dt), lowering.tensors[self.inputs[0]]
        )
        lowering.set_tensor_lowering(self.outputs[0], res)

    def attrs(self) -> dict[str, Any]:
        return {"dtype": self.outputs[0].dtype}


def cast(x: Tensor, dtype: Any, name: str | None = None) -> Tensor:
    check_tensor(x, "cast:")
    if dtypes.as_dtype_name(dtype) == x.dtype:
        return x
    return CastOp(x, dtype, name).outputs[0]


def to_float(x: Tensor, name: str = "to_float") -> Tensor:
    """``cast(x, float32)``."""
    return cast(x, "float32", name)


def to_bfloat16(x: Tensor, name: str = "to_bfloat16") -> Tensor:
    """``cast(x, bfloat16)``."""
    return cast(x, "bfloat16", name)


def to_int32(x: Tensor, name: str = "to_int32") -> Tensor:
    """``cast(x, int32)``."""
    return cast(x, "int32", name)


class Identity(Operation):
    """Passes its input through; ``stop_gradient`` blocks the gradient."""

    op_type = "Identity"

    def __init__(self, x: Tensor, stop: bool = False, name: str | None = None) -> None:
        super().__init__([x], name=name or ("stop_gradient" if stop else "identity"))
        self.stop = stop
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    @property
    def has_gradient(self) -> bool:
        return not self.stop

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [None] if self.stop else [grad_ys[0]]

    def lower(self, lowering: LoweringContext) -> None:
        lowering.set_tensor_lowering(
            self.outputs[0], lowering.raw_tensor(self.inputs[0])
        )

    def attrs(self) -> dict[str, Any]:
        return {"stop": self.stop}


def identity(x: Tensor, name: str | None = None) -> Tensor:
    return Identity(x, name=name).outputs[0]


def stop_gradient(x: Tensor) -> Tensor:
    return Identity(x, stop=True).outputs[0]
