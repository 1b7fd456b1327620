"""Builders for 2-D convolution and its two gradient ops."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops import conv
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import Shape


def _geometry(spec: OpSpec) -> tuple[list[int], str]:
    strides = spec.attrs.get_int_list("strides", minimum=1)
    if len(strides) != 2:
        raise SerializationError(
            f"{spec.attrs.path}.strides: {strides} is not [stride_h, stride_w]"
        )
    return strides, spec.attrs.get_choice("padding", conv.PADDINGS)


def _check_shapes(
    spec: OpSpec, x_shape: Shape, f_shape: Shape, dy: Tensor, which: int
) -> None:
    """The gradient ops take the shape they produce on trust; check that it is
    the geometry ``dy`` came from."""
    if len(x_shape) < 4 or len(f_shape) != 4 or f_shape.dims[2] != x_shape.dims[-1]:
        raise SerializationError(
            f"{spec.path}: x [{x_shape}] and filters [{f_shape}] are not "
            "[batch..., h, w, in_channels] and [fh, fw, in_channels, out_channels]"
        )
    strides, padding = _geometry(spec)
    h, w = (
        conv.conv_output_size(
            x_shape.dims[-3 + i].size, f_shape.dims[i].size, s, padding
        )
        for i, s in enumerate(strides)
    )
    expected = Shape(
        [
            *x_shape.dims[:-3],
            (x_shape.dims[-3].name, h),
            (x_shape.dims[-2].name, w),
            f_shape.dims[3],
        ]
    )
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
