"""The dimension graph: which tensor-dimension names may share a mesh axis.

Layout rules are one global choice per dimension *name*, so the planner's
variables are names, not tensors.  This module collects, from an mtf graph:

* each name's sizes (a name may appear with several sizes; a mesh axis must
  divide all of them),
* the names an op needs whole (``op.unsplittable_dims()``) and which ops say so,
* edges between names: ``tensor`` edges join names that share a tensor (a hard
  conflict: one tensor cannot split two dims over one mesh axis), ``op`` edges
  join names that only meet in an op (the lowering rejects some ops whose dims
  share an axis, e.g. an einsum; see ``LayoutContext.check_op_dims``; the
  planner learns exactly which from the cost model, per local assignment),
* connected components: names in different components never constrain each
  other except through memory.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> z = mtf.einsum([mtf.zeros(m, "a:10,b:5"), mtf.zeros(m, "b:5,c:20")], "a:10,c:20")
>>> dg = DimensionGraph.from_graph(g)
>>> sorted(dg.names), dg.conflict_kind("a", "c")
(['a', 'b', 'c'], 'tensor')
>>> dg.allowed_axes("a", mtf.convert_to_shape("m1:4,m2:2"))
(1,)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.shapes import Shape

#: An assignment of a tuple of dims: for each dim, a mesh axis index or None.
Assignment = tuple[int | None, ...]


@dataclass(frozen=True)
class DimInfo:
    """What the planner knows about one dimension name."""

    name: str
    sizes: tuple[int, ...]
    unsplittable_by: tuple[str, ...]  # names of ops that need it whole
    num_tensors: int

    @property
    def splittable(self) -> bool:
        return not self.unsplittable_by

    def divisible_by(self, n: int) -> bool:
        return all(s % n == 0 for s in self.sizes)


def _with_nested(operations: Iterable[Operation]) -> list[Operation]:
    """``operations`` and, after each, the operations nested in it (a loop's
    body), so that every dim an op names has a node with its sizes."""
    out: list[Operation] = []
    for op in operations:
        out.append(op)
        out.extend(_with_nested(op.sub_operations))
    return out


class DimensionGraph:
    """A networkx graph over dimension names (see the module docstring).

    Node attributes: ``info`` (:class:`DimInfo`).  Edge attributes: ``kind``
    (``"tensor"`` or ``"op"``; ``tensor`` wins when both hold) and ``where``
    (the name of one tensor or op where the two names meet, for messages).
    """

    def __init__(self, nx_graph: nx.Graph) -> None:
        self.nx = nx_graph

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_graph(
        cls, graph: Graph, operations: Iterable[Operation] | None = None
    ) -> DimensionGraph:
        """Builds the dimension graph of ``graph`` (or of ``operations`` only)."""
        ops = _with_nested(graph.operations if operations is None else operations)
        sizes: dict[str, set[int]] = {}
        unsplittable: dict[str, list[str]] = {}
        tensor_edges: dict[tuple[str, str], str] = {}
        op_edges: dict[tuple[str, str], str] = {}
        names_of: dict[Shape, frozenset[str]] = {}
        seen_op_names: set[frozenset[str]] = set()
        # Deep models repeat a few shapes, mostly as the same Shape objects:
        # look those up by identity (hashing a Shape hashes every Dimension).
        by_id: dict[int, tuple[Shape, frozenset[str]]] = {}
        outputs_of: dict[int, int] = {}  # id(shape) -> outputs of that shape

        def add(t: Tensor) -> int:
            shape = t.shape
            key = id(shape)
            hit = by_id.get(key)
            if hit is None or hit[0] is not shape:
                got = names_of.get(shape)
                if got is None:
                    # A shape not seen before: its sizes and edges are new.
                    got = names_of[shape] = frozenset(d.name for d in shape.dims)
                    for d in shape.dims:
                        sizes.setdefault(d.name, set()).add(d.size)
                    _add_pairs(tensor_edges, [d.name for d in shape.dims], t.name)
                by_id[key] = (shape, got)
            return key

        for op in ops:
            for t in op.outputs:
                key = add(t)
                outputs_of[key] = outputs_of.get(key, 0) + 1
            for t in op.inputs:
                add(t)
            for name in op.unsplittable_dims():
                unsplittable.setdefault(name, []).append(op.name)
            op_names = op.all_dim_names
            if len(op_names) > 1 and op_names not in seen_op_names:
                seen_op_names.add(op_names)
                _add_pairs(op_edges, sorted(op_names), op.name)
        tensor_count: dict[str, int] = {}
        for key, count in outputs_of.items():
            for d in by_id[key][0].dims:
                tensor_count[d.name] = tensor_count.get(d.name, 0) + count
        g = nx.Graph()
        for name in sorted(sizes):
            g.add_node(
                name,
                info=DimInfo(
                    name,
                    tuple(sorted(sizes[name])),
                    tuple(unsplittable.get(name, ())),
                    tensor_count.get(name, 0),
                ),
            )
        for (a, b), where in sorted(op_edges.items()):
            g.add_edge(a, b, kind="op", where=where)
        for (a, b), where in sorted(tensor_edges.items()):
            g.add_edge(a, b, kind="tensor", where=where)
        return cls(g)

    # -- queries -----------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return sorted(self.nx.nodes)

    def info(self, name: str) -> DimInfo:
        info: DimInfo = self.nx.nodes[name]["info"]
        return info

    def __contains__(self, name: object) -> bool:
        return name in self.nx

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def conflict_kind(self, a: str, b: str) -> str | None:
        """``"tensor"``, ``"op"`` or None: how names ``a`` and ``b`` meet."""
        data = self.nx.get_edge_data(a, b)
        return None if data is None else str(data["kind"])

    def meeting_place(self, a: str, b: str) -> str | None:
        data = self.nx.get_edge_data(a, b)
        return None if data is None else str(data["where"])

    def tensor_conflicts(self) -> list[tuple[str, str]]:
        """Pairs of names that share a tensor, sorted."""
        return sorted(
            (min(a, b), max(a, b))
            for a, b, k in self.nx.edges(data="kind")
            if k == "tensor"
        )

    def components(self) -> list[tuple[str, ...]]:
        """Connected components (tensor and op edges), each sorted, largest first."""
        comps = [tuple(sorted(c)) for c in nx.connected_components(self.nx)]
        return sorted(comps, key=lambda c: (-len(c), c))

    def allowed_axes(self, name: str, mesh_shape: Shape) -> tuple[int, ...]:
        """Mesh axes (of size > 1) that may split ``name``: it is splittable and
        the axis size divides every size the name has."""
        info = self.info(name)
        if not info.splittable:
            return ()
        return tuple(
            i
            for i, d in enumerate(mesh_shape)
            if d.size > 1 and info.divisible_by(d.size)
        )

    def why_whole(self, name: str, mesh_shape: Shape) -> str | None:
        """Why ``name`` can never be split on ``mesh_shape`` (None if it can)."""
        info = self.info(name)
        if info.unsplittable_by:
            ops = ", ".join(info.unsplittable_by[:3])
            more = len(info.unsplittable_by) - 3
            extra = f" and {more} more" if more > 0 else ""
            return f"op {ops}{extra} needs it whole (unsplittable)"
        if not self.allowed_axes(name, mesh_shape):
            live = [f"{d.name}:{d.size}" for d in mesh_shape if d.size > 1]
            if not live:
                return "the mesh has no axis of size > 1"
            sizes = "/".join(str(s) for s in info.sizes)
            return f"size {sizes} is divisible by no mesh axis ({', '.join(live)})"
        return None

    def local_assignments(
        self, names: Sequence[str], allowed: dict[str, tuple[int, ...]]
    ) -> tuple[Assignment, ...]:
        """Every assignment of ``names`` (in order) to an allowed axis or None in
        which no two names joined by a ``tensor`` edge share an axis.

        The first assignment is always the all-None one.  The tuple is shared
        by every caller that asks for the same options and conflicts
        (:func:`assignment_codes` remembers its array by it).
        """
        names = list(names)
        conflicts = tuple(
            tuple(
                j
                for j in range(i)
                if self.conflict_kind(names[i], names[j]) == "tensor"
            )
            for i in range(len(names))
        )
        options = tuple((None, *allowed.get(n, ())) for n in names)
        return _assignments(options, conflicts)

    # -- serialization (for the REST API and the dashboard) -----------------------
    def to_dict(self, mesh_shape: Shape | None = None) -> dict[str, Any]:
        nodes = []
        for name in self.names:
            info = self.info(name)
            node: dict[str, Any] = {
                "name": name,
                "sizes": list(info.sizes),
                "unsplittable_by": list(info.unsplittable_by),
                "num_tensors": info.num_tensors,
            }
            if mesh_shape is not None:
                node["allowed_axes"] = [
                    mesh_shape[a].name for a in self.allowed_axes(name, mesh_shape)
                ]
            nodes.append(node)
        edges = [
            {"a": min(a, b), "b": max(a, b), "kind": k, "where": w}
            for a, b, k, w in (
                (a, b, d["kind"], d["where"]) for a, b, d in self.nx.edges(data=True)
            )
        ]
        edges.sort(key=lambda e: (e["a"], e["b"]))
        return {"nodes": nodes, "edges": edges, "components": self.components()}


def _add_pairs(
    edges: dict[tuple[str, str], str], names: Sequence[str], where: str
) -> None:
    for a, b in itertools.combinations(sorted(names), 2):
        edges.setdefault((a, b), where)


def tensor_dim_names(t: Tensor) -> tuple[str, ...]:
    return tuple(t.shape.dimension_names)


@functools.lru_cache(maxsize=4096)
def _assignments(
    options: tuple[tuple[int | None, ...], ...], conflicts: tuple[tuple[int, ...], ...]
) -> tuple[Assignment, ...]:
    """Every choice of one of ``options[i]`` per position ``i`` in which no
    position takes the axis of an earlier one it ``conflicts`` with (None
    conflicts with nothing), in order, the all-None one first.  Remembered:
    the tables of every mesh and recomputation option of a search ask for the
    same few hundred."""
    out: list[Assignment] = []
    current: list[int | None] = []

    def extend(i: int) -> None:
        if i == len(options):
            out.append(tuple(current))
            return
        for axis in options[i]:
            if axis is not None and any(current[j] == axis for j in conflicts[i]):
                continue
            current.append(axis)
            extend(i + 1)
            current.pop()

    extend(0)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def assignment_codes(assignments: tuple[Assignment, ...]) -> np.ndarray:
    """``assignments`` as an array: ``[a, p]`` is the mesh axis index + 1 that
    assignment ``a`` gives position ``p``, 0 for unsplit (read-only)."""
    width = len(assignments[0]) if assignments else 0
    codes = np.array(
        [[0 if x is None else x + 1 for x in asg] for asg in assignments],
        dtype=np.int64,
    ).reshape(len(assignments), width)
    codes.flags.writeable = False
    return codes
