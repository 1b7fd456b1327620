"""Pipeline stages on a mesh axis: a step's time and memory from one stage's.

A pipeline of ``p`` stages holds ``L/p`` consecutive layers on each position of
the pipeline axis and cuts the batch into ``m`` micro-batches.  One stage is
planned and priced as an ordinary graph (its layers, at the batch of one
micro-batch, on the mesh without the pipeline axis); this module turns that
stage's :class:`~cost_models.costs.Cost` into the pipelined step:

* :func:`split_step` cuts the stage's evaluation into the work done per
  micro-batch (forward and backward ops and their collectives) and the work
  done once per step (the optimizer's ops, the weight gradients'
  reduce-scatters and the allreduces the optimizer forces: gradients are
  accumulated over the micro-batches and synchronised once).  The two parts
  add up to ``evaluate``'s time exactly;
* :func:`pipeline_cost`:

  ``step = (m + p - 1) * (t_mb + 2 * t_send) + t_once``,
  ``bubble = (p - 1) * (t_mb + 2 * t_send)``,
  ``peak = stage peak + (k - 1) * held``,

  ``t_mb`` the per-micro-batch part, ``t_send`` one stage-to-stage send (a
  shift over the pipeline axis of the activation slice each device holds at
  a stage boundary; the backward pass sends its gradient back), ``k`` the
  micro-batches a stage holds at once (``m`` for GPipe, ``min(p, m)`` for
  1F1B), ``held`` what each of the ``k - 1`` others holds while it waits
  for its backward pass (:func:`held_bytes_per_micro_batch`).

What one in-flight micro-batch holds: the activations its forward pass made
that its backward pass reads (those alive across the forward/backward
boundary), per device, with two exclusions, each exact for a 1F1B or GPipe
schedule:

* tensors that do not depend on the micro-batch's data (a weight's cast to
  bfloat16, a stored weight's gather) are the same for every micro-batch:
  one copy, in the stage's own peak;
* the last stage's head (final norm, logits, loss) runs its backward right
  after its forward (the last stage of 1F1B has one micro-batch in flight),
  so it is in the stage's own peak but not in what the others hold.  The
  stage graph holds the embedding *and* the head (it is the worst stage), so
  ``stage peak + (k - 1) * held`` bounds both the first stage (``p``
  micro-batches in flight, no head) and the last (one, with the head).

With whole blocks recomputed a micro-batch holds only the blocks' inputs.

What this ignores: overlap of sends with compute, the first and last stages'
extra work (the stage graph is the worst stage: it holds the embedding and the
logits too), and stages whose layer counts differ (``L`` must divide evenly).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cost_models.collectives import collective_time_s, shift_time_s
from cost_models.costs import Cost
from cost_models.hardware import CostModelError, HardwareProfile
from cost_models.memory import ACTIVATION, MemoryModel
from cost_models.op_costs import LayoutSizes, op_compute
from mtf_core.comm import LayoutContext
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.ops.creation import Constant
from mtf_core.ops.variables import Variable
from mtf_core.shapes import Shape

SCHEDULES = ("gpipe", "1f1b")


class PipelineError(CostModelError):
    """A pipeline that cannot be built as asked (names the value)."""


@dataclass(frozen=True)
class PipelineSpec:
    """``stages`` on one mesh axis, ``micro_batches`` per step, a schedule."""

    stages: int
    micro_batches: int
    schedule: str = "1f1b"

    def __post_init__(self) -> None:
        for f in ("stages", "micro_batches"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PipelineError(f"pipeline {f} must be an integer >= 1, got {v!r}")
        if self.schedule not in SCHEDULES:
            raise PipelineError(
                f"pipeline schedule {self.schedule!r} is unknown; expected one of "
                f"{list(SCHEDULES)}"
            )

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations a stage holds at once."""
        if self.schedule == "gpipe":
            return self.micro_batches
        return min(self.stages, self.micro_batches)

    @property
    def sends(self) -> int:
        """Stage-to-stage sends one step makes: each micro-batch's boundary
        activation forward and its gradient back, over each of the ``p - 1``
        boundaries; each a shift of the boundary slice over the pipeline axis
        (the step's time has two per slot on its critical path)."""
        return 2 * self.micro_batches * (self.stages - 1)

    def check(self, num_layers: int, batch: int) -> None:
        """Raises if ``num_layers`` layers or a batch of ``batch`` cannot be cut
        this way."""
        if self.stages > num_layers:
            raise PipelineError(
                f"{self.stages} pipeline stages for {num_layers} "
                f"layer{'s' * (num_layers != 1)}; expected "
                "at most one stage per layer"
            )
        if num_layers % self.stages:
            raise PipelineError(
                f"{self.stages} pipeline stages do not divide {num_layers} layers"
            )
        if batch % self.micro_batches:
            raise PipelineError(
                f"{self.micro_batches} micro-batches do not divide the batch of {batch}"
            )


