"""A training step on the SPMD backend: one per-replica program, traced once.

Two ``tf.function`` levels, with no ``tf.distribute``:

* the **replica program** takes this device's pnum, its collective ordering
  token, a seed and the full placeholder values; it lowers the whole mtf graph
  once (every laid-out tensor is one tensor), opens the running device's
  variable slices by name (:mod:`spmd_variables`) and returns the exported
  outputs;
* the **launcher** calls that one concrete function once per local device,
  under ``tf.device``, passing each device its own pnum and token.

Tracing cost is one lowering whatever the number of devices; the launcher adds
one small call node per device.  In a multi-process mesh every process compiles the
same step and launches it on its own devices; the collectives inside couple
them, so every process must call the step the same number of times, with the
same placeholder values.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import LoweringError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lowering import spmd_collectives as coll
from mtf_core.lowering.counters import Counters
from mtf_core.lowering.lowering import Lowering
from mtf_core.lowering.spmd import SimdMeshImpl
from mtf_core.lowering.step_common import CompiledStep
from mtf_core.lowering.variables import VariableStore


class SpmdCompiledFunction(CompiledStep):
    """``fn(*placeholder_values) -> [output values]``, updates applied in place.

    The same interface as :class:`mtf_core.lowering.compiled.CompiledFunction`.

    Attributes:
      variables: the VariableStore (this process's slices of every variable).
      counters: collectives and flops recorded when the replica program was
        traced (once: the same program runs on every device).
      replica_graph_nodes, launcher_graph_nodes: sizes of the two traced
        graphs (set by :meth:`trace`).
      replica_trace_seconds: of :meth:`trace`'s time, lowering the program.
    """

    def __init__(
        self,
        graph: Graph,
        mesh_to_impl: Mapping[Mesh, Any],
        inputs: Sequence[Tensor] = (),
        outputs: Sequence[Tensor] = (),
        updates: Sequence[Operation] = (),
        variables: VariableStore | None = None,
    ) -> None:
        impls = list(dict(mesh_to_impl).values())
        if len(impls) != 1 or not isinstance(impls[0], SimdMeshImpl):
            raise LoweringError(
                "an SPMD step runs one mesh on one SimdMeshImpl; got "
                f"{[type(i).__name__ for i in impls]} for meshes "
                f"{[m.name for m in mesh_to_impl]}"
            )
        self.impl: SimdMeshImpl = impls[0]
        super().__init__(graph, mesh_to_impl, inputs, outputs, updates, variables)
        # Made now: variables made while tracing make tf.function trace twice.
        self._tokens = {p: self.impl.ordering_token(p) for p in self.impl.local_pnums}
        self._input_specs = [
            tf.TensorSpec(t.shape.to_integer_list(), tf.as_dtype(t.dtype))
            for t in self.inputs
        ]
        self._replica_fn: Any = None
        self._launcher = tf.function(
            self._launch, input_signature=self._input_specs, autograph=False
        )
        self.concrete: Any = None
        self.replica_graph_nodes = 0
        self.launcher_graph_nodes = 0
        self.replica_trace_seconds = 0.0

    # -- the replica program ------------------------------------------------
    def _replica_program(self, pnum: Any, token: Any, seed: Any, *values: Any) -> Any:
        with self.impl.replica(pnum, token):
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
        with tf.control_dependencies(deps):
            return [tf.identity(o) for o in outs]

    def _trace_replica(self) -> Any:
        if self._replica_fn is None:
            specs = [
                tf.TensorSpec([], tf.int32),
                tf.TensorSpec([], tf.resource),
                tf.TensorSpec([], tf.int64),
            ]
            t0 = time.perf_counter()
            # Not inlined: each device instantiates the program once, on itself
            # (ops default to the calling device), instead of TensorFlow
            # inlining N copies into the launcher and optimizing them as one
            # graph (about 3x slower first step at 64 devices, measured).
            self._replica_fn = tf.function(
                self._replica_program,
                autograph=False,
                experimental_attributes={"_noinline": True},
            ).get_concrete_function(*specs, *self._input_specs)
            self.replica_trace_seconds = time.perf_counter() - t0
            self.replica_graph_nodes = len(self._replica_fn.graph.as_graph_def().node)
        return self._replica_fn

    # -- the launcher -----------------------------------------------------------
    def _launch(self, *values: Any) -> list[Any]:
        program = self._trace_replica()
        seed = self._step.assign_add(1)
        impl = self.impl
        first = None
        for p in impl.local_pnums:
            with tf.device(impl.devices[p]):
                pnum = tf.constant(p, tf.int32)
                outs = program(pnum, self._tokens[p], seed, *values)
            if first is None:
                first = outs
        # Every device holds the outputs; return this process's first copy.
        return list(first or [])

    def trace(self) -> float:
        """Traces (lowers) the step now; returns seconds taken."""
        t0 = time.perf_counter()
        self.concrete = self._launcher.get_concrete_function()
        seconds = time.perf_counter() - t0
        self.launcher_graph_nodes = len(self.concrete.graph.as_graph_def().node)
        return seconds

    def sent_collectives(self) -> list[coll.SentCollective]:
        """The collective ops of the replica program (traced now if it was not
        yet), with the dtype and bytes each device puts in: what the counters
        say is sent, as TensorFlow will send it."""
        return coll.sent_collectives(self._trace_replica().graph)

    def __call__(self, *values: Any) -> list[np.ndarray]:
        outs = self._launcher(*self.checked_inputs(values))
        return [o.numpy() for o in outs]


@dataclass(frozen=True)
class TracedLowering:
    """A lowering traced into one replica program and not run."""

    counters: Counters
    sent: list[coll.SentCollective]


def trace_lowering(
    graph: Graph,
    mesh_to_impl: Mapping[Mesh, Any],
    inputs: Sequence[Tensor] = (),
    targets: Sequence[Tensor | Operation] | None = None,
) -> TracedLowering:
    """Lowers ``graph`` on an SPMD mesh into one replica program, traced but
    not run: every op (as ``Lowering(graph, ...)`` takes it) or only what
    ``targets`` need (as a compiled step does; with
    ``mtf_core.liveness.step_targets(graph, outputs)``, what
    ``cost_models.evaluate(..., outputs)`` prices).  Returns
    the counters it recorded and the collectives its program sends.
    ``inputs`` are the placeholders (fed symbolically).
    """
    impls = list(dict(mesh_to_impl).values())
    if len(impls) != 1 or not isinstance(impls[0], SimdMeshImpl):
        raise LoweringError(
            "trace_lowering lowers one mesh on one SimdMeshImpl; got "
            f"{[type(i).__name__ for i in impls]}"
        )
    impl = impls[0]
    variables = VariableStore(graph, mesh_to_impl)
    specs = [
        tf.TensorSpec(t.shape.to_integer_list(), tf.as_dtype(t.dtype)) for t in inputs
    ]
    found: list[Counters] = []

    def program(pnum: Any, token: Any, *values: Any) -> Any:
        with impl.replica(pnum, token):
            lowering = Lowering(
                graph,
                mesh_to_impl,
                feeds=dict(zip(inputs, values)),
                variables=variables,
                targets=targets,
            )
        found.append(lowering.counters)
        return tf.constant(0)

    traced = tf.function(program, autograph=False).get_concrete_function(
        tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.resource), *specs
    )
    return TracedLowering(found[-1], coll.sent_collectives(traced.graph))
