"""2-D convolution over named dims, with its gradient ops.

``x [batch..., h, w, in_channels]`` convolved with ``filters [fh, fw,
in_channels, out_channels]`` gives ``[batch..., h', w', out_channels]``.  Each
device runs ``tf.nn.conv2d`` on its slice (batch dims flattened to one), so the
spatial dims (``h, w`` and the filter's) must stay whole; batch and channel
dims may be split.  Like an einsum, a split ``in_channels`` leaves partial
sums that are allreduced (pending, so they fuse with other sums).

Gradients are two more ops of this family: the input gradient (a transposed
convolution, summing over ``out_channels``) and the filter gradient (summing
over the batch dims and positions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, allreduce_collectives
from mtf_core.errors import LayoutError, ShapeError
from mtf_core.graph import Operation, Tensor, check_same_dtype, check_same_mesh
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.shapes import Dimension, Shape

PADDINGS = ("SAME", "VALID")


def conv_output_size(size: int, filter_size: int, stride: int, padding: str) -> int:
    if padding == "SAME":
        return -(-size // stride)
    return -(-(size - filter_size + 1) // stride)


class _ConvBase(Operation):
    """Shared geometry: which dims are batch, spatial and channels."""

    def _setup(
        self, x_shape: Shape, f_shape: Shape, strides: Sequence[int], padding: str
    ) -> None:
        if padding not in PADDINGS:
            raise ShapeError(f"conv2d: padding {padding!r} must be one of {PADDINGS}")
        strides = tuple(int(s) for s in strides)
        if len(strides) != 2 or min(strides) < 1:
            raise ShapeError(f"conv2d: strides {strides} must be two positive ints")
        self.strides = strides
        self.padding = padding
        self.x_shape, self.f_shape = x_shape, f_shape
        self.batch_dims = list(x_shape.dims[:-3])
        self.h, self.w, self.cin = x_shape.dims[-3:]
        self.fh, self.fw, _, self.cout = f_shape.dims
        self.out_shape = Shape(
            self.batch_dims
            + [
                Dimension(
                    self.h.name,
                    conv_output_size(self.h.size, self.fh.size, strides[0], padding),
                ),
                Dimension(
                    self.w.name,
                    conv_output_size(self.w.size, self.fw.size, strides[1], padding),
                ),
                self.cout,
            ]
        )
        self._unsplittable = frozenset(
            d.name for d in (self.h, self.w, self.fh, self.fw)
        )

    @property
    def tf_strides(self) -> list[int]:
        return [1, self.strides[0], self.strides[1], 1]

    def _nhwc(self, tf: Any, s: Any, shape: Shape) -> tuple[Any, list[int]]:
        """Flattens the batch dims of a local slice; returns it and their sizes."""
        local = [int(v) for v in s.shape]
        nb = len(shape) - 3
        flat = tf.reshape(s, [math.prod(local[:nb]), *local[nb:]])
        return flat, local[:nb]

    def flops(self) -> float:
        out = self.out_shape.size
        return 2.0 * out * self.fh.size * self.fw.size * self.cin.size

    def _check_whole(self, ctx: Any) -> None:
        """Raises if the layout splits a spatial dim (each device needs whole images)."""
        for name in sorted(self._unsplittable):
            a = ctx.effective_mesh_axis(name)
            if a is not None:
                raise LayoutError(
                    f"{self.op_type} {self.name}: spatial dimension {name!r} is split "
                    f"over mesh dimension {ctx.axis_name(a)!r}; conv2d needs h, w and "
                    "the filter's spatial dims whole (split batch or channels instead)"
                )

    def _partial_sum(self, impl: Any, res: Any, dims: list[str]) -> Any:
        self._check_whole(impl.ctx)
        axes = impl.ctx.reduced_axes(dims)
        return LazyAllreduceSum(impl, res, axes, self) if axes else res

    def _pending(self, ctx: Any, dims: list[str]) -> list[CollectiveSpec]:
        self._check_whole(ctx)
        ctx.check_op(self)
        out = self.outputs[0]
        return allreduce_collectives(ctx, out.shape, out.dtype, ctx.reduced_axes(dims))

    def attrs(self) -> dict[str, Any]:
        return {"strides": list(self.strides), "padding": self.padding}


class Conv2d(_ConvBase):
    """``conv2d(x, filters)``; see the module docstring for the shapes."""

    op_type = "Conv2d"

    def __init__(
        self,
        x: Tensor,
        filters: Tensor,
        strides: Sequence[int] = (1, 1),
        padding: str = "SAME",
        name: str | None = None,
    ) -> None:
        check_same_mesh([x, filters])
        check_same_dtype([x, filters], "conv2d")
        if x.shape.ndims < 3 or filters.shape.ndims != 4:
            raise ShapeError(
                f"conv2d: expected x [batch..., h, w, in_channels] and filters "
                f"[fh, fw, in_channels, out_channels], got [{x.shape}] and "
                f"[{filters.shape}]"
            )
        if filters.shape.dims[2] != x.shape.dims[-1]:
            raise ShapeError(
                f"conv2d: filters' third dim {filters.shape.dims[2]} must be x's "
                f"channel dim {x.shape.dims[-1]}"
            )
        super().__init__([x, filters], name=name or "conv2d")
        self._setup(x.shape, filters.shape, strides, padding)
        self._add_output(self.out_shape, x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None, None]
        x, f = self.inputs
        return [
            Conv2dBackpropInput(dy, f, x.shape, self.strides, self.padding).outputs[0],
            Conv2dBackpropFilter(x, dy, f.shape, self.strides, self.padding).outputs[0],
        ]

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        return self._pending(ctx, [self.cin.name])

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        impl.ctx.check_op(self)
        x, f = self.inputs

        def local(xs: Any, fs: Any) -> Any:
            flat, batch = self._nhwc(tf, xs, x.shape)
            y = tf.nn.conv2d(flat, fs, self.tf_strides, self.padding)
            return tf.reshape(y, [*batch, *[int(v) for v in y.shape[1:]]])

        res = impl.slicewise(local, lowering.tensors[x], lowering.tensors[f])
        res = self._partial_sum(impl, res, [self.cin.name])
        lowering.set_tensor_lowering(self.outputs[0], res)


class Conv2dBackpropInput(_ConvBase):
    """Gradient of conv2d with respect to its input (sums over out_channels)."""

    op_type = "Conv2dBackpropInput"

    def __init__(
        self,
        dy: Tensor,
        filters: Tensor,
        x_shape: Shape,
        strides: Sequence[int],
        padding: str,
        name: str | None = None,
    ) -> None:
        super().__init__([dy, filters], name=name or "conv2d_grad_input")
        self._setup(x_shape, filters.shape, strides, padding)
        self._add_output(x_shape, dy.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        raise NotImplementedError("second derivatives of conv2d are not supported")

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        return self._pending(ctx, [self.cout.name])

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        dy, f = self.inputs
        x_local = impl.slice_shape(self.x_shape)
        nb = len(self.batch_dims)

        def local(dys: Any, fs: Any) -> Any:
            flat, _ = self._nhwc(tf, dys, dy.shape)
            sizes = [math.prod(x_local[:nb]), *x_local[nb:]]
            dx = tf.raw_ops.Conv2DBackpropInput(
                input_sizes=sizes,
                filter=fs,
                out_backprop=flat,
                strides=self.tf_strides,
                padding=self.padding,
            )
            return tf.reshape(dx, x_local)

        res = impl.slicewise(local, lowering.tensors[dy], lowering.tensors[f])
        res = self._partial_sum(impl, res, [self.cout.name])
        lowering.set_tensor_lowering(self.outputs[0], res)


class Conv2dBackpropFilter(_ConvBase):
    """Gradient of conv2d with respect to its filters (sums over batch dims)."""

    op_type = "Conv2dBackpropFilter"

    def __init__(
        self,
        x: Tensor,
        dy: Tensor,
        f_shape: Shape,
        strides: Sequence[int],
        padding: str,
        name: str | None = None,
    ) -> None:
        super().__init__([x, dy], name=name or "conv2d_grad_filter")
        self._setup(x.shape, f_shape, strides, padding)
        self._add_output(f_shape, x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        raise NotImplementedError("second derivatives of conv2d are not supported")

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        return self._pending(ctx, [d.name for d in self.batch_dims])

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x, dy = self.inputs
        f_local = impl.slice_shape(self.f_shape)

        def local(xs: Any, dys: Any) -> Any:
            fx, _ = self._nhwc(tf, xs, x.shape)
            fdy, _ = self._nhwc(tf, dys, dy.shape)
            return tf.raw_ops.Conv2DBackpropFilter(
                input=fx,
                filter_sizes=f_local,
                out_backprop=fdy,
                strides=self.tf_strides,
                padding=self.padding,
            )

        res = impl.slicewise(local, lowering.tensors[x], lowering.tensors[dy])
        res = self._partial_sum(impl, res, [d.name for d in self.batch_dims])
        lowering.set_tensor_lowering(self.outputs[0], res)


def conv2d(
    x: Tensor,
    filters: Tensor,
    strides: Sequence[int] = (1, 1),
    padding: str = "SAME",
    name: str | None = None,
) -> Tensor:
    """``tf.nn.conv2d`` over named dims (NHWC, batch dims flattened)."""
    return Conv2d(x, filters, strides, padding, name).outputs[0]
