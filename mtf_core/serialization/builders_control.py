"""Builders for control flow: ``while_loop`` is refused with a clear error.

A loop's condition and body are Python functions traced into mtf sub-graphs;
the JSON format holds one flat list of operations, so a loop cannot be
rebuilt from a document (its sub-graphs would need a nested form).
"""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops.control import LoopInput, WhileLoop
from mtf_core.serialization.registry import OpSpec, register


@register(WhileLoop)
def _while_loop(spec: OpSpec) -> Operation:
    raise SerializationError(
        f"{spec.path}: WhileLoop {spec.name!r} cannot be rebuilt from a document: "
        "its condition and body are Python functions; build the loop in Python"
    )


@register(LoopInput)
def _loop_input(spec: OpSpec) -> Operation:
    raise SerializationError(
        f"{spec.path}: LoopInput {spec.name!r} exists only inside a while_loop's "
        "body, never in a document"
    )
