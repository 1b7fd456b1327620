"""Putting the ops a lowering creates on their devices, cheaply.

Entering ``tf.device`` costs more than creating a small op, and the placement
backend would enter it once per op per device.  While a graph is being built
(``tf.function`` tracing, or a v1 graph) :class:`DeferredPlacement` instead
notes which run of newly created ops belongs to which device and sets their
devices in one pass at the end; the shape and axis constants the fast ops make
(fast_tf.py) are shared by the ops of one device.  Executing eagerly, ops run as they are
created, so it enters ``tf.device`` as usual.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from mtf_core.errors import LoweringError
from mtf_core.lowering.fast_tf import CONST_SCOPE


class DeferredPlacement:
    """``with placement.on(device): ...`` places every op created inside."""

    def __init__(self) -> None:
        self._graph: Any = None
        self._runs: list[tuple[int, int, str]] = []
        self._consts: dict[str, dict[tuple[int, ...], Any]] = {}

    @contextmanager
    def on(self, device: str) -> Iterator[None]:
        if tf.executing_eagerly():
            with tf.device(device):
                yield
            return
        graph = tf.compat.v1.get_default_graph()
        if self._graph is not graph:
            self.flush()
            self._graph = graph
            self._consts = {}
        start = graph.num_operations()
        token = CONST_SCOPE.set((graph, self._consts.setdefault(device, {})))
        try:
            yield
        finally:
            CONST_SCOPE.reset(token)
        end = graph.num_operations()
        if end > start:
            self._runs.append((start, end, device))

    def flush(self) -> None:
        """Sets the device of every op noted so far (ops are listed in the
        order they were created)."""
        if not self._runs:
            return
        ops = self._graph.get_operations()
        for start, end, device in self._runs:
            if end > len(ops):
                raise LoweringError(
                    f"graph lists {len(ops)} ops but {end} were created: "
                    "cannot place them"
                )
            for op in ops[start:end]:
                op._set_device(device)
        self._runs = []
