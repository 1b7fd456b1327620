"""Mesh TF's ``mtf.utils``: variable placement and graph-mode helpers.

``mtf.utils`` (:mod:`mtf_core.utils`) loads these on first use, since they
need TensorFlow.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from mtf_core.errors import ArgumentError

# Mesh TF's mtf.utils name; it lives with the initial values it serves.
from mtf_core.lowering.initial_values import outside_all_rewrites
from mtf_core.lowering.masters import make_master
from mtf_core.ops.summary import SCALAR_SUMMARIES_COLLECTION_KEY

__all__ = [
    "SCALAR_SUMMARIES_COLLECTION_KEY",
    "BalancedVariablePlacer",
    "outside_all_rewrites",
    "remove_summaries",
]

_VARIABLE_OP_TYPES = ("Variable", "VariableV2", "VarHandleOp")


class BalancedVariablePlacer:
    """A TF device function that puts each new variable on the device with the
    fewest bytes of variables so far (``mtf.Mesh(graph, name, placer)``).

    Non-variable ops go to the device of the last variable placed, so a
    variable's initializer stays beside it.
    """

    def __init__(
        self, devices: Sequence[str], init_usage: Sequence[int] | None = None
    ) -> None:
        devices = list(devices)
        if not devices:
            raise ArgumentError("BalancedVariablePlacer needs at least one device")
        usage = list(init_usage) if init_usage else [0] * len(devices)
        if len(usage) != len(devices):
            raise ArgumentError(
                f"BalancedVariablePlacer: {len(devices)} devices but "
                f"{len(usage)} initial usages {usage}; expected one per device"
            )
        # (bytes, position, device): ties go to the earlier device.
        self._heap = [(u, i, d) for i, (u, d) in enumerate(zip(usage, devices))]
        heapq.heapify(self._heap)
        self._last_device = devices[0]

    def make_master(self, var: Any) -> None:
        """In TF1 graph mode, ``var``'s master variable, made now in the
        default graph on the device this placer picks (Mesh TF makes it in
        ``get_variable``); the lowering then uses it.  Eagerly: nothing."""
        if tf.executing_eagerly():
            return
        make_master(var, self.device_function)

    def device_function(self, op: Any) -> str:
        """The device for TF op ``op`` (a ``tf.Operation`` or NodeDef)."""
        if op.type not in _VARIABLE_OP_TYPES:
            return self._last_device
        shape = tf.TensorShape(op.get_attr("shape"))
        if shape.num_elements() is None:
            raise ArgumentError(
                f"variable {op.name} has shape {shape}, not fully defined; "
                "BalancedVariablePlacer needs its size"
            )
        nbytes = shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
        used, pos, device = heapq.heappop(self._heap)
        heapq.heappush(self._heap, (used + nbytes, pos, device))
        self._last_device = device
        return device


def remove_summaries() -> None:
    """Empties the default TF graph's ``mtf_scalar_summaries`` collection, which
    lowering ``mtf.scalar_summary`` ops fills (Mesh TF's Transformer calls it
    once it has handed the summaries to a TPU host call)."""
    del tf.compat.v1.get_default_graph().get_collection_ref(
        SCALAR_SUMMARIES_COLLECTION_KEY
    )[:]
