"""Builders for stored (sharded) variables' reads and their reduce-scatters."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops.stored import ReduceScatter, StoredRead
from mtf_core.serialization.registry import OpSpec, register


def _renamed(spec: OpSpec) -> object:
    spec.expect_inputs(1)
    shape = spec.output_shape()
    written = spec.attrs.raw("new_shape")
    if written is not None and written != str(shape):
        raise SerializationError(
            f"{spec.attrs.path}.new_shape: {written!r} disagrees with the declared "
            f"output shape [{shape}]"
        )
    if shape.size != spec.inputs[0].shape.size:
        raise SerializationError(
            f"{spec.attrs.path}: output [{shape}] and input "
            f"[{spec.inputs[0].shape}] have different sizes"
        )
    return shape


@register(StoredRead)
def _stored_read(spec: OpSpec) -> Operation:
    shape = _renamed(spec)
    return StoredRead(spec.inputs[0], shape, name=spec.name)  # type: ignore[arg-type]


@register(ReduceScatter)
def _reduce_scatter(spec: OpSpec) -> Operation:
    shape = _renamed(spec)
    return ReduceScatter(spec.inputs[0], shape, name=spec.name)