@dataclass(frozen=True)
class StepSplit:
    """A stage's evaluated step cut into per-micro-batch and once-per-step
    seconds (``per_batch_s + once_s == cost.time_s`` up to rounding)."""

    per_batch_s: float
    once_s: float


def split_step(
    graph: Graph,
    cost: Cost,
    ctx: LayoutContext,
    hw: HardwareProfile,
    first_update: int,
    op_seconds: Mapping[Operation, float] | None = None,
) -> StepSplit:
    """Cuts ``cost`` (``evaluate`` of ``graph`` under ``ctx``) at op index
    ``first_update``: ops from there on are the optimizer's (once per step), and
    so are the collectives they issue or force and every reduce-scatter (a
    stored weight's gradient).  ``op_seconds``: the ops' compute seconds that
    ``evaluate`` gave (its ``op_seconds``); ops not in it are priced here."""
    ops = graph.operations
    once_ops = {op.name for op in ops[first_update:]}
    sizes = LayoutSizes(ctx)
    known = {} if op_seconds is None else op_seconds
    once_compute = sum(
        known[op] if op in known else op_compute(op, ctx, hw, sizes)[1]
        for op in ops[first_update:]
    )
    scatter_ops = {op.name for op in ops if op.op_type == "ReduceScatter"}
    once_comm = 0.0
    for spec, name in zip(cost.collectives, cost.collective_ops):
        if name in once_ops or name in scatter_ops:
            once_comm += collective_time_s(spec, ctx.mesh_shape, hw)
    once = once_compute + once_comm
    return StepSplit(cost.time_s - once, once)


def data_dependent(graph: Graph) -> set[Tensor]:
    """Tensors of ``graph`` that depend on a micro-batch: downstream of an op
    with no inputs that is neither a variable nor a constant (placeholders,
    random draws)."""
    out: set[Tensor] = set()
    for op in graph.operations:
        if op.inputs:
            if any(t in out for t in op.inputs):
                out.update(op.outputs)
        elif not isinstance(op, (Variable, Constant)):
            out.update(op.outputs)
    return out


def held_bytes_per_micro_batch(
    graph: Graph,
    memory: MemoryModel,
    ctx: LayoutContext,
    first_backward: int,
    head_start: int | None = None,
) -> int:
    """Per device, the bytes one micro-batch holds between its forward and
    its backward pass (see the module docstring).

    ``memory``: the memory model of ``graph`` (one micro-batch); ops from
    index ``first_backward`` on are the backward pass (and the optimizer);
    ops from ``head_start`` (default: ``first_backward``) to there are the
    last stage's head, which no other micro-batch waits in.  Counted: the
    activation buffers made before ``head_start`` that depend on the
    micro-batch's data and that an op at ``first_backward`` or later reads.
    """
    n = len(graph.operations)
    if not 0 <= first_backward <= n:
        raise PipelineError(
            f"first backward op index {first_backward} is outside the graph's {n} ops"
        )
    head = first_backward if head_start is None else head_start
    if not 0 <= head <= first_backward:
        raise PipelineError(
            f"head start {head_start} must be between 0 and the first backward "
            f"op index {first_backward}"
        )
    return HeldBytes(graph, memory, first_backward, head)(ctx)


