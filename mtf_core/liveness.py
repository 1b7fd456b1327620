"""The operations one step runs: what its outputs and updates depend on.

A compiled step (:func:`mtf_core.compile_function`, the Trainer) lowers only
the operations its outputs and its updates (the variables' ``Assign`` ops)
need; :func:`step_operations` is that set for a graph and its outputs, and
:func:`needed_operations` the rule itself, which the lowering applies to its
targets.  ``cost_models`` prices :func:`step_operations`, so an op nothing
reads (a recomputed block's output, a gradient no update uses) is neither
lowered nor priced.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> x = mtf.zeros(m, "a:4"); y = mtf.exp(x); z = mtf.log(x)
>>> step_operations(g, [y]) == (x.operation, y.operation)
True
>>> len(step_operations(g)) == len(g.operations)
True
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence

from mtf_core.errors import GraphError, MtfError
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.ops.variables import Assign

# graph -> {(number of ops, ids of the outputs): indices of its step's ops};
# indices, not ops: an op refers to its graph, which would never be freed.
_CACHE: weakref.WeakKeyDictionary[
    Graph, dict[tuple[int, tuple[int, ...]], tuple[int, ...]]
] = weakref.WeakKeyDictionary()
_PER_GRAPH = 8  # a graph is asked about a few output lists at most


def needed_operations(
    graph: Graph, targets: Iterable[Tensor | Operation]
) -> list[Operation]:
    """Operations the targets depend on (through inputs and control inputs),
    targets included, in graph order."""
    want: set[Operation] = set()
    stack = [t.operation if isinstance(t, Tensor) else t for t in targets]
    while stack:
        op = stack.pop()
        if op in want:
            continue
        want.add(op)
        stack.extend(i.operation for i in op.inputs)
        stack.extend(getattr(op, "control_inputs", ()))
    return [op for op in graph.operations if op in want]


def graph_updates(graph: Graph) -> list[Assign]:
    """The graph's variable updates (its ``Assign`` ops), in graph order: what
    a training step applies (``model.updates`` of the built models)."""
    return [op for op in graph.operations if isinstance(op, Assign)]


def step_targets(
    graph: Graph, outputs: Sequence[Tensor] = ()
) -> list[Tensor | Operation] | None:
    """What a step exporting ``outputs`` lowers for: the outputs and the
    graph's updates; None (everything) without outputs.  ``Lowering(graph,
    ..., targets=step_targets(graph, outputs))`` lowers exactly
    :func:`step_operations`, what ``cost_models.evaluate`` prices."""
    outputs = list(outputs)
    return [*outputs, *graph_updates(graph)] if outputs else None


def output_list(
    outputs: object,
    graph: Graph | None = None,
    *,
    name: str = "outputs",
    error: type[MtfError] = GraphError,
) -> list[Tensor]:
    """``outputs`` as a list of tensors (of ``graph``, where given); ``error``
    naming ``name`` (or the tensor) for anything else: None, a lone Tensor, a
    string, a tensor of another graph."""
    if isinstance(outputs, Tensor | str) or not isinstance(outputs, Iterable):
        raise error(f"{name} is {outputs!r}; expected a list of mtf.Tensors (or [])")
    out = list(outputs)
    for t in out:
        if not isinstance(t, Tensor) or (graph is not None and t.graph is not graph):
            raise error(
                f"output {t!r} is not a tensor of this graph; expected mtf.Tensors"
            )
    return out


def step_operations(
    graph: Graph, outputs: Sequence[Tensor] = ()
) -> tuple[Operation, ...]:
    """The operations a step of ``graph`` exporting ``outputs`` runs, in graph
    order: those the outputs and the graph's updates need.  Without outputs,
    every operation (a graph lowered whole).  Cached per graph, its number of
    operations and the outputs."""
    outputs = output_list(outputs, graph)
    if not outputs:
        return tuple(graph.operations)
    key = (len(graph.operations), tuple(id(t) for t in outputs))
    per_graph = _CACHE.setdefault(graph, {})
    ops = graph.operations
    hit = per_graph.get(key)
    if hit is None:
        want = set(needed_operations(graph, [*outputs, *graph_updates(graph)]))
        hit = tuple(i for i, op in enumerate(ops) if op in want)
        if len(per_graph) >= _PER_GRAPH:
            per_graph.pop(next(iter(per_graph)))
        per_graph[key] = hit
    return tuple(ops[i] for i in hit)
