"""Builders for 2-D and 3-D convolution and their gradient ops."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops import conv
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import Shape


def _geometry(spec: OpSpec, n: int = 2) -> tuple[list[int], str]:
    strides = spec.attrs.get_int_list("strides", minimum=1)
    if len(strides) != n:
        names = ", ".join(f"stride_{a}" for a in "dhw"[3 - n :])
        raise SerializationError(
            f"{spec.attrs.path}.strides: {strides} is not [{names}]"
        )
    return strides, spec.attrs.get_choice("padding", conv.PADDINGS)


def _check_shapes(
    spec: OpSpec, x_shape: Shape, f_shape: Shape, dy: Tensor, which: int, n: int = 2
) -> None:
    """The gradient ops take the shape they produce on trust; check that it is
    the geometry ``dy`` came from."""
    if (
        len(x_shape) < n + 1
        or len(f_shape) != n + 2
        or f_shape.dims[n] != x_shape.dims[-1]
    ):
        raise SerializationError(
            f"{spec.path}: x [{x_shape}] and filters [{f_shape}] are not "
            f"[batch..., {n} spatial dims, in_channels] and [{n} spatial dims, "
            "in_channels, out_channels]"
        )
    strides, padding = _geometry(spec, n)
    space = [
        (
            x_shape.dims[-(n + 1) + i].name,
            conv.conv_output_size(
                x_shape.dims[-(n + 1) + i].size, f_shape.dims[i].size, s, padding
            ),
        )
        for i, s in enumerate(strides)
    ]
    expected = Shape([*x_shape.dims[: -(n + 1)], *space, f_shape.dims[n + 1]])
    if dy.shape != expected:
        raise SerializationError(
            f"{spec.path}.inputs[{which}]: {dy.name} [{dy.shape}] is not the "
            f"convolution output [{expected}] of x [{x_shape}] and filters "
            f"[{f_shape}]"
        )


@register(conv.Conv2d)
def _conv2d(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    strides, padding = _geometry(spec)
    x, filters = spec.inputs
    return conv.Conv2d(x, filters, strides, padding, name=spec.name)


@register(conv.Conv2dBackpropInput)
def _conv2d_backprop_input(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    dy, filters = spec.inputs
    x_shape = spec.output_shape()
    _check_shapes(spec, x_shape, filters.shape, dy, 0)
    strides, padding = _geometry(spec)
    return conv.Conv2dBackpropInput(
        dy, filters, x_shape, strides, padding, name=spec.name
    )


@register(conv.Conv2dBackpropFilter)
def _conv2d_backprop_filter(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    x, dy = spec.inputs
    f_shape = spec.output_shape()
    _check_shapes(spec, x.shape, f_shape, dy, 1)
    strides, padding = _geometry(spec)
    return conv.Conv2dBackpropFilter(x, dy, f_shape, strides, padding, name=spec.name)


@register(conv.Conv3d)
def _conv3d(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    strides, padding = _geometry(spec, 3)
    x, filters = spec.inputs
    return conv.Conv3d(x, filters, strides, padding, name=spec.name)


@register(conv.Conv3dBackpropInput)
def _conv3d_backprop_input(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    dy, filters = spec.inputs
    x_shape = spec.output_shape()
    _check_shapes(spec, x_shape, filters.shape, dy, 0, 3)
    strides, padding = _geometry(spec, 3)
    return conv.Conv3dBackpropInput(
        dy, filters, x_shape, strides, padding, name=spec.name
    )


@register(conv.Conv3dBackpropFilter)
def _conv3d_backprop_filter(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    x, dy = spec.inputs
    f_shape = spec.output_shape()
    _check_shapes(spec, x.shape, f_shape, dy, 1, 3)
    strides, padding = _geometry(spec, 3)
    return conv.Conv3dBackpropFilter(x, dy, f_shape, strides, padding, name=spec.name)
