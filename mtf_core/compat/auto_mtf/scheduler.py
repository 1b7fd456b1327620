"""``mesh_tensorflow.auto_mtf.scheduler``: an order of a graph's operations
with a low peak of live tensor bytes.

``LIST`` is a greedy list scheduler: of the operations whose inputs are all
computed, run the one that frees the most bytes now (inputs it is the last
reader of, unless final, minus outputs that someone reads or that are final);
ties go to the smaller operation name.  ``NAIVE`` is graph order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from mtf_core.compat.auto_mtf.graph_interface import GraphInterface
from mtf_core.errors import ArgumentError


def minimize_peak_memory(graph: GraphInterface, scheduler_alg: str) -> Iterable[int]:
    """Operation indices in the order to run them."""
    if scheduler_alg == "NAIVE":
        return range(graph.get_num_operations())
    if scheduler_alg == "LIST":
        return _list_schedule(graph)
    raise ArgumentError(
        f"scheduler {scheduler_alg!r} is unknown; expected 'NAIVE' or 'LIST'"
    )


def _list_schedule(graph: GraphInterface) -> list[int]:
    names = list(graph.get_all_operation_names())
    inputs = {n: list(dict.fromkeys(graph.get_operation_input_names(n))) for n in names}
    outputs = {n: list(graph.get_operation_output_names(n)) for n in names}
    readers: dict[str, set[str]] = defaultdict(set)  # tensor -> ops still to run
    for n in names:
        for t in inputs[n]:
            readers[t].add(n)
    produced: set[str] = set()
    done: list[int] = []
    index = {n: i for i, n in enumerate(names)}
    pending = set(names)

    def freed(n: str) -> int:
        gain = sum(
            graph.get_tensor_size(t)
            for t in inputs[n]
            if readers[t] == {n} and not graph.is_tensor_final(t)
        )
        cost = sum(
            graph.get_tensor_size(t)
            for t in outputs[n]
            if readers[t] or graph.is_tensor_final(t)
        )
        return gain - cost

    while pending:
        ready = [n for n in pending if all(t in produced for t in inputs[n])]
        if not ready:
            raise ArgumentError("the graph has a cycle; no operation can run")
        best = min(ready, key=lambda n: (-freed(n), n))
        pending.remove(best)
        done.append(index[best])
        produced.update(outputs[best])
        for t in inputs[best]:
            readers[t].discard(best)
    return done
