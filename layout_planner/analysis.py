"""What the planner learns from a graph before any mesh shape is known.

The dimension graph, the cost units and the memory model (from
:mod:`cost_models`), and the live sets as rows of bytes per tensor class
(tensors grouped by their set of dim names).  The mesh-shape search plans one
graph on many meshes; all of this is computed once for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from cost_models.memory import MemoryModel, memory_model
from cost_models.units import CostUnit, cost_units
from layout_planner.dim_graph import DimensionGraph
from mtf_core.graph import Graph, Tensor


class GraphAnalysis:
    """The mesh-independent part of a planning problem.

    ``live_rows[r, c]``: unsplit bytes of the tensors of class ``c`` (dim names
    ``tensor_classes[c]``) alive in maximal live set ``r``; duplicate rows
    appear once.  Built by a vectorized sweep over the live sets' differences,
    never by summing the (large, overlapping) sets themselves.
    """

    def __init__(self, graph: Graph, outputs: Sequence[Tensor] = ()) -> None:
        t0 = time.perf_counter()
        self.graph = graph
        self.outputs = list(outputs)
        self.dim_graph = DimensionGraph.from_graph(graph)
        self.units: list[CostUnit] = cost_units(graph, self.outputs)
        self.memory: MemoryModel = memory_model(graph, self.outputs)
        self._live_rows()
        self.seconds = time.perf_counter() - t0

    def _live_rows(self) -> None:
        tensors = self.memory.tensors
        index: dict[tuple[str, ...], int] = {}
        column = np.fromiter(
            (index.setdefault(tuple(sorted(t.dim_names)), len(index)) for t in tensors),
            dtype=np.int64,
            count=len(tensors),
        )
        nbytes = np.fromiter(
            (t.bytes for t in tensors), dtype=np.int64, count=len(tensors)
        )
        deltas = self.memory.live_set_deltas
        steps: list[int] = []
        who: list[int] = []
        sign: list[int] = []
        for k, (entering, leaving) in enumerate(deltas):
            steps.extend([k] * (len(entering) + len(leaving)))
            who.extend(entering)
            who.extend(leaving)
            sign.extend([1] * len(entering))
            sign.extend([-1] * len(leaving))
        rows = np.zeros((len(deltas), len(index)), dtype=np.int64)
        if who:
            t = np.asarray(who, dtype=np.int64)
            np.add.at(
                rows,
                (np.asarray(steps, dtype=np.int64), column[t]),
                nbytes[t] * np.asarray(sign, dtype=np.int64),
            )
        np.cumsum(rows, axis=0, out=rows)
        self.tensor_classes = list(index)
        self.live_rows = np.unique(rows, axis=0) if len(rows) else rows
