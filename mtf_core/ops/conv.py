"""2-D and 3-D convolution over named dims, with their gradient ops.

``x [batch..., h, w, in_channels]`` convolved with ``filters [fh, fw,
in_channels, out_channels]`` gives ``[batch..., h', w', out_channels]``.  Each
device runs ``tf.nn.conv2d`` on its slice (batch dims flattened to one), so the
spatial dims (``h, w`` and the filter's) must stay whole; batch and channel
dims may be split.  Like an einsum, a split ``in_channels`` leaves partial
sums that are allreduced (pending, so they fuse with other sums).

Gradients are two more ops of this family: the input gradient (a transposed
convolution, summing over ``out_channels``) and the filter gradient (summing
over the batch dims and positions).  ``conv3d`` is the same with three
spatial dims (``x [batch..., d, h, w, in_channels]``, ``filters [fd, fh, fw,
in_channels, out_channels]``, ``tf.nn.conv3d``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext, allreduce_collectives
from mtf_core.errors import LayoutError, ShapeError
from mtf_core.graph import Operation, Tensor, check_same_dtype, check_same_mesh
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape, convert_to_shape

PADDINGS = ("SAME", "VALID")


def conv_output_size(size: int, filter_size: int, stride: int, padding: str) -> int:
    if padding == "SAME":
        return -(-size // stride)
    return -(-(size - filter_size + 1) // stride)


class _ConvBase(Operation):
    """Shared geometry: which dims are batch, spatial and channels.

    ``spatial`` is 2 (conv2d: ``h, w``) or 3 (conv3d: ``d, h, w``)."""

    spatial = 2

    @property
    def _what(self) -> str:
        return f"conv{self.spatial}d"

    def _setup(
        self, x_shape: Shape, f_shape: Shape, strides: Sequence[int], padding: str
    ) -> None:
        n = self.spatial
        if padding not in PADDINGS:
            raise ShapeError(
                f"{self._what}: padding {padding!r} must be one of {PADDINGS}"
            )
        strides = tuple(int(s) for s in strides)
        if len(strides) != n or min(strides) < 1:
            raise ShapeError(
                f"{self._what}: strides {strides} must be {n} positive ints"
            )
        self.strides = strides
        self.padding = padding
        self.x_shape, self.f_shape = x_shape, f_shape
        self.batch_dims = list(x_shape.dims[: -(n + 1)])
        self.space = list(x_shape.dims[-(n + 1) : -1])
        self.cin = x_shape.dims[-1]
        self.fspace = list(f_shape.dims[:n])
        self.cout = f_shape.dims[n + 1]
        out_space = [
            Dimension(d.name, conv_output_size(d.size, f.size, st, padding))
            for d, f, st in zip(self.space, self.fspace, strides)
        ]
        self.out_shape = Shape(self.batch_dims + out_space + [self.cout])
        self._unsplittable = frozenset(d.name for d in self.space + self.fspace)

    @property
    def tf_strides(self) -> list[int]:
        return [1, *self.strides, 1]

    def _nhwc(self, tf: Any, s: Any, shape: Shape) -> tuple[Any, list[int]]:
        """Flattens the batch dims of a local slice; returns it and their sizes."""
        local = [int(v) for v in s.shape]
        nb = len(shape) - self.spatial - 1
        flat = tf.reshape(s, [math.prod(local[:nb]), *local[nb:]])
        return flat, local[:nb]

    def flops(self) -> float:
        window = math.prod(f.size for f in self.fspace)
        return 2.0 * self.out_shape.size * window * self.cin.size

    def _check_whole(self, ctx: Any) -> None:
        """Raises if the layout splits a spatial dim (each device needs whole images)."""
        for name in sorted(self._unsplittable):
            a = ctx.effective_mesh_axis(name)
            if a is not None:
                raise LayoutError(
                    f"{self.op_type} {self.name}: spatial dimension {name!r} is split "
                    f"over mesh dimension {ctx.axis_name(a)!r}; {self._what} needs "
                    "the spatial dims and the filter's whole (split batch or "
                    "channels instead)"
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
        n = self.spatial
        what = f"conv{n}d"
        check_same_mesh([x, filters])
        check_same_dtype([x, filters], what)
        if x.shape.ndims < n + 1 or filters.shape.ndims != n + 2:
            space = "h, w" if n == 2 else "d, h, w"
            raise ShapeError(
                f"{what}: expected x [batch..., {space}, in_channels] and filters "
                f"[{n} spatial dims, in_channels, out_channels], got [{x.shape}] "
                f"and [{filters.shape}]"
            )
        if filters.shape.dims[n] != x.shape.dims[-1]:
            raise ShapeError(
                f"{what}: filters' dim {filters.shape.dims[n]} must be x's "
                f"channel dim {x.shape.dims[-1]}"
            )
        super().__init__([x, filters], name=name or what)
        self._setup(x.shape, filters.shape, strides, padding)
        self._add_output(self.out_shape, x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None, None]
        x, f = self.inputs
        grad_input, grad_filter = _GRADIENTS[type(self)]
        return [
            grad_input(dy, f, x.shape, self.strides, self.padding).outputs[0],
            grad_filter(x, dy, f.shape, self.strides, self.padding).outputs[0],
        ]

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        return self._pending(ctx, [self.cin.name])

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        impl.ctx.check_op(self)
        x, f = self.inputs

        def local(xs: Any, fs: Any) -> Any:
            flat, batch = self._nhwc(tf, xs, x.shape)
            conv = tf.nn.conv2d if self.spatial == 2 else tf.nn.conv3d
            y = conv(flat, fs, self.tf_strides, self.padding)
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
        super().__init__([dy, filters], name=name or f"conv{self.spatial}d_grad_input")
        self._setup(x_shape, filters.shape, strides, padding)
        self._add_output(x_shape, dy.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        # out = conv^T(dy, f): linear in each input, so its gradients are a
        # convolution of the upstream gradient and a filter gradient.
        g = grad_ys[0]
        if g is None:
            return [None, None]
        dy, f = self.inputs
        conv, _, grad_filter = _FAMILIES[self.spatial]
        return [
            conv(g, f, self.strides, self.padding).outputs[0],
            grad_filter(g, dy, f.shape, self.strides, self.padding).outputs[0],
        ]

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        return self._pending(ctx, [self.cout.name])

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        dy, f = self.inputs
        x_local = impl.slice_shape(self.x_shape)
        nb = len(self.batch_dims)

        def local(dys: Any, fs: Any) -> Any:
            flat, _ = self._nhwc(tf, dys, dy.shape)
            sizes = [math.prod(x_local[:nb]), *x_local[nb:]]
            raw = (
                tf.raw_ops.Conv2DBackpropInput
                if self.spatial == 2
                else tf.raw_ops.Conv3DBackpropInputV2
            )
            dx = raw(
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
        super().__init__([x, dy], name=name or f"conv{self.spatial}d_grad_filter")
        self._setup(x.shape, f_shape, strides, padding)
        self._add_output(f_shape, x.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        g = grad_ys[0]
        if g is None:
            return [None, None]
        x, dy = self.inputs
        conv, grad_input, _ = _FAMILIES[self.spatial]
        return [
            grad_input(dy, g, x.shape, self.strides, self.padding).outputs[0],
            conv(x, g, self.strides, self.padding).outputs[0],
        ]

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        return self._pending(ctx, [d.name for d in self.batch_dims])

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x, dy = self.inputs
        f_local = impl.slice_shape(self.f_shape)

        def local(xs: Any, dys: Any) -> Any:
            fx, _ = self._nhwc(tf, xs, x.shape)
            fdy, _ = self._nhwc(tf, dys, dy.shape)
            raw = (
                tf.raw_ops.Conv2DBackpropFilter
                if self.spatial == 2
                else tf.raw_ops.Conv3DBackpropFilterV2
            )
            return raw(
                input=fx,
                filter_sizes=f_local,
                out_backprop=fdy,
                strides=self.tf_strides,
                padding=self.padding,
            )

        res = impl.slicewise(local, lowering.tensors[x], lowering.tensors[dy])
        res = self._partial_sum(impl, res, [d.name for d in self.batch_dims])
        lowering.set_tensor_lowering(self.outputs[0], res)


class Conv3d(Conv2d):
    """``conv3d(x, filters)``: ``x [batch..., d, h, w, in_channels]``,
    ``filters [fd, fh, fw, in_channels, out_channels]``."""

    op_type = "Conv3d"
    spatial = 3


class Conv3dBackpropInput(Conv2dBackpropInput):
    """Gradient of conv3d with respect to its input."""

    op_type = "Conv3dBackpropInput"
    spatial = 3


class Conv3dBackpropFilter(Conv2dBackpropFilter):
    """Gradient of conv3d with respect to its filters."""

    op_type = "Conv3dBackpropFilter"
    spatial = 3


#: Each convolution's two gradient ops.
_GRADIENTS: dict[type, tuple[Any, Any]] = {
    Conv2d: (Conv2dBackpropInput, Conv2dBackpropFilter),
    Conv3d: (Conv3dBackpropInput, Conv3dBackpropFilter),
}
#: By number of spatial dims: the convolution and its two gradient ops.
_FAMILIES: dict[int, tuple[Any, Any, Any]] = {
    2: (Conv2d, Conv2dBackpropInput, Conv2dBackpropFilter),
    3: (Conv3d, Conv3dBackpropInput, Conv3dBackpropFilter),
}


def conv2d(
    x: Tensor,
    filters: Tensor,
    strides: Sequence[int] = (1, 1),
    padding: str = "SAME",
    name: str | None = None,
) -> Tensor:
    """``tf.nn.conv2d`` over named dims (NHWC, batch dims flattened)."""
    return Conv2d(x, filters, strides, padding, name).outputs[0]


def conv3d(
    x: Tensor,
    filters: Tensor,
    strides: Sequence[int] = (1, 1, 1),
    padding: str = "SAME",
    name: str | None = None,
) -> Tensor:
    """``tf.nn.conv3d`` over named dims (NDHWC, batch dims flattened)."""
    return Conv3d(x, filters, strides, padding, name).outputs[0]


def conv_transpose(
    x: Tensor,
    filters: Tensor,
    output_shape: Shape,
    strides: Sequence[int],
    padding: str = "SAME",
    name: str | None = None,
) -> Tensor:
    """The transposed convolution (``tf.nn.conv2d_transpose`` /
    ``conv3d_transpose``): ``x [batch..., spatial..., in_channels]`` with
    ``filters [spatial..., out_channels, in_channels]`` gives
    ``output_shape`` (whose convolution by ``filters`` has ``x``'s shape).
    It is the input gradient op of that convolution, so its layout rules,
    communication and gradients are that op's."""
    n = len(list(strides))
    if n not in _FAMILIES:
        raise ShapeError(f"conv_transpose: strides {strides} must be 2 or 3 ints")
    out = convert_to_shape(output_shape)
    strides = [int(v) for v in strides]
    f = filters.shape
    expected = None
    if len(out) > n and len(f) == n + 2 and padding in PADDINGS:
        space = [
            Dimension(d.name, conv_output_size(d.size, k.size, st, padding))
            for d, k, st in zip(out.dims[-(n + 1) : -1], f.dims[:n], strides)
        ]
        expected = Shape([*out.dims[: -(n + 1)], *space, f.dims[n + 1]])
    if expected != x.shape or f.dims[n] != out.dims[-1]:
        raise ShapeError(
            f"conv{n}d_transpose: output [{out}] convolved by filters [{f}] "
            f"(strides {strides}, {padding}) does not give x's [{x.shape}]"
        )
    grad_input = _FAMILIES[n][1]
    result: Tensor = grad_input(x, filters, out, strides, padding, name).outputs[0]
    return result
