"""A lowered graph compiled into one ``tf.function`` (the placement backend's
step; :func:`mtf_core.lowering.steps.compile_function` picks the backend).

The function takes a new value for each placeholder per call, runs the graph on
the mesh and updates the per-device slice variables in place.  Variables live in
a :class:`VariableStore` made once, outside the function.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lowering import tf_private
from mtf_core.lowering.lowering import Lowering
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.step_common import CompiledStep
from mtf_core.lowering.variables import VariableStore


class CompiledFunction(CompiledStep):
    """``fn(*placeholder_values) -> [output values]``, updates applied in place.

    Attributes:
      variables: the VariableStore (export/import full values for checkpoints).
      counters: the collectives and flops recorded when the function was traced.
      concrete: the traced TF function (after :meth:`trace` or the first call).
      graph_optimization: whether TensorFlow's graph optimizer runs on it.
    """

    def __init__(
        self,
        graph: Graph,
        mesh_to_impl: Mapping[Mesh, MeshImpl],
        inputs: Sequence[Tensor] = (),
        outputs: Sequence[Tensor] = (),
        updates: Sequence[Operation] = (),
        variables: VariableStore | None = None,
        jit_compile: bool = False,
        graph_optimization: bool | None = None,
    ) -> None:
        super().__init__(graph, mesh_to_impl, inputs, outputs, updates, variables)
        if graph_optimization is None:
            graph_optimization = not _all_on_cpus(self.mesh_to_impl)
        self.graph_optimization = graph_optimization
        self._signature = [
            tf.TensorSpec(t.shape.to_integer_list(), tf.as_dtype(t.dtype))
            for t in self.inputs
        ]
        self._jit_compile = jit_compile
        self._private = True  # set by _trace (tf_private.private_road())
        self.concrete: Any = None

    def _run(self, *values: Any) -> list[Any]:
        seed = self._step.assign_add(1)
        lowering = Lowering(
            self.graph,
            self.mesh_to_impl,
            feeds=dict(zip(self.inputs, values)),
            variables=self.variables,
            targets=[*self.outputs, *self.updates],
            seed=seed,
        )
        self.counters = lowering.counters
        outs = [lowering.export_to_tf_tensor(t) for t in self.outputs]
        deps = []
        for op in self.updates:
            deps.extend(lowering.lowered_operations.get(op, []))
        if self._private:
            _assign_after_read(lowering, self.updates)
        with tf.control_dependencies(deps):
            # The step number last: it makes a function without outputs run
            # its updates too.
            return [tf.identity(o) for o in outs] + [tf.identity(seed)]

    def trace(self) -> float:
        """Traces (lowers) the function now, once; returns seconds taken."""
        import time

        t0 = time.perf_counter()
        if self.concrete is None:
            self.concrete = self._trace()
        return time.perf_counter() - t0

    def _trace(self) -> Any:
        # The road is chosen once per trace: the ordering below depends on it.
        self._private = tf_private.private_road()
        if self._jit_compile or not self._private:
            # autograph=False: _run has no tensor-dependent control flow, and
            # autograph would slow tracing and wrap mtf errors in StagingError.
            # On the public road, tf.function's automatic control dependencies
            # order each variable's read before its assignments.
            fn = tf.function(
                self._run,
                input_signature=self._signature,
                jit_compile=self._jit_compile,
                autograph=False,
            )
            return fn.get_concrete_function()
        # A v1-style function: no automatic control dependencies, whose pass
        # over every op took a third of the tracing time.  The lowering orders
        # what needs ordering itself: each slice variable is read once, its
        # assignments wait for that read and for each other
        # (_assign_after_read), and the outputs wait for every assignment.
        return tf.compat.v1.wrap_function(self._run, self._signature)

    def __call__(self, *values: Any) -> list[np.ndarray]:
        args = self.checked_inputs(values)
        self.trace()
        with _grappler(self.graph_optimization):
            outs = self.concrete(*args)
        if not tf.executing_eagerly():
            # TF1 graph mode: the outputs are graph tensors, for a session.
            return list(outs[:-1])
        return [o.numpy() for o in outs[:-1]]


def _all_on_cpus(mesh_to_impl: Mapping[Mesh, Any]) -> bool:
    devices = [
        d for impl in mesh_to_impl.values() for d in getattr(impl, "devices", [""])
    ]
    return all("cpu" in str(d).lower() for d in devices)


@contextmanager
def _grappler(enabled: bool) -> Iterator[None]:
    """Calls made inside run with TensorFlow's graph optimizer (grappler) on or
    off.  The lowered graph is already what should run: on CPU meshes grappler
    leaves the step time as it is but takes ~40% of the first call (which
    optimizes the function once per configuration, so every call must use
    the same one).  On GPUs it is left on (its layout optimizer matters for
    convolutions there)."""
    if enabled or not tf_private.private_road():
        yield
        return
    with tf_private.graph_optimizer_off():
        yield


def _assign_after_read(lowering: Lowering, updates: Sequence[Operation]) -> None:
    """Makes each assignment's op on a device wait for that device's read of
    the variable in this step (so every reader sees the value from before
    the step's update, whatever the assigned value depends on), and for the
    variable's previous assignment in ``updates`` (so several updates of one
    variable apply in the order given)."""
    last: dict[Operation, list[Any]] = {}
    for op in updates:
        var = getattr(op, "variable", None)
        assigns = [
            a if isinstance(a, tf.Operation) else getattr(a, "op", None)
            for a in lowering.lowered_operations.get(op, [])
        ]
        assigns = [a for a in assigns if isinstance(a, tf.Operation)]
        if var is None or not assigns:
            continue
        before = last.get(var)
        if before is None and var.outputs[0] in lowering.tensors:
            reads = lowering.raw_tensor(var.outputs[0]).to_laid_out_tensor().slices
            before = [r.op for r in reads]
        if before is not None:
            for prev, assign in zip(before, assigns):
                tf_private.add_control_inputs(assign, [prev])
        last[var] = assigns
