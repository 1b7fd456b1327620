"""TensorFlow's ``CostGraphDef`` protobuf from plain records of a graph's
operations (``tensorflow/core/framework/cost_graph.proto``): what Mesh TF's
``auto_mtf`` hands its memory scheduler.  TensorFlow's side of
``mtf_core.compat.auto_mtf.graph_interface``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2, tensor_shape_pb2


@dataclass(frozen=True)
class CostOutput:
    """One output: its bytes, dtype name and shape (``shape`` None leaves the
    proto's shape unset, as for a tensor on a device not considered)."""

    size: int
    dtype: str
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class CostNode:
    """One operation: its inputs as ``(operation id, output index)`` pairs."""

    name: str
    device: str | None
    inputs: tuple[tuple[int, int], ...]
    outputs: tuple[CostOutput, ...]
    is_final: bool


def cost_graph_def(nodes: Sequence[CostNode]) -> cost_graph_pb2.CostGraphDef:
    """A ``CostGraphDef`` with one node per record, ids in order."""
    proto = cost_graph_pb2.CostGraphDef()
    for node_id, node in enumerate(nodes):
        out = proto.node.add(name=node.name, id=node_id)
        if node.device is not None:
            out.device = node.device
        for op_id, port in node.inputs:
            out.input_info.add(preceding_node=op_id, preceding_port=port)
        for o in node.outputs:
            info = out.output_info.add(
                size=o.size,
                alias_input_port=-1,
                dtype=tf.as_dtype(o.dtype).as_datatype_enum,
            )
            if o.shape is not None:
                info.shape.CopyFrom(
                    tensor_shape_pb2.TensorShapeProto(
                        dim=[
                            tensor_shape_pb2.TensorShapeProto.Dim(size=n)
                            for n in o.shape
                        ]
                    )
                )
        if node.is_final:
            out.is_final = True
    return proto
