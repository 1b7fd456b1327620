"""Putting the ops a lowering creates on their devices, cheaply.

Entering ``tf.device`` costs more than creating a small op, and the placement
backend would enter it once per op per device.  While a graph is being built
(``tf.function`` tracing, or a v1 graph) :class:`DeferredPlacement` instead
notes which run of newly created ops belongs to which device and sets their
devices in one pass at the end; the shape and axis constants the fast ops
make (fast_tf.py) are shared by the ops of one device.  Executing eagerly, ops
run as they are created, so it enters ``tf.device`` as usual; so does the
public road (:mod:`tf_private`), since setting a made op's device is private.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

from mtf_core.errors import LoweringError
from mtf_core.lowering import tf_private
from mtf_core.lowering.fast_tf import CONST_SCOPE


class DeferredPlacement:
    """``with placement.on(device): ...`` places every op created inside.

    The device merges with what an enclosing ``tf.device`` scope gave the op,
    as ``tf.device`` would (``"/gpu:1"`` inside ``"/job:worker/task:1"`` is
    ``/job:worker/task:1/device:GPU:1``); ``""`` places nothing.  An inner
    ``on`` wins over an outer one.
    """

    def __init__(self) -> None:
        self._graph: Any = None
        self._runs: list[list[Any]] = []  # [start, end, device], by start
        self._consts: dict[str, dict[tuple[int, ...], Any]] = {}
        self._merged: dict[tuple[str, str], str] = {}

    @contextmanager
    def on(self, device: str) -> Iterator[None]:
        if tf.executing_eagerly() or not device or not tf_private.private_road():
            with tf.device(device):
                yield
            return
        graph = tf.compat.v1.get_default_graph()
        if self._graph is not graph:
            self.flush()
            self._graph = graph
        run = [graph.num_operations(), None, device]
        self._runs.append(run)
        # Shape constants are shared only where nothing else can attach to
        # them: no control dependencies or control-flow context around.
        shareable = tf_private.may_share_constants(graph)
        consts = self._consts.setdefault(device, {}) if shareable else None
        token = CONST_SCOPE.set(None if consts is None else (graph, consts))
        try:
            yield
        finally:
            CONST_SCOPE.reset(token)
            run[1] = graph.num_operations()

    def flush(self) -> None:
        """Sets the device of every op noted so far (ops are listed in the
        order they were created) and forgets the shared constants."""
        self._consts = {}
        if not self._runs:
            return
        runs, self._runs = self._runs, []
        ops = self._graph.get_operations()
        for run in runs:
            start, end, device = run
            stop = len(ops) if end is None else end
            if stop > len(ops):
                raise LoweringError(
                    f"graph lists {len(ops)} ops but {stop} were created: "
                    "cannot place them"
                )
            for op in ops[start:stop]:
                tf_private.set_device(op, self._merge(op.device, device))
            if end is None:  # still open (flushed from inside on()): the rest later
                run[0] = stop
                self._runs.append(run)

    def _merge(self, outer: str, device: str) -> str:
        if not outer:
            return device
        key = (outer, device)
        merged = self._merged.get(key)
        if merged is None:
            spec = tf.DeviceSpec.from_string(outer)
            merged = spec.make_merged_spec(tf.DeviceSpec.from_string(device))
            merged = self._merged[key] = merged.to_string()
        return merged
