"""``mtf.scalar_summary``: a scalar to log from a lowered TF1 graph.

The op has no outputs; lowering it exports the (summed) scalar and records
it as ``tf.compat.v1.summary.scalar`` (graph mode) and in
``lowering.scalar_summaries`` (name -> tf.Tensor), and, as Mesh TF does, in
the TF collection ``mtf_scalar_summaries``.  Only a lowering of the whole
graph (or one that targets the op) lowers it.
"""

from __future__ import annotations

from mtf_core.graph import Operation, Tensor
from mtf_core.ops.reduce import reduce_sum
from mtf_core.seams import LoweringContext

SCALAR_SUMMARIES_COLLECTION_KEY = "mtf_scalar_summaries"


class ScalarSummaryOperation(Operation):
    """Logs the scalar ``x`` under ``name`` when lowered."""

    op_type = "ScalarSummary"
    stateful = True

    def __init__(self, name: str, x: Tensor) -> None:
        super().__init__([x], name=name)
        self.summary_name = name

    @property
    def has_gradient(self) -> bool:
        return False

    def flops(self) -> float:
        return 0.0

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        x = self.inputs[0]
        value = lowering.mesh_impl(self).export_to_tf_tensor(
            lowering.tensors[x], x.shape
        )
        summaries = lowering.__dict__.setdefault("scalar_summaries", {})
        summaries[self.summary_name] = value
        if not tf.executing_eagerly():
            tf.compat.v1.summary.scalar(self.summary_name, value)
            tf.compat.v1.add_to_collection(
                SCALAR_SUMMARIES_COLLECTION_KEY, (self.summary_name, value)
            )
        lowering.lowered_operations[self] = value


def scalar_summary(name: str, x: Tensor) -> ScalarSummaryOperation:
    """Logs the sum of ``x`` as the scalar summary ``name`` (Mesh TF's API)."""
    return ScalarSummaryOperation(name, reduce_sum(x))
