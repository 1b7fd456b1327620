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
  (:func:`mtf_core.pipeline_schedule.stage_orders`), made inside
  ``tf.control_dependencies`` while it is lowered (:class:`_UnitOrder`).
  The graph was built in an order that keeps each stage's
  (:func:`mtf_core.pipeline_schedule.global_order`), so these edges point backwards
  in creation order and cannot make a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import ConfigError
from mtf_core.graph import Operation
from mtf_core.lowering.compiled import CompiledFunction
from mtf_core.lowering.counters import CollectiveRecord, Counters
from mtf_core.lowering.devices import logical_cpu_devices
from mtf_core.lowering.placement import LaidOutTensor, PlacementMeshImpl
from mtf_core.optimize import Optimizer
from mtf_core.pipeline import PipelinedModel, PipelinePlan, build_planned_lm
from mtf_core.pipeline_schedule import Work, stage_orders
from mtf_core.shapes import Shape, convert_to_shape


class _UnitOrder:
    """Orders each stage's units while the step is lowered.

    The lowering sets ``impl.current_op`` before lowering each op; when that
    op starts a unit that has a unit before it on its stage, a NoOp
    ``done_<unit before>`` waiting for every TF op of that unit is made, and
    the ops lowered until the next unit starts are made inside
    ``tf.control_dependencies`` on it.  The unit before is complete by then:
    the graph was built in an order every stage keeps, and the lowering
    follows it.  An op set again (a pending sum forced later is recorded
    against the op that made it, ``MeshImpl.allreduce_for``) changes
    nothing: what is made then belongs to the op being lowered, the reader
    that forced it.
    """

    def __init__(self, model: PipelinedModel) -> None:
        self.model = model
        self.before = {
            after: before
            for order in stage_orders(model.spec)
            for before, after in zip(order, order[1:])
        }
        self.reset()

    def reset(self) -> None:
        self._seen: set[Operation] = set()
        self._ranges: dict[Work, list[tuple[int, int]]] = {}
        self._unit: Work | None = None
        self._start = 0
        self._context: Any = None
        self.barriers: dict[Work, Any] = {}
        self.ordered_ops = 0  # ops made inside a unit's control dependencies

    def note(self, op: Operation | None) -> None:
        if tf.executing_eagerly() or op in self._seen:
            return
        if op is not None:
            self._seen.add(op)
        graph = tf.compat.v1.get_default_graph()
        unit = None if op is None else self.model.work.get(op)
        if unit == self._unit and unit is not None:
            return  # the same unit goes on
        self.close(graph)
        self._unit = unit
        before = None if unit is None else self.before.get(unit)
        if before is not None and before in self._ranges:
            barrier = self._barrier(graph, before)
            self._context = tf.control_dependencies([barrier])
            self._context.__enter__()
        self._start = graph.num_operations()

    def close(self, graph: Any) -> None:
        """Ends the current unit's run of ops (and its control dependencies)."""
        end = graph.num_operations()
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = None
            self.ordered_ops += end - self._start
        if self._unit is not None and end > self._start:
            self._ranges.setdefault(self._unit, []).append((self._start, end))
        self._unit = None

    def _barrier(self, graph: Any, unit: Work) -> Any:
        if unit not in self.barriers:
            ops = graph.get_operations()
            done = [o for a, b in self._ranges[unit] for o in ops[a:b]]
            name = f"done_{unit}".replace("@", "_")
            with tf.control_dependencies(None), tf.control_dependencies(done):
                self.barriers[unit] = tf.no_op(name=name)
        return self.barriers[unit]


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
        marks: _UnitOrder | None = None,
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
        self._order = _UnitOrder(model)
        per_stage = stage_devices(shape, axis, devices[: shape.size])
        self.impls = {
            m: StageMeshImpl(stage_shape, layout, per_stage[s], s, axis, self._order)
            for s, m in enumerate(model.meshes)
        }
        self.fn = _PipelinedFunction(self)

    @classmethod
    def from_plan(
        cls,
        plan: PipelinePlan,
        optimizer: Optimizer | str | None = None,
        learning_rate: float | None = None,
        devices: Sequence[str] | None = None,
    ) -> PipelinedStep:
        """The step of a scale plan (``layout_planner``'s ``ScalePlan``, or any
        :class:`~mtf_core.pipeline.PipelinePlan`): its model
        (:func:`~mtf_core.pipeline.build_planned_lm`, by default with the
        optimizer the plan was priced with) on its mesh ``pp:p;dp:d;tp:t`` under its
        stage rules.  A plan of one stage lowers as a one-stage pipeline
        (``pp:1``: micro-batches, no sends).  ``devices``: exactly the
        plan's device count (default: that many logical CPUs).

        >>> # plan = plan_transformer(cfg, 8, stages=[2], optimizer="sgd")
        >>> # step = PipelinedStep.from_plan(plan, learning_rate=0.5)
        >>> # loss = step({"inputs": ids, "targets": next_ids})
        """
        mesh = plan.choice.full_mesh
        size = convert_to_shape(mesh).size
        if size != plan.devices:
            raise ConfigError(
                f"the plan's mesh [{mesh}] has {size} devices but the plan is "
                f"for {plan.devices}; expected equal"
            )
        if devices is not None and len(devices) != plan.devices:
            raise ConfigError(
                f"{len(devices)} devices given for a plan on {plan.devices} "
                f"devices (mesh [{mesh}]); expected {plan.devices}"
            )
        model = build_planned_lm(plan, optimizer, learning_rate)
        return cls(model, mesh, plan.layout_rules, devices)

    @property
    def counters(self) -> Counters | None:
        return self.fn.counters

    def trace(self) -> float:
        return self.fn.trace()

    def __call__(self, batch: Mapping[str, np.ndarray]) -> float:
        return float(self.fn(*self.model.feeds(batch))[0])


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
        order = self._pipeline._order
        order.reset()
        try:
            return super()._run(*values)
        finally:
            order.close(tf.compat.v1.get_default_graph())
            self.ordered_ops = order.ordered_ops
