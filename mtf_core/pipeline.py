"""Pipeline stages in the mtf graph: a Transformer LM cut into stages and
micro-batches, with its schedule.

A pipeline of ``p`` stages holds layers ``[s L/p, (s+1) L/p)`` on stage ``s``
(the token embedding on the first stage, the final norm, logits and loss on
the last); each stage is its own :class:`~mtf_core.graph.Mesh` (the devices
of one position of the pipeline axis).  The batch is cut into ``m``
micro-batches, each fed through its own placeholders.

:func:`build_pipelined_lm` builds the training step unit by unit, in an order
the schedule allows: a unit is one stage's forward or backward work for one
micro-batch.  Forward units receive the previous stage's activation by a
:class:`StageSend`; backward units differentiate their stage only
(``gradients`` of the stage's output with the received output gradient) and
send the input gradient back by another :class:`StageSend`.  Weight gradients
are accumulated over the micro-batches (a stored weight's at its gathered
read, so that it is reduce-scattered once per step, not per micro-batch) and
the optimizer runs once per step on each stage's variables, with the
stage's own step counter (its scalars never cross stages).  The last stage
seeds each micro-batch's backward with ``1/m`` and the step's loss is the
mean of the micro-batches' losses, so loss and gradients equal those of the
unpipelined step on the whole batch.

An encoder-decoder is built in micro-batches on one stage only
(:func:`build_pipelined_encoder_decoder`): across stages its encoder output
would have to reach every stage's decoder layers.

The schedules (GPipe, 1F1B) and the order units are built in are
:mod:`mtf_core.pipeline_schedule`'s.

The lowering (:mod:`mtf_core.lowering.pipeline_step`) orders each stage's
units by control dependencies and counts each send as a shift over the
pipeline axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mtf_core.autodiff import gradients
from mtf_core.comm import LayoutContext
from mtf_core.errors import ConfigError, GraphError, LoweringError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.layers.attention import attention_bias_causal
from mtf_core.liveness import step_operations
from mtf_core.models.transformer import (
    TransformerConfig,
    _attend,
    _embed,
    _feed_forward,
    _logits_and_loss,
    _storage,
    encoder_decoder_loss,
)
from mtf_core.ops import elementwise as ew
from mtf_core.ops.creation import constant, placeholder
from mtf_core.ops.elementwise import CastOp
from mtf_core.ops.stored import StoredRead, slot_sharding
from mtf_core.ops.variables import Assign, Variable
from mtf_core.optimize import STEP_NAME, Optimizer, make_optimizer
from mtf_core.pipeline_schedule import (
    PipelineConfigError,
    PipelineStages,
    Work,
    global_order,
)
from mtf_core.seams import LoweringContext
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import Shape

# --------------------------------------------------------------------------
# the stage-to-stage send
# --------------------------------------------------------------------------


class StageBackend(Protocol):
    """What a stage's mesh implementation offers :class:`StageSend`."""

    def receive_stage_send(self, laid: Any, op: Operation) -> Any: ...


class StageSend(Operation):
    """``x`` (on one stage's mesh) sent to the same slices on ``to`` (the
    next or previous stage's mesh, of the same shape and layout).  Lowered as
    one copy per device onto the receiving stage, counted as a shift over the
    pipeline axis; its gradient sends the gradient back."""

    op_type = "StageSend"

    def __init__(self, x: Tensor, to: Mesh, name: str | None = None) -> None:
        super().__init__([x], mesh=to, name=name or "stage_send")
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        (dy,) = grad_ys
        if dy is None:
            return [None]
        return [StageSend(dy, self.inputs[0].mesh).outputs[0]]

    def lower(self, lowering: LoweringContext) -> None:
        impl = lowering.mesh_impl(self)
        receive = getattr(impl, "receive_stage_send", None)
        if receive is None:
            raise LoweringError(
                f"{self.name}: a stage send lowers only on a pipeline stage's mesh "
                "implementation (mtf_core.lowering.pipeline_step.StageMeshImpl); "
                f"mesh {self.mesh.name!r} has {type(impl).__name__}"
            )
        laid = lowering.tensors[self.inputs[0]]
        lowering.set_tensor_lowering(self.outputs[0], receive(laid, self))


@register(StageSend)
def _stage_send_from_document(spec: OpSpec) -> StageSend:
    spec.expect_inputs(1)
    return StageSend(spec.inputs[0], spec.mesh, name=spec.name)


