"""The scale planner's value types and the helpers its two searches share.

:class:`ScaleChoice` (one trial's mesh, pipeline and recomputation),
:class:`ScaleTrial` (what a trial cost), :class:`ScalePlan` (the chosen trial
with its stage layout and pipelined cost, and :meth:`ScalePlan.explain`) and
:class:`ScaleError`, and the helpers the search
(:mod:`layout_planner.scale_search`) and its entry points
(:mod:`layout_planner.choices`) share; keeping them here lets the two import
one way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cost_models.hardware import HardwareProfile
from cost_models.pipeline import PipelineCost
from layout_planner.errors import PlannerError
from layout_planner.plan import LayoutPlan
from mtf_core.models import TransformerConfig
from mtf_core.optimize import Optimizer
from mtf_core.pipeline import PipelinedModel, build_planned_lm


class ScaleError(PlannerError, ValueError):
    """A request the scale planner cannot plan (names the bad value)."""


@dataclass(frozen=True)
class ScaleChoice:
    """One trial: mesh sizes, pipeline and recomputation.

    ``sequence``: the size of a sequence axis ``sp`` between the data and the
    tensor axes (1: none).  Like ``dp`` and ``tp`` it is an axis of the stage
    mesh that the layout rules may split any dim over; a micro-batch is one
    sequence per data-parallel replica either way, so with ``sp`` its
    sequences are split over ``sp`` devices when the rules put ``length``
    there.  Meshes without one are written as before (``dp:8;tp:4``)."""

    stages: int
    data: int
    tensor: int
    micro_batches: int
    schedule: str
    recompute_attention: str
    recompute_ffn: str
    sequence: int = 1

    @property
    def devices(self) -> int:
        return self.stages * self.data * self.sequence * self.tensor

    @property
    def mesh_sizes(self) -> tuple[int, int, int, int]:
        """(pp, dp, sp, tp): what the trials of one mesh share."""
        return (self.stages, self.data, self.sequence, self.tensor)

    @property
    def stage_mesh(self) -> str:
        """The mesh the layout rules use (the pipeline axis is outside it)."""
        sp = f"sp:{self.sequence};" if self.sequence > 1 else ""
        return f"dp:{self.data};{sp}tp:{self.tensor}"

    @property
    def full_mesh(self) -> str:
        return f"pp:{self.stages};{self.stage_mesh}"

    def __str__(self) -> str:
        sp = f"sp={self.sequence} " if self.sequence > 1 else ""
        return (
            f"pp={self.stages} dp={self.data} {sp}tp={self.tensor} "
            f"micro_batches={self.micro_batches} ({self.schedule}) "
            f"recompute attention={self.recompute_attention} "
            f"ffn={self.recompute_ffn}"
        )


@dataclass(frozen=True)
class ScaleTrial:
    """A trial and what it cost (``None``: its stage graph could not be
    laid out, see ``note``)."""

    choice: ScaleChoice
    step_time_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    layout_rules: str
    note: str = ""


@dataclass(frozen=True)
class ScalePlan:
    """The chosen trial, its stage layout and pipelined cost."""

    config: TransformerConfig
    hardware: HardwareProfile
    devices: int
    choice: ScaleChoice
    stage_plan: LayoutPlan
    pipeline: PipelineCost
    model_flops: float
    trials: tuple[ScaleTrial, ...]
    planning_s: float
    sharded_classes: tuple[str, ...] = field(default=())
    slot_sharded_classes: tuple[str, ...] = field(default=())
    #: The optimizer the plan was priced with, and whether the model is an
    #: encoder-decoder (``plan_transformer``'s arguments).
    optimizer: str = "adam"
    encoder_decoder: bool = False

    @property
    def layout_rules(self) -> str:
        return str(self.stage_plan.layout_rules)

    @property
    def step_time_s(self) -> float:
        return self.pipeline.step_time_s

    @property
    def peak_memory_bytes(self) -> int:
        return self.pipeline.peak_memory_bytes

    @property
    def fits(self) -> bool:
        return self.pipeline.fits

    @property
    def mfu(self) -> float:
        """Model flops / (devices x peak x step time)."""
        return self.model_flops / (
            self.devices * self.hardware.peak_flops * self.step_time_s
        )

    @property
    def stage_config(self) -> TransformerConfig:
        """The config of one stage's graph as the search laid it out: its
        ``L/pp`` layers at one micro-batch, with the chosen recomputation."""
        c = self.choice
        return stage_config_for(self.config, c, self.config.num_layers // c.stages)

    @property
    def boundary_bytes(self) -> int:
        """Per device, the activation slice one micro-batch sends across a
        stage boundary (what ``pipeline.send_s`` is the shift time of)."""
        from mtf_core.comm import LayoutContext

        c = self.choice
        ctx = LayoutContext.make(c.stage_mesh, self.stage_plan.layout_rules)
        stage = self.config.replace(batch=self.config.batch // c.micro_batches)
        return ctx.slice_bytes(boundary_shape(stage), self.config.activation_dtype)

    def pipelined_model(
        self,
        optimizer: Optimizer | str | None = None,
        learning_rate: float | None = None,
    ) -> PipelinedModel:
        """The plan's training step as a pipelined graph (no TensorFlow):
        :func:`mtf_core.pipeline.build_planned_lm`.  ``optimizer``: by default
        the one the plan was priced with (``self.optimizer``).  Lower it with
        ``mtf_core.lowering.pipeline_step.PipelinedStep(model,
        plan.choice.full_mesh, plan.layout_rules)``, or the whole hand-off
        with ``PipelinedStep.from_plan(plan)``.  An encoder-decoder's plan
        (one stage) is :func:`mtf_core.pipeline.build_pipelined_encoder_decoder`."""
        return build_planned_lm(self, optimizer, learning_rate)

    def explain(self) -> str:
        """The choices, and what each saves or costs."""
        p = self.pipeline
        gib = 2**30
        lines = [
            f"{self.choice}",
            f"  mesh {self.choice.full_mesh}; stage rules: {self.layout_rules}",
            f"  dtypes: activations {self.config.activation_dtype}, master "
            f"weights and optimizer slots {self.config.master_dtype}",
            "  sharded weights (ZeRO, stored split over an axis their compute "
            "does not split): "
            + (", ".join(self.sharded_classes) if self.sharded_classes else "none"),
            "  optimizer slots only sharded (ZeRO-1, weights whole, gradient "
            "reduce-scattered, updated shard gathered once per step): "
            + (
                ", ".join(self.slot_sharded_classes)
                if self.slot_sharded_classes
                else "none"
            ),
            f"  step {p.step_time_s * 1e3:.1f} ms = ({p.spec.micro_batches} + "
            f"{p.spec.stages} - 1) x ({p.per_micro_batch_s * 1e3:.2f} ms per "
            f"micro-batch + 2 x {p.send_s * 1e6:.1f} us sends) + "
            f"{p.once_s * 1e3:.1f} ms once (gradient sync, optimizer); bubble "
            f"{p.bubble_s * 1e3:.1f} ms",
            f"  peak {p.peak_memory_bytes / gib:.1f} GiB of "
            f"{p.memory_capacity_bytes / gib:.1f} GiB per device "
            f"({p.spec.in_flight} micro-batches in flight, each other one "
            f"holding {p.held_bytes / gib:.2f} GiB); MFU {self.mfu:.1%}",
        ]
        if self.encoder_decoder:
            lines.append(
                "  encoder-decoder: one stage (a pipeline of its stages would "
                "send the encoder output to every stage's decoder layers, "
                "which is neither priced nor built)"
            )
        on_mesh: dict[tuple[int, str, str], ScaleTrial] = {}
        for t in self.trials:
            c = t.choice
            if c.mesh_sizes == self.choice.mesh_sizes:
                key = (-c.micro_batches, c.recompute_attention, c.recompute_ffn)
                if t.step_time_s is None and key in on_mesh:
                    continue  # a joint program's note: the free layout's line stays
                on_mesh[key] = t
        several = len({m for m, _, _ in on_mesh}) > 1
        for (m, a, f), t in sorted(on_mesh.items()):
            if t.step_time_s is None:
                what = t.note
            else:
                fit = "fits" if t.fits else "does not fit"
                what = (
                    f"{t.step_time_s * 1e3:.1f} ms, "
                    f"{(t.peak_memory_bytes or 0) / gib:.1f} GiB ({fit})"
                )
            mbs = f"{-m} micro-batches, " if several else ""
            lines.append(
                f"  on this mesh, {mbs}recompute attention={a} ffn={f}: {what}"
            )
        if self.trials:
            lines.append(f"  {len(self.trials)} trials in {self.planning_s:.1f} s")
        return "\n".join(lines)


def stage_config_for(
    cfg: TransformerConfig, choice: ScaleChoice, layers: int
) -> TransformerConfig:
    """``cfg``'s stage graph under ``choice``: ``layers`` layers at one
    micro-batch, with the choice's recomputation."""
    return cfg.replace(
        num_layers=layers,
        batch=cfg.batch // choice.micro_batches,
        recompute_attention=choice.recompute_attention,
        recompute_ffn=choice.recompute_ffn,
    )


def weight_sharding(layout_rules: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The weight classes ``layout_rules`` stores sharded
    (``d_model_stored_<c>`` split), and those whose optimizer slots alone are
    (``d_model_slots_<c>`` split, the class not stored sharded), each sorted."""
    named = dict(layout_rules)
    stored = sorted(
        d.removeprefix("d_model_stored_")
        for d in named
        if d.startswith("d_model_stored_")
    )
    slots = sorted(
        c
        for c in (
            d.removeprefix("d_model_slots_")
            for d in named
            if d.startswith("d_model_slots_")
        )
        if c not in stored
    )
    return tuple(stored), tuple(slots)


def boundary_shape(cfg: TransformerConfig) -> Any:
    """The activation crossing a stage boundary for one micro-batch
    (``cfg.batch``)."""
    from mtf_core.shapes import Shape

    return Shape([cfg.batch_dim, cfg.length_dim, cfg.model_dim])
