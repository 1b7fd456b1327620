"""Builders for reshapes and the slicing family (concat, split, stack, unstack,
slice, pad, shift).

The op constructors trust their callers (the public functions check the
arguments), so these builders check attrs the same way before constructing.
"""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops import slicing as sl
from mtf_core.ops.reshape import Reshape
from mtf_core.ops.shift import Shift
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import Shape


def declared_new_shape(spec: OpSpec) -> Shape:
    """The output shape of a one-input op that renames or reshapes, checked
    against its ``new_shape`` attribute where one is written."""
    spec.expect_inputs(1)
    shape = spec.output_shape()
    written = spec.attrs.raw("new_shape")
    if written is not None and written != str(shape):
        raise SerializationError(
            f"{spec.attrs.path}.new_shape: {written!r} disagrees with the declared "
            f"output shape [{shape}]"
        )
    return shape


@register(Reshape)
def _reshape(spec: OpSpec) -> Operation:
    return Reshape(spec.inputs[0], declared_new_shape(spec), name=spec.name)


@register(sl.Concat)
def _concat(spec: OpSpec) -> Operation:
    spec.expect_min_inputs(1)
    for i in range(len(spec.inputs)):
        spec.input_dim("concat_dim_name", i=i)
    dim_name = spec.attrs.get_str("concat_dim_name")
    return sl.Concat(spec.inputs, dim_name, name=spec.name)


@register(sl.Split)
def _split(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    d = spec.input_dim("split_dim")
    sizes = spec.attrs.get_int_list("sizes", minimum=1)
    if sum(sizes) != d.size:
        raise SerializationError(
            f"{spec.attrs.path}.sizes: {sizes} sum to {sum(sizes)}, but dimension "
            f"{d} has size {d.size}"
        )
    return sl.Split(spec.inputs[0], d, sizes, name=spec.name)


@register(sl.Stack)
def _stack(spec: OpSpec) -> Operation:
    spec.expect_min_inputs(1)
    dim_name = spec.attrs.get_str("dim_name")
    axis = spec.attrs.get_int("axis")
    return sl.Stack(spec.inputs, dim_name, axis, name=spec.name)


@register(sl.Unstack)
def _unstack(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    return sl.Unstack(spec.inputs[0], spec.input_dim("dim"), name=spec.name)


@register(sl.Slice)
def _slice(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    d = spec.input_dim("slice_dim_name")
    begin = spec.attrs.get_int("begin")
    size = spec.attrs.get_int("size")
    if begin < 0 or size < 1 or begin + size > d.size:
        raise SerializationError(
            f"{spec.attrs.path}: begin {begin} and size {size} do not select a "
            f"non-empty range of dimension {d}"
        )
    return sl.Slice(spec.inputs[0], begin, size, d.name, name=spec.name)


@register(sl.Pad)
def _pad(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    d = spec.input_dim("dim_name")
    paddings = spec.attrs.get_int_list("paddings", minimum=0)
    if len(paddings) != 2:
        raise SerializationError(
            f"{spec.attrs.path}.paddings: {paddings} is not [before, after]"
        )
    return sl.Pad(spec.inputs[0], (paddings[0], paddings[1]), d.name, name=spec.name)


@register(Shift)
def _shift(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    d = spec.input_dim("dim")
    offset = spec.attrs.get_int("offset")
    wrap = spec.attrs.get_bool("wrap", False)
    return Shift(spec.inputs[0], offset, d, wrap, name=spec.name)
