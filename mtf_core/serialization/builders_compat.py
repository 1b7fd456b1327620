"""Builders for the Mesh TF surface's ops: ``Print`` and ``ScalarSummary``
rebuild; ``slicewise`` (and its generic gradient) and ``depend`` are refused
with a clear error (a Python TF function, or control edges, that a flat JSON
list of operations does not hold)."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops.slicewise import (
    Depend,
    GenericGradOperation,
    PrintOperation,
    SlicewiseOperation,
)
from mtf_core.ops.summary import ScalarSummaryOperation
from mtf_core.serialization.registry import OpSpec, register


def _refuse(spec: OpSpec, why: str) -> Operation:
    raise SerializationError(
        f"{spec.path}: {spec.op_type} {spec.name!r} cannot be rebuilt from a "
        f"document: {why}; build it in Python"
    )


@register(SlicewiseOperation)
def _slicewise(spec: OpSpec) -> Operation:
    return _refuse(spec, "it runs a Python TensorFlow function")


@register(GenericGradOperation)
def _generic_grad(spec: OpSpec) -> Operation:
    return _refuse(spec, "it differentiates a Python TensorFlow function")


@register(Depend)
def _depend(spec: OpSpec) -> Operation:
    return _refuse(spec, "its control dependencies are not in the format")


@register(PrintOperation)
def _print(spec: OpSpec) -> Operation:
    spec.expect_min_inputs(1)
    return PrintOperation(
        spec.inputs[0],
        spec.inputs[1:],
        spec.attrs.get_str("message", ""),
        spec.attrs.get_int("summarize", 3),
        name=spec.name,
    )


@register(ScalarSummaryOperation)
def _scalar_summary(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    return ScalarSummaryOperation(spec.name, spec.inputs[0])