def send(x: Tensor, to: Mesh) -> Tensor:
    """``x`` sent to mesh ``to`` (see :class:`StageSend`)."""
    return StageSend(x, to).outputs[0]


# --------------------------------------------------------------------------
# the pipelined Transformer LM
# --------------------------------------------------------------------------


@dataclass
class PipelinedModel:
    """A pipelined training step.

    Attributes:
      graph, meshes: the graph and one mesh per stage.
      spec, config: the pipeline and the whole model's config.
      inputs: placeholders in call order: for each micro-batch ``j``, one
        per name of ``feed_names`` (``inputs_j``, ``targets_j``; an
        encoder-decoder's ``decoder_inputs_j`` between them), each
        ``[batch/m, length]`` int32.
      loss: the step's loss (mean of the micro-batches' losses, each the mean
        over its tokens).
      grads, variables: accumulated gradients and the trainable variables.
      updates: the optimizer's assignments (once per step).
      work: the unit each op built inside one belongs to.
      order: the units in the order they were built (:func:`global_order`).
      sends: every StageSend op.
      accumulations: the adds summing a weight's gradient over micro-batches
        (``m - 1`` per weight, in the backward units).
      feed_names: what each micro-batch is fed, in call order.
    """

    graph: Graph
    meshes: list[Mesh]
    spec: PipelineStages
    config: TransformerConfig
    inputs: list[Tensor]
    loss: Tensor
    grads: list[Tensor | None]
    variables: list[Variable]
    updates: list[Assign]
    work: dict[Operation, Work] = field(default_factory=dict)
    order: list[Work] = field(default_factory=list)
    sends: list[StageSend] = field(default_factory=list)
    accumulations: list[Operation] = field(default_factory=list)
    feed_names: tuple[str, ...] = ("inputs", "targets")

    def feeds(self, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One value per placeholder: each of ``feed_names`` in ``batch``
        (``[batch, length]``) cut into micro-batches."""
        m = self.spec.micro_batches
        out: dict[str, list[np.ndarray]] = {}
        for name in self.feed_names:
            if name not in batch:
                takes = " and ".join(repr(n) for n in self.feed_names)
                raise ConfigError(f"batch lacks {name!r}; the model takes {takes}")
            full = np.asarray(batch[name])
            if full.shape != (self.config.batch, self.config.length):
                raise ConfigError(
                    f"batch[{name!r}] has shape {list(full.shape)}; expected "
                    f"[{self.config.batch}, {self.config.length}]"
                )
            out[name] = np.split(full, m, axis=0)
        return [out[name][j] for j in range(m) for name in self.feed_names]


def held_bytes(
    model: PipelinedModel, stage: int, micro_batch: int, ctx: LayoutContext
) -> int:
    """Per device (layout ``ctx`` of the stage's mesh), the bytes micro-batch
    ``micro_batch`` holds on ``stage`` between its forward and its backward
    unit: tensors that depend on its data (its placeholders), made before its
    backward unit and read by it (by an op the step runs:
    :func:`~mtf_core.liveness.step_operations`).  Under 1F1B the first stage
    holds ``p`` micro-batches' worth at once
    (:func:`~mtf_core.pipeline_schedule.in_flight`)."""
    k = len(model.feed_names)
    mine = set(model.inputs[k * micro_batch : k * (micro_batch + 1)])
    backward = Work(stage, micro_batch, "B")
    ops = model.graph.operations
    first = next(i for i, op in enumerate(ops) if model.work.get(op) == backward)
    runs = set(step_operations(model.graph, [model.loss]))
    read: set[Tensor] = set()
    for op in ops[first:]:
        if model.work.get(op) == backward and op in runs:
            read.update(op.inputs)
    held = 0
    for op in ops[:first]:
        if any(t in mine for t in op.inputs):
            mine.update(op.outputs)
        for t in op.outputs:
            if t in mine and t in read and t.mesh is model.meshes[stage]:
                held += ctx.slice_bytes(t.shape, t.dtype)
    return held


def build_pipelined_lm(
    config: TransformerConfig,
    spec: PipelineStages,
    optimizer: Optimizer | str,
    learning_rate: float | None = None,
) -> PipelinedModel:
    """The training step of :func:`~mtf_core.models.build_lm`'s model, cut into
    ``spec.stages`` stages and ``spec.micro_batches`` micro-batches.

    The variables of ``build_lm(config)`` (names, shapes, initial values),
    and one step counter per stage after the first; one step gives the same
    loss and updates, up to float rounding.

    >>> cfg = TransformerConfig(num_layers=2, d_model=8, heads=2, d_kv=4,
    ...                         d_ff=16, vocab=32, length=4, batch=4)
    >>> model = build_pipelined_lm(cfg, PipelineStages(2, 2, "1f1b"), "sgd")
    >>> [str(w) for w in model.order]
    ['F0@0', 'F0@1', 'F1@0', 'B0@1', 'B0@0', 'F1@1', 'B1@1', 'B1@0']

    (``tests/test_scale_pipeline_lowering.py`` checks this order.)
    """
    return _build_pipelined(config, spec, optimizer, learning_rate, False)


def build_pipelined_encoder_decoder(
    config: TransformerConfig,
    spec: PipelineStages,
    optimizer: Optimizer | str,
    learning_rate: float | None = None,
) -> PipelinedModel:
    """The training step of :func:`~mtf_core.models.build_encoder_decoder`'s
    model in ``spec.micro_batches`` micro-batches on one stage, their
    weight gradients accumulated and the optimizer run once (what the scale
    planner prices for an encoder-decoder).  Its micro-batches are fed
    ``inputs``, ``decoder_inputs`` and ``targets``.

    An encoder-decoder has no pipeline of several stages here: the encoder's
    output would go to the decoder layers of every stage and its gradients
    back, which neither this builder nor the planner's price has, so
    ``spec.stages`` other than 1 raises :class:`PipelineConfigError`.
    """
    if spec.stages != 1:
        raise PipelineConfigError(
            f"{spec.stages} pipeline stages for an encoder-decoder; expected 1 "
            "(its encoder output would cross stages, which is not built)"
        )
    return _build_pipelined(config, spec, optimizer, learning_rate, True)


def _build_pipelined(
    config: TransformerConfig,
    spec: PipelineStages,
    optimizer: Optimizer | str,
    learning_rate: float | None,
    encoder_decoder: bool,
) -> PipelinedModel:
    cfg = config
    spec.check(cfg.num_layers, cfg.batch)
    p, m = spec.stages, spec.micro_batches
    graph = Graph()
    meshes = [Mesh(graph, f"stage_{s}") for s in range(p)]
    mb_cfg = cfg.replace(batch=cfg.batch // m)
    opt = (
        make_optimizer(optimizer, learning_rate)
        if isinstance(optimizer, str)
        else optimizer
    )
    names = (
        ("inputs", "decoder_inputs", "targets")
        if encoder_decoder
        else ("inputs", "targets")
    )
    inputs: list[Tensor] = []
    work: dict[Operation, Work] = {}
    with _storage(cfg, graph):
        shape = Shape([mb_cfg.batch_dim, cfg.length_dim])
        feeds: list[dict[str, Tensor]] = []
        for j in range(m):
            # the ids on the first stage, the targets on the last
            feeds.append(
                {
                    n: placeholder(
                        meshes[-1 if n == "targets" else 0],
                        shape,
                        "int32",
                        name=f"{n}_{j}",
                    )
                    for n in names
                }
            )
            inputs += feeds[-1].values()
        builder = _StageBuilder(mb_cfg, cfg.num_layers, spec, meshes, feeds)
        order = global_order(spec)
        for w in order:
            first = len(graph.operations)
            builder.build(w)
            for op in graph.operations[first:]:
                work[op] = w
        variables = list(graph.trainable_variables)
        grads = builder.weight_gradients(variables)
        losses = builder.losses
        loss = (ew.add_n(losses) if len(losses) > 1 else losses[0]) * builder.inv_m
        updates = _apply_per_stage(opt, grads, variables, meshes)
    sends = [op for op in graph.operations if isinstance(op, StageSend)]
    return PipelinedModel(
        graph, meshes, spec, cfg, inputs, loss, grads, variables, updates,
        work, order, sends, builder.accumulations, names,
    )  # fmt: skip


def _apply_per_stage(
    opt: Optimizer,
    grads: Sequence[Tensor | None],
    variables: Sequence[Variable],
    meshes: Sequence[Mesh],
) -> list[Assign]:
    """The optimizer once per stage on the stage's variables, each with its
    own step counter on the stage's mesh (``global_step`` on the first,
    ``global_step_stage_<s>`` on the others): its scalars (learning rate,
    step) never cross stages."""
    updates: list[Assign] = []
    for s, mesh in enumerate(meshes):
        pairs = [(g, v) for g, v in zip(grads, variables) if v.mesh is mesh]
        if not pairs:
            continue
        updates += opt.apply_grads(
            [g for g, _ in pairs],
            [v for _, v in pairs],
            step_name=STEP_NAME if s == 0 else f"{STEP_NAME}_stage_{s}",
        )
    return updates


class _StageBuilder:
    """Builds one unit at a time; keeps what crosses units (each stage's
    input and output per micro-batch, received gradients, accumulated weight
    gradients)."""

    def __init__(
        self,
        cfg: TransformerConfig,
        num_layers: int,
        spec: PipelineStages,
        meshes: list[Mesh],
        feeds: list[dict[str, Tensor]],
    ) -> None:
        self.cfg = cfg
        self.spec = spec
        self.meshes = meshes
        #: Each micro-batch's placeholders by name.
        self.feeds = feeds
        # An encoder-decoder (one stage) runs its whole model in a unit.
        self.encoder_decoder = "decoder_inputs" in feeds[0]
        per = num_layers // spec.stages
        self.layers = [range(s * per, (s + 1) * per) for s in range(spec.stages)]
        self.inputs: dict[tuple[int, int], Tensor] = {}
        self.outputs: dict[tuple[int, int], Tensor] = {}
        self.input_grads: dict[tuple[int, int], Tensor] = {}
        self.stage_variables: dict[int, list[Variable]] = {}
        self.accumulated: dict[Variable, Tensor] = {}
        self.accumulations: list[Operation] = []
        # A stored (ZeRO) weight's gathered read, per (stage, micro-batch).
        self.reads: dict[tuple[int, int], dict[Variable, Tensor]] = {}
        self.losses: list[Tensor] = []
        # Made before any unit, shared by all: each stage's causal mask (an
        # encoder-decoder makes its own, where build_encoder_decoder does)
        # and the last stage's 1/m (the seed of each micro-batch's backward).
        self.bias = [
            attention_bias_causal(mesh, cfg.length_dim, cfg.memory_length_dim)
            for mesh in (() if self.encoder_decoder else meshes)
        ]
        self.inv_m = constant(meshes[-1], 1.0 / spec.micro_batches, (), "float32")

    def build(self, w: Work) -> None:
        if w.phase == "F":
            self._forward(w.stage, w.micro_batch)
        else:
            self._backward(w.stage, w.micro_batch)

    def _forward(self, s: int, j: int) -> None:
        cfg = self.cfg
        graph = self.meshes[s].graph
        before = len(graph.trainable_variables)
        first_op = len(graph.operations)
        fed = self.feeds[j]
        if self.encoder_decoder:  # one stage: the whole model
            _, x = encoder_decoder_loss(
                cfg, fed["inputs"], fed["decoder_inputs"], fed["targets"]
            )
            self.losses.append(x)
        else:
            x = self._lm_stage(s, j, fed)
        self.outputs[(s, j)] = x
        if j == 0:
            self.stage_variables[s] = list(graph.trainable_variables[before:])
        self.reads[(s, j)] = {
            v: op.outputs[0]
            for op in graph.operations[first_op:]
            if isinstance(op, StoredRead) and (v := _read_variable(op)) is not None
        }

    def _lm_stage(self, s: int, j: int, fed: dict[str, Tensor]) -> Tensor:
        """Stage ``s``'s layers of the LM on micro-batch ``j``: its output
        (the last stage's: the micro-batch's loss)."""
        cfg = self.cfg
        if s == 0:
            x = _embed(cfg, fed["inputs"], "token")
        else:
            x = send(self.outputs[(s - 1, j)], self.meshes[s])
            self.inputs[(s, j)] = x
        for i in self.layers[s]:
            x = _attend(cfg, x, f"layer_{i:03d}/self_attention", self.bias[s])
            x = _feed_forward(cfg, x, f"layer_{i:03d}/ffn")
        if s == self.spec.stages - 1:
            _, x = _logits_and_loss(cfg, x, fed["targets"])
            self.losses.append(x)
        return x

    def _backward(self, s: int, j: int) -> None:
        variables = self.stage_variables[s]
        # A stored weight's gradient is taken at its gathered read and
        # accumulated there (a pending sum), to be reduce-scattered once
        # per step (finish()), not once per micro-batch.
        reads = self.reads[(s, j)]
        xs: list[Tensor] = [reads.get(v, v.outputs[0]) for v in variables]
        if s > 0:
            xs.append(self.inputs[(s, j)])
        y = self.outputs[(s, j)]
        if s == self.spec.stages - 1:
            grads = gradients([y], xs, [self.inv_m])  # d(step loss)/d(loss_j)
        else:
            dy = send(self.input_grads[(s + 1, j)], self.meshes[s])
            grads = gradients([y], xs, [dy])
        for v, g in zip(variables, grads):
            if g is None:
                continue
            acc = self.accumulated.get(v)
            if acc is None:
                self.accumulated[v] = g
            else:
                self.accumulated[v] = acc + g
                self.accumulations.append(self.accumulated[v].operation)
        if s > 0:
            dx = grads[-1]
            if dx is None:
                raise GraphError(f"stage {s}'s output does not depend on its input")
            self.input_grads[(s, j)] = dx

    def weight_gradients(self, variables: Sequence[Variable]) -> list[Tensor | None]:
        """Each variable's accumulated gradient; a stored weight's goes from
        its read back to the variable now (one reduce-scatter per step), but
        one updated under slot names keeps its read's (``apply_grads``
        reduce-scatters it into the slot names, as for ``build_lm``)."""
        m = self.spec.micro_batches
        last = {
            v: read
            for s in range(self.spec.stages)
            for v, read in self.reads[(s, m - 1)].items()
        }
        out: list[Tensor | None] = []
        for v in variables:
            g = self.accumulated.get(v)
            read = last.get(v)
            slots_only = slot_sharding(v.graph, v.name) is not None
            if g is not None and read is not None and not slots_only:
                (g,) = gradients([read], [v.outputs[0]], [g])
            out.append(g)
        return out


def _read_variable(read: StoredRead) -> Variable | None:
    """The variable a stored read gathers (through its activation-dtype cast)."""
    op = read.inputs[0].operation
    if isinstance(op, CastOp):
        op = op.inputs[0].operation
    return op if isinstance(op, Variable) else None


# --------------------------------------------------------------------------
# a scale plan's pipeline
# --------------------------------------------------------------------------


class PlannedPipeline(Protocol):
    """What :func:`build_planned_lm` reads of a plan's choice (the scale
    planner's ``ScaleChoice`` has these fields)."""

    @property
    def stages(self) -> int: ...
    @property
    def micro_batches(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def recompute_attention(self) -> str: ...
    @property
    def recompute_ffn(self) -> str: ...
    @property
    def full_mesh(self) -> str: ...


class PipelinePlan(Protocol):
    """A plan for a pipelined Transformer (the scale planner's ``ScalePlan``):
    the model's config (weights stored shardable), the mesh, pipeline and
    recomputation chosen, the stage's layout rules over the mesh without the
    pipeline axis, and the device count.  An ``encoder_decoder`` plan has one
    stage."""

    @property
    def config(self) -> TransformerConfig: ...
    @property
    def choice(self) -> PlannedPipeline: ...
    @property
    def layout_rules(self) -> str: ...
    @property
    def devices(self) -> int: ...
    @property
    def encoder_decoder(self) -> bool: ...
    @property
    def optimizer(self) -> str: ...


def build_planned_lm(
    plan: PipelinePlan,
    optimizer: Optimizer | str | None = None,
    learning_rate: float | None = None,
) -> PipelinedModel:
    """:func:`build_pipelined_lm` for ``plan``: its config with the chosen
    recomputation, cut into the chosen stages, micro-batches and schedule (a
    plan of one stage is a one-stage pipeline: its ``m`` micro-batches'
    gradients accumulated, as the planner priced it); for an
    encoder-decoder's plan (one stage) :func:`build_pipelined_encoder_decoder`.
    ``optimizer``: by default the one the plan was priced with
    (``plan.optimizer``)."""
    c = plan.choice
    cfg = plan.config.replace(
        recompute_attention=c.recompute_attention, recompute_ffn=c.recompute_ffn
    )
    spec = PipelineStages(c.stages, c.micro_batches, c.schedule)
    chosen = plan.optimizer if optimizer is None else optimizer
    if plan.encoder_decoder:
        return build_pipelined_encoder_decoder(cfg, spec, chosen, learning_rate)
    return build_pipelined_lm(cfg, spec, chosen, learning_rate)