class HeldBytes:
    """:func:`held_bytes_per_micro_batch` of one graph under any layout: the
    held buffers are picked once, and each layout sizes only their distinct
    (shape, dtype) classes."""

    def __init__(
        self, graph: Graph, memory: MemoryModel, first_backward: int, head_start: int
    ) -> None:
        per_micro_batch = data_dependent(graph)
        mask = [
            kind == ACTIVATION
            and first < head_start
            and last >= first_backward
            and t in per_micro_batch
            for t, kind, first, last in zip(
                memory.buffers, memory.kinds, memory.start, memory.end
            )
        ]
        self.counts = memory.counts_by_class(mask)

    @classmethod
    def of_counts(cls, counts: Mapping[tuple[Shape, str], int]) -> HeldBytes:
        """The held buffers counted per (shape, dtype) as ``counts`` (those
        of a graph not built, e.g. derived from another graph's)."""
        out = cls.__new__(cls)
        out.counts = dict(counts)
        return out

    def __call__(self, ctx: LayoutContext) -> int:
        """Per device, the bytes one micro-batch holds under ``ctx``."""
        return MemoryModel.selected_bytes_per_device(self.counts, ctx)


@dataclass(frozen=True)
class PipelineCost:
    """A pipelined step: its time, the bubble, the sends, memory per device."""

    spec: PipelineSpec
    step_time_s: float
    per_micro_batch_s: float
    send_s: float
    bubble_s: float
    once_s: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    held_bytes: int = 0  # per other micro-batch in flight

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes


def send_time_s(
    boundary_bytes: int,
    send_link_axis: Sequence[str],
    mesh_shape: object,
    hw: HardwareProfile,
) -> float:
    """One stage-to-stage send of ``boundary_bytes`` per device: a shift
    over the pipeline axis ``send_link_axis`` of ``mesh_shape``."""
    link = hw.slowest_link(tuple(send_link_axis), mesh_shape)
    return shift_time_s(boundary_bytes, link)


def pipeline_cost(
    spec: PipelineSpec,
    split: StepSplit,
    stage_peak_bytes: int,
    held_bytes: int,
    capacity_bytes: int,
    boundary_bytes: int,
    send_link_axis: Sequence[str],
    mesh_shape: object,
    hw: HardwareProfile,
) -> PipelineCost:
    """The pipelined step from one stage's split step, evaluated for one
    micro-batch (peak ``stage_peak_bytes``); each other micro-batch in flight
    holds ``held_bytes`` (:func:`held_bytes_per_micro_batch`).

    ``boundary_bytes``: per device, the activation slice crossing a stage
    boundary for one micro-batch; it goes over the pipeline axis
    ``send_link_axis`` of ``mesh_shape`` (the full mesh) as a shift.
    """
    k = spec.in_flight
    t_mb = split.per_batch_s
    t_send = (
        send_time_s(boundary_bytes, send_link_axis, mesh_shape, hw)
        if spec.stages > 1
        else 0.0
    )
    per = t_mb + 2 * t_send
    steps = spec.micro_batches + spec.stages - 1
    return PipelineCost(
        spec=spec,
        step_time_s=steps * per + split.once_s,
        per_micro_batch_s=t_mb,
        send_s=t_send,
        bubble_s=(spec.stages - 1) * per,
        once_s=split.once_s,
        peak_memory_bytes=int(stage_peak_bytes + (k - 1) * held_bytes),
        memory_capacity_bytes=int(capacity_bytes),
        held_bytes=int(held_bytes),
    )
