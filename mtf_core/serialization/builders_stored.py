"""Builders for stored (sharded) variables' reads and their reduce-scatters."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops.stored import ReduceScatter, StoredRead
from mtf_core.serialization.builders_slicing import declared_new_shape
from mtf_core.serialization.registry import OpSpec, register


def _renamed(spec: OpSpec) -> object:
    shape = declared_new_shape(spec)
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
