"""``mtf.slicewise``: a TensorFlow function applied to each device's slices.

Mesh TensorFlow's escape hatch: ``slicewise(tf_fn, xs, output_shape, ...)``
runs ``tf_fn`` on every device's slices of ``xs`` and gives one slice of each
output.  Only the dims in ``splittable_dims`` may be split (``None``: all), so
``tf_fn`` sees whole dims where it needs them.  The gradient is
``grad_function(op, dy)`` if given, else TensorFlow's gradient of ``tf_fn``
taken slice by slice (:class:`GenericGradOperation`).  No collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtf_core.graph import Operation, Tensor
from mtf_core.seams import LoweringContext, MeshBackend
from mtf_core.shapes import DimensionLike, ShapeLike, convert_to_shape, dimension_name


def _multi(
    impl: MeshBackend, fn: Callable[..., Any], n_out: int, inputs: list[Any]
) -> list[Any]:
    if n_out == 1:
        return [impl.slicewise(fn, *inputs)]
    return list(impl.slicewise_multi(lambda *a: tuple(fn(*a)), n_out, *inputs))


class SlicewiseOperation(Operation):
    """``tf_fn`` applied to each device's slices of ``inputs``."""

    op_type = "Slicewise"

    def __init__(
        self,
        tf_fn: Callable[..., Any],
        inputs: Sequence[Tensor],
        output_shapes: Sequence[ShapeLike],
        output_dtypes: Sequence[Any],
        splittable_dims: Sequence[DimensionLike] | None = None,
        grad_function: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(list(inputs), name=name or "slicewise")
        self.tf_fn = tf_fn
        self.grad_function = grad_function
        for shape, dtype in zip(output_shapes, output_dtypes):
            self._add_output(convert_to_shape(shape), dtype)
        if splittable_dims is not None:
            keep = {dimension_name(d) for d in splittable_dims}
            self._unsplittable = frozenset(self.all_dim_names - keep)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        if self.grad_function is not None:
            return list(self.grad_function(self, *grad_ys))
        return list(GenericGradOperation(self, grad_ys).outputs)

    def lower(self, lowering: LoweringContext) -> None:
        impl = lowering.mesh_impl(self)
        laid = [lowering.tensors[x] for x in self.inputs]
        outs = _multi(impl, self.tf_fn, len(self.outputs), laid)
        for t, v in zip(self.outputs, outs):
            lowering.set_tensor_lowering(t, v)


class GenericGradOperation(Operation):
    """The gradients of ``forward_op``'s inputs, from TensorFlow's gradient of
    its ``tf_fn`` on each device's slices."""

    op_type = "GenericGrad"

    def __init__(
        self,
        forward_op: SlicewiseOperation,
        grad_ys: Sequence[Tensor | None],
        name: str | None = None,
    ) -> None:
        self.forward_op = forward_op
        self._has_dy = [g is not None for g in grad_ys]
        given = [g for g in grad_ys if g is not None]
        super().__init__(
            list(forward_op.inputs) + given,
            mesh=forward_op.mesh,
            name=name or f"{forward_op.name}_grad",
        )
        for x in forward_op.inputs:
            self._add_output(x.shape, x.dtype)

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        n_x = len(self.forward_op.inputs)
        fn, has_dy = self.forward_op.tf_fn, self._has_dy

        def grads(*args: Any) -> tuple[Any, ...]:
            xs, given = list(args[:n_x]), list(args[n_x:])
            with tf.GradientTape() as tape:
                for x in xs:
                    tape.watch(x)
                ys = fn(*xs)
            ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
            dys = [given.pop(0) if h else tf.zeros_like(y) for y, h in zip(ys, has_dy)]
            out = tape.gradient(ys, xs, output_gradients=dys)
            return tuple(
                g if g is not None else tf.zeros_like(x) for g, x in zip(out, xs)
            )

        impl = lowering.mesh_impl(self)
        laid = [lowering.tensors[x] for x in self.inputs]
        outs = impl.slicewise_multi(grads, n_x, *laid)
        for t, v in zip(self.outputs, outs):
            lowering.set_tensor_lowering(t, v)


def slicewise(
    tf_fn: Callable[..., Any],
    xs: Sequence[Tensor],
    output_shape: Any = None,
    output_dtype: Any = None,
    splittable_dims: Sequence[DimensionLike] | None = None,
    grad_function: Callable[..., Any] | None = None,
    name: str | None = None,
) -> Any:
    """``tf_fn`` on each device's slices of ``xs`` (Mesh TF's ``mtf.slicewise``).

    ``output_shape``/``output_dtype`` default to ``xs[0]``'s; lists of them
    make several outputs (returned as a tuple).
    """
    xs = list(xs)
    multiple = isinstance(output_dtype, list)
    shapes = output_shape if multiple else [output_shape]
    dtypes_ = output_dtype if multiple else [output_dtype]
    op = SlicewiseOperation(
        tf_fn,
        xs,
        [xs[0].shape if s is None else convert_to_shape(s) for s in shapes],
        [xs[0].dtype if d is None else d for d in dtypes_],
        splittable_dims,
        grad_function,
        name=name,
    )
    return tuple(op.outputs) if multiple else op.outputs[0]


class Depend(Operation):
    """``x``, once the TensorFlow work of ``ops`` has run (Mesh TF's
    ``mtf.depend``: e.g. read a variable after its assignment)."""

    op_type = "Depend"

    def __init__(
        self, x: Tensor, ops: Sequence[Operation], name: str | None = None
    ) -> None:
        super().__init__([x], name=name or "depend")
        self.control_inputs = list(ops)
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [grad_ys[0]]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        deps: list[Any] = []  # TensorFlow ops (no stubs)
        for op in self.control_inputs:
            done = lowering.lowered_operations.get(op)
            if isinstance(done, (list, tuple)):
                deps.extend(d for d in done if d is not None)
        impl = lowering.mesh_impl(self)

        def after(x: Any) -> Any:
            with tf.control_dependencies(deps):
                return tf.identity(x)

        lowering.set_tensor_lowering(
            self.outputs[0], impl.slicewise(after, lowering.tensors[self.inputs[0]])
        )


def depend(x: Tensor, deps: Sequence[Operation | Tensor]) -> Tensor:
    """``x`` after ``deps`` (operations, or tensors whose operations) ran."""
    ops = [d.operation if isinstance(d, Tensor) else d for d in deps]
    return Depend(x, ops).outputs[0]


class PrintOperation(Operation):
    """``x``, printing ``message`` and the full values of ``data`` when the
    lowered graph runs (Mesh TF's ``mtf.Print``)."""

    op_type = "Print"

    def __init__(
        self,
        x: Tensor,
        data: Sequence[Tensor],
        message: str,
        summarize: int = 3,
        name: str | None = None,
    ) -> None:
        super().__init__([x, *data], name=name or "print")
        self.message = message
        self.summarize = summarize
        self._add_output(x.shape, x.dtype)

    def attrs(self) -> dict[str, Any]:
        return {"message": self.message, "summarize": self.summarize}

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [grad_ys[0]] + [None] * (len(self.inputs) - 1)

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        full = [
            impl.export_to_tf_tensor(lowering.tensors[d], d.shape)
            for d in self.inputs[1:]
        ]
        printed = tf.print(self.message, *full, summarize=self.summarize)

        def after(x: Any) -> Any:
            with tf.control_dependencies([printed]):
                return tf.identity(x)

        lowering.set_tensor_lowering(
            self.outputs[0], impl.slicewise(after, lowering.tensors[self.inputs[0]])
        )


def Print(  # noqa: N802
    x: Tensor, data: Sequence[Tensor], message: str, **kwargs: Any
) -> Tensor:
    """``x``, printing ``message`` and ``data`` when run (Mesh TF's name)."""
    return PrintOperation(x, list(data), message, **kwargs).outputs[0]
