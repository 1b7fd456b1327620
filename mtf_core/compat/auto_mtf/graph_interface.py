"""``mesh_tensorflow.auto_mtf.graph_interface``: an mtf graph's operations
and tensors by name, as Mesh TF's memory scheduling reads them.

Only mtf graphs (Mesh TF also reads TF graphs and cost-graph protobufs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import GraphError, GraphTypeError
from mtf_core.graph import Graph, Operation, Tensor


class GraphInterface:
    """Names, shapes, sizes and lifetimes of an mtf graph's tensors."""

    def __init__(self, graph: Any, canonical_device: str | None = None) -> None:
        if not isinstance(graph, Graph):
            raise GraphTypeError(
                f"GraphInterface reads an mtf.Graph, got {type(graph).__name__}; "
                "TF graphs and cost graphs are Mesh TF's alone"
            )
        self._graph = graph
        self._ops: dict[str, Operation] = {op.name: op for op in graph.operations}
        self._tensors: dict[str, Tensor] = {
            t.name: t for op in graph.operations for t in op.outputs
        }
        self._final: set[str] = set()

    # -- operations ---------------------------------------------------------
    def get_num_operations(self) -> int:
        return len(self._graph.operations)

    def get_all_operation_names(self) -> Iterator[str]:
        return (op.name for op in self._graph.operations)

    def _op(self, name: str) -> Operation:
        try:
            return self._ops[name]
        except KeyError:
            raise GraphError(f"graph has no operation named {name!r}") from None

    def get_operation_input_names(self, operation_name: str) -> Iterator[str]:
        return (t.name for t in self._op(operation_name).inputs)

    def get_operation_output_names(self, operation_name: str) -> Iterator[str]:
        return (t.name for t in self._op(operation_name).outputs)

    def get_operation_mtf_dimension_names(self, operation_name: str) -> set[str]:
        return set(self._op(operation_name).all_dim_names)

    # -- tensors ------------------------------------------------------------
    def get_all_tensor_names(self) -> Iterator[str]:
        return iter(self._tensors)

    def _tensor(self, name: str) -> Tensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise GraphError(f"graph has no tensor named {name!r}") from None

    def get_tensor_dtype(self, tensor_name: str) -> str:
        return self._tensor(tensor_name).dtype

    def get_tensor_shape(self, tensor_name: str) -> list[int]:
        return self._tensor(tensor_name).shape.to_integer_list()

    def get_tensor_mtf_dimension_names(self, tensor_name: str) -> list[str]:
        return self._tensor(tensor_name).shape.dimension_names

    def get_tensor_num_entries(
        self,
        tensor_name: str,
        partial_layout: Mapping[str, str] | None = None,
        mesh_dimension_to_size: Mapping[str, int] | None = None,
    ) -> int:
        """Entries per device when the dims in ``partial_layout`` (dim name ->
        mesh dim name) are split over mesh dims of ``mesh_dimension_to_size``."""
        t = self._tensor(tensor_name)
        entries = t.shape.size
        for d in t.shape.dims:
            if partial_layout and d.name in partial_layout:
                assert mesh_dimension_to_size is not None
                entries //= mesh_dimension_to_size[partial_layout[d.name]]
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
        return entries * dtypes.size_bytes(self._tensor(tensor_name).dtype)

    def get_tensor_device(self, tensor_name: str) -> None:
        """An mtf graph's tensors have no TF device: ``None``."""
        self._tensor(tensor_name)
        return None

    def is_tensor_on_canonical_device(self, tensor_name: str) -> bool:
        """Every tensor of an mtf graph counts (there are no devices)."""
        self._tensor(tensor_name)
        return True

    def get_operation_device(self, operation_name: str) -> None:
        self._op(operation_name)
        return None

    def set_tensor_final(self, tensor_name: str) -> None:
        """Marks a tensor as an output: it stays in memory to the end."""
        self._tensor(tensor_name)
        self._final.add(tensor_name)

    def is_tensor_final(self, tensor_name: str) -> bool:
        return tensor_name in self._final

    def compute_memory_contents_under_schedule(
        self, schedule: Sequence[int]
    ) -> list[frozenset[str]]:
        """The tensors in memory while each scheduled operation runs: those
        made so far that are final or still to be read (a tensor nobody reads
        lives only while its operation runs)."""
        ops = self._graph.operations
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


def tensor_bytes(graph: GraphInterface, name: str) -> int:
    """Bytes of a whole tensor (no layout)."""
    return math.prod(graph.get_tensor_shape(name)) * dtypes.size_bytes(
        graph.get_tensor_dtype(name)
    )
