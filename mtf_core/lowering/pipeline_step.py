"""A pipelined training step on the placement backend.

:class:`PipelinedStep` compiles a :class:`~mtf_core.pipeline.PipelinedModel`
for a mesh with a pipeline axis (e.g. ``pp:2;dp:2;tp:2``): stage ``s`` runs on
the devices at position ``s`` of that axis, as a :class:`StageMeshImpl` of the
mesh without it (``dp:2;tp:2``) and the layout rules given.

* a stage send is one ``tf.identity`` per device, placed on the receiving
  stage's device that holds the same slice, and counted as a ``shift`` over
  the pipeline axis of the slice each device sends (what
  :mod:`cost_models.pipeline` prices for a send);
* the schedule: every TF op made while lowering one unit's mtf ops (a
  stage's forward or backward on one micro-batch) waits, by a control
  dependency, for every op of the unit before it in the stage's order
  (:func:`mtf_core.pipeline.stage_orders`).  The graph was built in an order
  that keeps each stage's (:func:`mtf_core.pipeline.global_order`), so these
  edges point backwards in creation order and cannot make a cycle.  Adding
  control inputs to made ops is private TensorFlow API
  (:mod:`tf_private`); on the public road the step runs unordered (same
  values, TensorFlow's dataflow order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import ConfigError
from mtf_core.graph import Operation
from mtf_core.lowering import tf_private
from mtf_core.lowering.compiled import CompiledFunction
from mtf_core.lowering.counters import CollectiveRecord, Counters
from mtf_core.lowering.devices import logical_cpu_devices
from mtf_core.lowering.placement import LaidOutTensor, PlacementMeshImpl
from mtf_core.pipeline import PipelinedModel, Work, stage_orders
from mtf_core.shapes import Shape, convert_to_shape


class _Marks:
    """Where each mtf op's TF ops start in the graph being built: the
    lowering sets ``impl.current_op`` before lowering each op.  An op set
    again (a pending sum forced later is recorded against the op that made
    it, ``MeshImpl.allreduce_for``) starts nothing: what is made then belongs
    to the op being lowered, the reader that forced it."""

    def __init__(self) -> None:
        self.starts: list[tuple[Operation | None, int]] = []
        self._seen: set[Operation] = set()

    def reset(self) -> None:
        self.starts = []
        self._seen = set()

    def note(self, op: Operation | None) -> None:
        if tf.executing_eagerly() or op in self._seen:
            return
        if op is not None:
            self._seen.add(op)
        graph = tf.compat.v1.get_default_graph()
        self.starts.append((op, graph.num_operations()))


class StageMeshImpl(PlacementMeshImpl):
    """One pipeline stage: the placement backend on the stage's devices, and
    the receiving end of stage sends."""

    def __init__(
        self,
        shape: Any,
        layout: Any,
        devices: Sequence[Any],
        stage: int,
        axis: str,
        marks: _Marks | None = None,
    ) -> None:
        self._marks = marks
        super().__init__(shape, layout, devices)
        self.stage = stage
        self.axis = axis

    @property
    def current_op(self) -> Any:
        return self._current_op

    @current_op.setter
    def current_op(self, op: Any) -> None:
        self._current_op = op
        if self._marks is not None:
            self._marks.note(op)

    def receive_stage_send(self, laid: LaidOutTensor, op: Operation) -> LaidOutTensor:
        """Each device copies the slice the sending stage's device at the same
        mesh position holds (one shift over the pipeline axis)."""
        if self.counters is not None:
            self.counters.record_collective(
                CollectiveRecord(
                    kind="shift",
                    mesh_axes=(self.axis,),
                    bytes_per_device=laid.slice_bytes,
                    op_name=op.name,
                    op_type=op.op_type,
                )
            )
        return self.slicewise(tf.identity, laid)


def stage_devices(mesh: Shape, axis: str, devices: Sequence[str]) -> list[list[str]]:
    """The devices of each position of ``axis`` of ``mesh`` (devices in
    ``mesh``'s processor order), each list in the order of the mesh without
    ``axis``."""
    names = [d.name for d in mesh.dims]
    a = names.index(axis)
    sizes = [d.size for d in mesh.dims]
    out: list[list[str]] = [[] for _ in range(sizes[a])]
    for pnum, dev in enumerate(devices):
        coords = np.unravel_index(pnum, sizes)
        out[int(coords[a])].append(dev)
    return out


class PipelinedStep:
    """``step(batch) -> loss``: one pipelined training step, applied in place.

    >>> # model = build_pipelined_lm(cfg, PipelineStages(2, 4, "1f1b"), "sgd")
    >>> # step = PipelinedStep(model, "pp:2;dp:2;tp:2", "batch:dp;heads:tp")
    >>> # loss = step({"inputs": ids, "targets": next_ids})

    Attributes:
      fn: the compiled function (its ``counters`` after the first call or
        :meth:`trace`; ``variables``, the per-stage slice variables).
      impls: each stage's mesh implementation.
    """

    def __init__(
        self,
        model: PipelinedModel,
        mesh: Any,
        layout: Any,
        devices: Sequence[str] | None = None,
    ) -> None:
        shape = convert_to_shape(mesh)
        axis = model.spec.axis
        if axis not in shape.dimension_names:
            raise ConfigError(
                f"mesh [{shape}] has no pipeline axis {axis!r}; expected e.g. "
                f"'{axis}:{model.spec.stages};dp:2'"
            )
        size = shape.get_dim_by_name(axis).size
        if size != model.spec.stages:
            raise ConfigError(
                f"pipeline axis {axis!r} has size {size} but the model has "
                f"{model.spec.stages} stages; expected equal"
            )
        devices = (
            list(devices) if devices is not None else logical_cpu_devices(shape.size)
        )
        if len(devices) < shape.size:
            raise ConfigError(
                f"mesh [{shape}] needs {shape.size} devices, only {len(devices)} given"
            )
        stage_shape = Shape([d for d in shape.dims if d.name != axis])
        self.model = model
        self._marks = _Marks()
        per_stage = stage_devices(shape, axis, devices[: shape.size])
        self.impls = {
            m: StageMeshImpl(stage_shape, layout, per_stage[s], s, axis, self._marks)
            for s, m in enumerate(model.meshes)
        }
        self.fn = _PipelinedFunction(self)

    @property
    def counters(self) -> Counters | None:
        return self.fn.counters

    def trace(self) -> float:
        return self.fn.trace()

    def __call__(self, batch: Mapping[str, np.ndarray]) -> float:
        return float(self.fn(*self.model.feeds(batch))[0])

    def order_work(self) -> int:
        """Adds the schedule's control dependencies to the ops just lowered
        (from ``self._marks``); returns how many ops were made to wait."""
        graph = tf.compat.v1.get_default_graph()
        ops = graph.get_operations()
        starts = self._marks.starts
        unit_ops: dict[Work, list[Any]] = {}
        for k, (op, start) in enumerate(starts):
            w = None if op is None else self.model.work.get(op)
            if w is None:
                continue
            end = starts[k + 1][1] if k + 1 < len(starts) else len(ops)
            unit_ops.setdefault(w, []).extend(ops[start:end])
        self._marks.reset()
        if not tf_private.private_road():
            return 0
        waited = 0
        for order in stage_orders(self.model.spec):
            for before, after in zip(order, order[1:]):
                done = unit_ops.get(before)
                if not done:
                    continue
                name = f"done_{before}".replace("@", "_")
                with tf.control_dependencies(None), tf.control_dependencies(done):
                    barrier = tf.no_op(name=name)
                for tf_op in unit_ops.get(after, []):
                    if tf_op.inputs:
                        tf_private.add_control_inputs(tf_op, [barrier])
                        waited += 1
        return waited


class _PipelinedFunction(CompiledFunction):
    """The placement backend's compiled step, with the schedule's order."""

    def __init__(self, step: PipelinedStep) -> None:
        model = step.model
        super().__init__(
            model.graph,
            step.impls,
            inputs=model.inputs,
            outputs=[model.loss],
            updates=model.updates,
        )
        self._pipeline = step
        self.ordered_ops = 0

    def _run(self, *values: Any) -> list[Any]:
        self._pipeline._marks.reset()
        outs = super()._run(*values)
        self.ordered_ops = self._pipeline.order_work()
        return outs
