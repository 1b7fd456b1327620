"""``mesh_tensorflow.auto_mtf.memory_estimator``: the graph interface (with
the outputs marked final) and the layout validator of a graph on a mesh."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.compat.auto_mtf.graph_interface import GraphInterface
from mtf_core.compat.auto_mtf.valid_layouts import LayoutValidator
from mtf_core.graph import Graph, Tensor


class MemoryEstimator:
    """What a memory-minimising layout search reads about a graph."""

    def __init__(
        self, mtf_graph: Graph, mesh_shape: Any, mtf_outputs: Sequence[Tensor] = ()
    ) -> None:
        self.mtf_graph = mtf_graph
        self.mesh_shape = mesh_shape
        self.mtf_outputs = list(mtf_outputs)
        self._validator: LayoutValidator | None = None
        self._graph: GraphInterface | None = None

    def get_layout_validator(self) -> LayoutValidator:
        if self._validator is None:
            self._validator = LayoutValidator(self.mtf_graph, self.mesh_shape)
        return self._validator

    def get_graph_interface(self) -> GraphInterface:
        if self._graph is None:
            self._graph = GraphInterface(self.mtf_graph)
            for t in self.mtf_outputs:
                self._graph.set_tensor_final(t.name)
        return self._graph
