"""``mesh_tensorflow.auto_mtf.graph_interface``: a graph's operations and
tensors by name, as Mesh TF's memory scheduling reads them.

The graph is an mtf graph (tensors with named dims, no devices) or a
TensorFlow graph (``tf.Graph``: tensors with devices, no mtf dims), read
through the same questions: names, inputs, outputs, dtypes, shapes, bytes,
devices, which tensors are in memory under a schedule, and the graph as
TensorFlow's ``CostGraphDef`` protobuf (:meth:`GraphInterface.compute_cost_graph`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import GraphError, GraphTypeError
from mtf_core.graph import Graph, Operation, Tensor


def _is_tf_graph(graph: object) -> bool:
    """A ``tf.Graph`` (told apart without importing TensorFlow)."""
    return type(graph).__module__.startswith("tensorflow") and hasattr(
        graph, "get_operations"
    )


class GraphInterface:
    """Names, shapes, sizes and lifetimes of a graph's tensors.

    ``canonical_device`` names the device whose tensors
    :meth:`is_tensor_on_canonical_device` reports (a tensor without a device
    is on every device).
    """

    def __init__(self, graph: Any, canonical_device: str | None = None) -> None:
        if isinstance(graph, Graph):
            ops: list[Any] = list(graph.operations)
        elif _is_tf_graph(graph):
            ops = list(graph.get_operations())
        else:
            raise GraphTypeError(
                f"GraphInterface reads an mtf.Graph or a tf.Graph, got "
                f"{type(graph).__name__}"
            )
        self._graph = graph
        self.canonical_device = canonical_device
        self._operations = ops
        self._op_index = {op.name: i for i, op in enumerate(ops)}
        # tensor name -> (operation index, output index)
        self._tensor_ids: dict[str, tuple[int, int]] = {
            t.name: (i, j) for i, op in enumerate(ops) for j, t in enumerate(op.outputs)
        }
        self._final: set[str] = set()

    # -- operations ---------------------------------------------------------
    def get_num_operations(self) -> int:
        return len(self._operations)

    def get_all_operation_names(self) -> Iterator[str]:
        return (op.name for op in self._operations)

    def _op(self, name: str) -> Any:
        try:
            return self._operations[self._op_index[name]]
        except KeyError:
            raise GraphError(f"graph has no operation named {name!r}") from None

    def get_operation_input_names(self, operation_name: str) -> Iterator[str]:
        return (t.name for t in self._op(operation_name).inputs)

    def get_operation_output_names(self, operation_name: str) -> Iterator[str]:
        return (t.name for t in self._op(operation_name).outputs)

    def get_operation_mtf_dimension_names(self, operation_name: str) -> set[str]:
        """The mtf dims of the operation's inputs and outputs (none for a TF
        operation)."""
        op = self._op(operation_name)
        return set(op.all_dim_names) if isinstance(op, Operation) else set()

    def get_operation_device(self, operation_name: str) -> str | None:
        """A TF operation's device (maybe ''); ``None`` for an mtf operation."""
        op = self._op(operation_name)
        return None if isinstance(op, Operation) else str(op.device)

    # -- tensors ------------------------------------------------------------
    def get_all_tensor_names(self) -> Iterator[str]:
        return iter(self._tensor_ids)

    def _tensor(self, name: str) -> Any:
        try:
            i, j = self._tensor_ids[name]
        except KeyError:
            raise GraphError(f"graph has no tensor named {name!r}") from None
        return self._operations[i].outputs[j]

    def get_tensor_dtype(self, tensor_name: str) -> Any:
        """An mtf tensor's dtype name, or a TF tensor's ``tf.DType`` (both
        compare equal to ``tf.int32`` and the like)."""
        return self._tensor(tensor_name).dtype

    def get_tensor_shape(self, tensor_name: str) -> list[int]:
        t = self._tensor(tensor_name)
        if isinstance(t, Tensor):
            return t.shape.to_integer_list()
        sizes = t.shape.as_list() if t.shape.rank is not None else None
        if sizes is None or any(n is None for n in sizes):
            raise GraphError(
                f"TF tensor {tensor_name!r} has shape {t.shape}; its size must be known"
            )
        return [int(n) for n in sizes]

    def get_tensor_mtf_dimension_names(self, tensor_name: str) -> list[str]:
        """The mtf dim names of the tensor (none for a TF tensor)."""
        t = self._tensor(tensor_name)
        return list(t.shape.dimension_names) if isinstance(t, Tensor) else []

    def get_tensor_num_entries(
        self,
        tensor_name: str,
        partial_layout: Mapping[str, str] | None = None,
        mesh_dimension_to_size: Mapping[str, int] | None = None,
    ) -> int:
        """Entries per device when the dims in ``partial_layout`` (dim name ->
        mesh dim name) are split over mesh dims of ``mesh_dimension_to_size``."""
        entries = math.prod(self.get_tensor_shape(tensor_name))
        for name in self.get_tensor_mtf_dimension_names(tensor_name):
            if partial_layout and name in partial_layout:
                if mesh_dimension_to_size is None:
                    raise GraphError(
                        "get_tensor_num_entries: partial_layout "
                        f"{dict(partial_layout)} needs mesh_dimension_to_size"
                    )
                entries //= mesh_dimension_to_size[partial_layout[name]]
        return entries

    def get_tensor_size(
        self,
        tensor_name: str,
        partial_layout: Mapping[str, str] | None = None,
        mesh_dimension_to_size: Mapping[str, int] | None = None,
    ) -> int:
        """Bytes per device (see :meth:`get_tensor_num_entries`)."""
        entries = self.get_tensor_num_entries(
            tensor_name, partial_layout, mesh_dimension_to_size
        )
        return entries * dtypes.size_bytes(self.get_tensor_dtype(tensor_name))

    def get_tensor_device(self, tensor_name: str) -> str | None:
        """A TF tensor's device (maybe ''); ``None`` for an mtf tensor."""
        t = self._tensor(tensor_name)
        return None if isinstance(t, Tensor) else str(t.device)

    def is_tensor_on_canonical_device(self, tensor_name: str) -> bool:
        """True for a tensor without a device or on the canonical one."""
        device = self.get_tensor_device(tensor_name)
        return not device or device == self.canonical_device

    def set_tensor_final(self, tensor_name: str) -> None:
        """Marks a tensor as an output: it stays in memory to the end."""
        self._tensor(tensor_name)
        self._final.add(tensor_name)

    def is_tensor_final(self, tensor_name: str) -> bool:
        return tensor_name in self._final

    # -- memory ---------------------------------------------------------------
    def compute_memory_contents_under_schedule(
        self, schedule: Sequence[int]
    ) -> list[frozenset[str]]:
        """The tensors in memory while each scheduled operation runs: those
        made so far that are final or still to be read (a tensor nobody reads
        lives only while its operation runs)."""
        ops = self._operations
        step_of = {ops[i].name: k for k, i in enumerate(schedule)}
        last_use: dict[str, int] = {}
        for op in ops:
            for t in op.outputs:
                last_use[t.name] = step_of[op.name]
        for op in ops:
            for t in op.inputs:
                last_use[t.name] = max(last_use[t.name], step_of[op.name])
        contents = []
        live: list[str] = []
        for k, i in enumerate(schedule):
            live += [t.name for t in ops[i].outputs]
            contents.append(
                frozenset(t for t in live if t in self._final or last_use[t] >= k)
            )
        return contents

    def compute_cost_graph(self, devices: Sequence[str] | None = None) -> Any:
        """The graph as TensorFlow's ``CostGraphDef``: a node per operation
        (id = its index), its inputs as (node, output) pairs and each output's
        bytes, dtype and shape; an operation with a final output is final.

        With ``devices``, an output on a device not listed has size 0 and no
        shape; outputs without a device (all of an mtf graph's) keep theirs.
        """
        from mtf_core.lowering.cost_graph_proto import (
            CostNode,
            CostOutput,
            cost_graph_def,
        )

        nodes = []
        for op in self._operations:
            outputs = []
            for t in op.outputs:
                device = self.get_tensor_device(t.name)
                counted = devices is None or device is None or device in devices
                outputs.append(
                    CostOutput(
                        size=self.get_tensor_size(t.name) if counted else 0,
                        dtype=dtypes.as_dtype_name(t.dtype),
                        shape=tuple(self.get_tensor_shape(t.name)) if counted else None,
                    )
                )
            nodes.append(
                CostNode(
                    name=op.name,
                    device=self.get_operation_device(op.name),
                    inputs=tuple(self._tensor_ids[t.name] for t in op.inputs),
                    outputs=tuple(outputs),
                    is_final=any(t.name in self._final for t in op.outputs),
                )
            )
        return cost_graph_def(nodes)


def tensor_bytes(graph: GraphInterface, name: str) -> int:
    """Bytes of a whole tensor (no layout)."""
    return math.prod(graph.get_tensor_shape(name)) * dtypes.size_bytes(
        graph.get_tensor_dtype(name)
    )
