"""What the planner learns from a graph before any mesh shape is known.

The dimension graph, the cost units and the memory model (from
:mod:`cost_models`), and the live sets as rows of bytes per tensor class
(tensors grouped by their set of dim names).  The mesh-shape search plans one
graph on many meshes; all of this is computed once for all of them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import numpy as np

from cost_models.gc_pause import gc_paused
from cost_models.memory import MemoryModel, memory_model
from cost_models.signatures import Signature
from cost_models.units import UnitClass, cost_unit_classes
from layout_planner.dim_graph import DimensionGraph
from layout_planner.errors import PlannerError
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.shapes import Shape


def unique_rows(a: np.ndarray) -> np.ndarray:
    """``np.unique(a, axis=0)`` of a 2-D integer array (its distinct rows in
    lexicographic order), by a lexsort: ten times faster on live-set rows."""
    if len(a) == 0 or a.shape[1] == 0:
        return np.unique(a, axis=0)
    ordered = a[np.lexsort(a.T[::-1])]
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.any(ordered[1:] != ordered[:-1], axis=1, out=keep[1:])
    return ordered[keep]


#: The bytes of all of a graph's tensors (unsplit) must stay below this
#: (2**55, 32 PiB): memory rows sum them in int64, and a pipeline stage's
#: rows add up to 63 other micro-batches' held bytes.  The reference models'
#: stage graphs hold under 2**47 (docs/scale.md, "Bad input").
MAX_GRAPH_BYTES = 2**55


class GraphAnalysis:
    """The mesh-independent part of a planning problem.

    ``live_rows[r, c]``: unsplit bytes of the tensors of class ``c`` (dim names
    ``tensor_classes[c]``) alive in maximal live set ``r``; duplicate rows
    appear once.  Built by a vectorized sweep over the live sets' differences,
    never by summing the (large, overlapping) sets themselves.
    """

    def __init__(
        self,
        graph: Graph,
        outputs: Sequence[Tensor] = (),
        once_from: int | None = None,
    ) -> None:
        """``once_from``: the index of the first op that runs once per step
        (a pipeline's optimizer update), for the tables' once-per-step time
        (:mod:`cost_models.units`); None: every op runs once per batch."""
        t0 = time.perf_counter()
        self.graph = graph
        self.outputs = list(outputs)
        self.once_from = once_from
        with gc_paused():
            #: Each step op's signature (:class:`cost_models.signatures.Signer`).
            self.op_signatures: dict[Operation, Signature] = {}
            self.unit_classes: list[UnitClass] = cost_unit_classes(
                graph, self.outputs, once_from, self.op_signatures
            )
            self.memory: MemoryModel = memory_model(graph, self.outputs)
            self._live_rows()
        self.seconds = time.perf_counter() - t0

    @functools.cached_property
    def dim_graph(self) -> DimensionGraph:
        """The graph's dimension graph, made when first asked for: a stack's
        3- and 4-layer graphs are analysed for their units and memory and
        never need it (:mod:`layout_planner.stacked`)."""
        with gc_paused():
            return DimensionGraph.from_graph(self.graph)

    def _live_rows(self) -> None:
        memory = self.memory
        index: dict[tuple[str, ...], int] = {}
        of_shape: dict[int, tuple[Shape, int]] = {}  # Shape objects repeat
        column = np.empty(len(memory.buffers), dtype=np.int64)
        for i, t in enumerate(memory.buffers):
            hit = of_shape.get(id(t.shape))
            if hit is None or hit[0] is not t.shape:
                names = tuple(sorted(t.shape.dimension_names))
                hit = of_shape[id(t.shape)] = (
                    t.shape,
                    index.setdefault(names, len(index)),
                )
            column[i] = hit[1]
        total = sum(memory.nbytes)
        if total >= MAX_GRAPH_BYTES:
            big = max(range(len(memory.buffers)), key=memory.nbytes.__getitem__)
            t = memory.buffers[big]
            raise PlannerError(
                f"the graph's tensors hold {total:,} B in all (the largest, "
                f"{t.name} [{t.shape}], {memory.nbytes[big]:,} B); the planner "
                "counts bytes in 64-bit integers and takes graphs under "
                f"2**{MAX_GRAPH_BYTES.bit_length() - 1} B; expected smaller dims "
                "or batch"
            )
        nbytes = np.asarray(memory.nbytes, dtype=np.int64)
        # Each buffer adds its bytes to its class from the live set it joins
        # and takes them away from the one it leaves (see MemoryModel.spans).
        joins, leaves = memory.spans
        rows = np.zeros((len(memory.steps) + 1, len(index)), dtype=np.int64)
        np.add.at(rows, (joins, column), nbytes)
        np.subtract.at(rows, (leaves, column), nbytes)
        rows = np.cumsum(rows[:-1], axis=0)
        self.tensor_classes = list(index)
        self.live_rows = unique_rows(rows) if len(rows) else rows
