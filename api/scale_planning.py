"""Scale-plan requests -> checked specs; a :class:`ScalePlan` -> JSON.

The service's adapter over :func:`layout_planner.choices.plan_transformer`:

* :func:`scale_spec` checks a :class:`~api.scale_schemas.ScalePlanRequest`
  in the server process (cheap checks only: names, dtypes the hardware lacks,
  stages against layers and devices, micro-batches against the batch), so a
  bad request is a 422 naming the value before a worker is asked, and hashes
  its canonical form (the store caches scale plans under it);
* :func:`solve_scale_task` runs in a solve worker (:mod:`api.worker_main`):
  it plans, prices the recomputation options the search skipped on the chosen
  mesh (:func:`layout_planner.choices.price_layout`), and returns
  :func:`scale_plan_dict`.

What a sharded weight class saves is priced here (:func:`weight_classes`,
``cost_models.evaluate`` on the chosen stage graph): the stage's step for one
micro-batch and its peak with that storage name kept whole (or split),
everything else unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from api.learned import BASE, REFITTED, ProfileUsed
from api.planning import Learned, RequestError, choose_profile
from api.scale_schemas import ScalePlanRequest
from api.settings import Settings
from api.store.base import PlanRecord
from cost_models.costs import evaluate
from cost_models.hardware import PRESETS, Calibration, HardwareProfile
from cost_models.pipeline import PipelineError, PipelineSpec
from layout_planner.choices import (
    RECOMPUTE_TRIALS,
    ScaleChoice,
    ScalePlan,
    check_request,
    plan_transformer,
    price_layout,
    sequence_sizes,
)
from mtf_core.errors import MtfError
from mtf_core.layout import convert_to_layout_rules
from mtf_core.models import TransformerConfig, build_encoder_decoder, build_lm
from mtf_core.models.base import ModelGraph
from mtf_core.optimize import make_optimizer
from mtf_core.shapes import convert_to_shape

#: Bump when the answer for the same request changes (a new cost model or JSON).
SCALE_CACHE_VERSION = 1

#: Storage-name prefixes of the weight classes, and what sharding one means.
_KINDS = (
    ("d_model_stored_", "weights, masters and optimizer slots (ZeRO-3 / FSDP)"),
    ("d_model_slots_", "optimizer slots and update only (ZeRO-1)"),
)

Report = Callable[[str, float], None]


@dataclass(frozen=True)
class ScaleSpec:
    """A checked scale-plan request (plain data: it travels to a worker)."""

    config: dict[str, Any]  # TransformerConfig fields
    encoder_decoder: bool
    devices: int
    hardware: str
    optimizer: str
    stages: tuple[int, ...] | None
    tensor: tuple[int, ...] | None
    micro_batches: int | None
    schedule: str
    recompute: tuple[tuple[str, str], ...]
    memory_limit_bytes: int | None
    time_limit_s: float
    backend: str = "placement"
    use_measurements: bool = True
    #: the preset's calibration refitted from measurements (None: the base)
    calibration: dict[str, Any] | None = None
    measurements: int = 0
    #: sequence-axis sizes to try ((1,): none)
    sequence: tuple[int, ...] = (1,)

    #: What a job of this spec makes (``JobOut.kind``).
    kind = "scale"

    def canonical(self) -> dict[str, Any]:
        out = self._answer_fields()
        out["backend"] = self.backend
        out["use_measurements"] = self.use_measurements
        return out

    def _answer_fields(self) -> dict[str, Any]:
        """The fields the plan depends on (the hash's); the refit only when
        there is one, so base-profile requests keep the hashes they had."""
        out = {
            "config": dict(sorted(self.config.items())),
            "encoder_decoder": self.encoder_decoder,
            "devices": self.devices,
            "hardware": self.hardware,
            "optimizer": self.optimizer,
            "stages": None if self.stages is None else list(self.stages),
            "tensor": None if self.tensor is None else list(self.tensor),
            "micro_batches": self.micro_batches,
            "schedule": self.schedule,
            "recompute": [list(r) for r in self.recompute],
            "memory_limit_bytes": self.memory_limit_bytes,
            "time_limit_s": self.time_limit_s,
        }
        if self.calibration is not None:
            out["calibration"] = self.calibration
            out["measurements"] = self.measurements
        if self.sequence != (1,):  # requests without one keep their hashes
            out["sequence"] = list(self.sequence)
        return out

    @property
    def request_hash(self) -> str:
        key = {"scale_cache_version": SCALE_CACHE_VERSION, **self._answer_fields()}
        text = json.dumps(key, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def profile(self) -> ProfileUsed:
        """Which hardware profile the plan is made with."""
        if self.calibration is None:
            return ProfileUsed(
                self.hardware, self.backend, BASE, 0, self.use_measurements
            )
        return ProfileUsed(
            self.hardware, self.backend, REFITTED, self.measurements, True
        )

    def describe(self) -> dict[str, Any]:
        """The request in brief, for its job row and the job's page."""
        cfg = self.config
        return {
            "kind": self.kind,
            "model": model_name(self.encoder_decoder, cfg),
            "devices": self.devices,
            "hardware": self.hardware,
            "stages": None if self.stages is None else list(self.stages),
            "tensor": None if self.tensor is None else list(self.tensor),
            **({} if self.sequence == (1,) else {"sequence": list(self.sequence)}),
            "time_limit_s": self.time_limit_s,
            "memory_limit_bytes": self.memory_limit_bytes,
            "profile": self.profile.to_dict(),
        }

    def task(self, solver_threads: int = 1) -> dict[str, Any]:
        """What a solve worker needs (``api.worker_main.solve_task``); the
        scale search runs one CP-SAT thread per trial whatever
        ``solver_threads`` says."""
        return {"kind": "scale", "spec": self.canonical()}

    @classmethod
    def from_canonical(cls, d: Mapping[str, Any]) -> ScaleSpec:
        return cls(
            config=dict(d["config"]),
            encoder_decoder=bool(d["encoder_decoder"]),
            devices=int(d["devices"]),
            hardware=str(d["hardware"]),
            optimizer=str(d["optimizer"]),
            stages=None if d["stages"] is None else tuple(d["stages"]),
            tensor=None if d["tensor"] is None else tuple(d["tensor"]),
            micro_batches=d["micro_batches"],
            schedule=str(d["schedule"]),
            recompute=tuple((str(a), str(f)) for a, f in d["recompute"]),
            memory_limit_bytes=d["memory_limit_bytes"],
            time_limit_s=float(d["time_limit_s"]),
            backend=str(d.get("backend", "placement")),
            use_measurements=bool(d.get("use_measurements", True)),
            calibration=d.get("calibration"),
            measurements=int(d.get("measurements", 0)),
            sequence=tuple(int(s) for s in d.get("sequence", (1,))),
        )

    def transformer_config(self) -> TransformerConfig:
        return TransformerConfig(**self.config)

    def hardware_profile(self) -> HardwareProfile:
        hw = PRESETS[self.hardware]
        if self.calibration is not None:
            hw = dataclasses.replace(
                hw, calibration=Calibration.from_dict(self.calibration)
            )
        if self.memory_limit_bytes is not None:
            hw = hw.with_memory(self.memory_limit_bytes)
        return hw


def _named(error: MtfError) -> RequestError:
    return RequestError(str(error))


def scale_spec(
    req: ScalePlanRequest, settings: Settings, learned: Learned | None = None
) -> ScaleSpec:
    """Checks ``req`` (RequestError naming the bad value) and canonicalizes it.
    The preset is refitted from its measurements on ``req.backend``
    (``learned``) unless ``req.use_measurements`` is false."""
    if req.hardware not in PRESETS:
        raise RequestError(
            f"unknown hardware {req.hardware!r}; expected one of {sorted(PRESETS)}"
        )
    if req.time_limit_s > settings.max_time_limit_s:
        raise RequestError(
            f"time_limit_s is {req.time_limit_s!r}; this service allows at most "
            f"{settings.max_time_limit_s:g} s"
        )
    m = req.model
    fields: dict[str, Any] = {
        "num_layers": m.num_layers,
        "d_model": m.d_model,
        "heads": m.heads,
        "d_kv": m.d_kv,
        "d_ff": m.d_ff,
        "vocab": m.vocab,
        "length": m.length,
        "batch": m.batch,
        "experts": m.experts,
        "activation_dtype": req.activation_dtype,
        "master_dtype": req.master_dtype,
    }
    try:
        cfg = TransformerConfig(**fields)
        hw = PRESETS[req.hardware]
        check_request(cfg, hw, req.devices)
        make_optimizer(req.optimizer)
        PipelineSpec(1, 1, req.schedule)
        recompute = (
            RECOMPUTE_TRIALS
            if req.recompute is None
            else tuple((r.attention, r.ffn) for r in req.recompute)
        )
        for attention, ffn in recompute:
            cfg.replace(recompute_attention=attention, recompute_ffn=ffn)
        layers, batch = cfg.num_layers, cfg.batch
        if req.micro_batches is not None:
            PipelineSpec(1, req.micro_batches, req.schedule).check(layers, batch)
        for s in req.stages or ():
            PipelineSpec(s, req.micro_batches or 1, req.schedule).check(layers, batch)
            if req.devices % s:
                raise PipelineError(
                    f"{s} pipeline stages do not divide {req.devices} devices"
                )
        for t in req.tensor or ():
            if req.devices % t:
                raise RequestError(
                    f"tensor axis size {t} does not divide {req.devices} devices"
                )
        sequence = tuple(sequence_sizes(req.sequence or (1,), cfg.length, req.devices))
    except MtfError as e:
        raise _named(e) from None
    if req.memory_limit_bytes is not None and req.memory_limit_bytes > hw.memory_bytes:
        raise RequestError(
            f"memory_limit_bytes is {req.memory_limit_bytes}; hardware "
            f"{hw.name!r} has {hw.memory_bytes} bytes per device"
        )
    # The config as canonical fields (dtype names normalized by the config).
    canonical = {
        **fields,
        "activation_dtype": cfg.activation_dtype,
        "master_dtype": cfg.master_dtype,
    }
    fitted, used = choose_profile(
        req.hardware, req.backend, req.use_measurements, learned
    )
    return ScaleSpec(
        config=canonical,
        encoder_decoder=m.encoder_decoder,
        devices=req.devices,
        hardware=req.hardware,
        optimizer=req.optimizer.lower(),
        stages=None if req.stages is None else tuple(sorted(set(req.stages))),
        tensor=None if req.tensor is None else tuple(sorted(set(req.tensor))),
        micro_batches=req.micro_batches,
        schedule=req.schedule,
        recompute=tuple(recompute),
        memory_limit_bytes=req.memory_limit_bytes,
        time_limit_s=float(req.time_limit_s),
        backend=req.backend,
        use_measurements=req.use_measurements,
        calibration=None
        if used.source != REFITTED or fitted.calibration is None
        else fitted.calibration.to_dict(),
        measurements=used.measurements if used.source == REFITTED else 0,
        sequence=sequence,
    )


def plan_spec_locally(
    spec: ScaleSpec, progress: Report | None = None, workers: int | None = 1
) -> ScalePlan:
    """``plan_transformer`` for ``spec``: what the worker runs, and what a
    test compares the service's answer with.  ``progress(phase, fraction)``
    before each mesh of the search and before the winner's check.
    ``workers``: processes for the search's two passes; 1 by default, since
    a service job runs in one solve worker beside the others, and cancelling
    it kills that process (None: as many as fork safely here)."""
    return plan_transformer(
        spec.transformer_config(),
        spec.devices,
        spec.hardware_profile(),
        optimizer=spec.optimizer,
        encoder_decoder=spec.encoder_decoder,
        stages=spec.stages,
        tensor=spec.tensor,
        micro_batches=spec.micro_batches,
        schedule=spec.schedule,
        recompute=spec.recompute,
        time_limit_s=spec.time_limit_s,
        progress=progress,
        workers=workers,
        sequence=spec.sequence,
    )


@dataclass(frozen=True)
class RecomputeCost:
    """One recomputation option on the chosen mesh and stage layout."""

    attention: str
    ffn: str
    step_time_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    source: str  # "planner trial", "priced with the chosen rules", or why not


def recompute_costs(plan: ScalePlan, spec: ScaleSpec) -> list[RecomputeCost]:
    """Every requested recomputation option on the chosen mesh: the planner's
    trial where it ran one, else the chosen stage rules priced with that
    option (``price_layout``: the same model, the same pipeline)."""
    c = plan.choice
    tried: dict[tuple[str, str], Any] = {}
    for t in plan.trials:
        tc = t.choice
        if tc.mesh_sizes == c.mesh_sizes:
            tried[(tc.recompute_attention, tc.recompute_ffn)] = t
    out = []
    for attention, ffn in spec.recompute:
        chosen = (attention, ffn) == (c.recompute_attention, c.recompute_ffn)
        trial = tried.get((attention, ffn))
        if chosen:
            out.append(
                RecomputeCost(
                    attention,
                    ffn,
                    plan.step_time_s,
                    plan.peak_memory_bytes,
                    plan.fits,
                    "chosen",
                )
            )
        elif trial is not None and trial.step_time_s is not None:
            out.append(
                RecomputeCost(
                    attention,
                    ffn,
                    trial.step_time_s,
                    trial.peak_memory_bytes,
                    trial.fits,
                    "planner trial (its own stage layout)",
                )
            )
        else:
            other = ScaleChoice(
                c.stages,
                c.data,
                c.tensor,
                c.micro_batches,
                c.schedule,
                attention,
                ffn,
                c.sequence,
            )
            try:
                priced = price_layout(
                    spec.transformer_config(),
                    other,
                    plan.layout_rules,
                    spec.hardware_profile(),
                    optimizer=spec.optimizer,
                    encoder_decoder=spec.encoder_decoder,
                )
            except MtfError as e:
                out.append(RecomputeCost(attention, ffn, None, None, False, str(e)))
                continue
            out.append(
                RecomputeCost(
                    attention,
                    ffn,
                    priced.step_time_s,
                    priced.peak_memory_bytes,
                    priced.fits,
                    "priced with the chosen stage rules",
                )
            )
    return out


def _stage_model(plan: ScalePlan, spec: ScaleSpec) -> ModelGraph:
    """The chosen trial's stage graph: its ``L/pp`` layers at one
    micro-batch, with the chosen recomputation, weights stored shardable (the
    graph the planner laid out)."""
    build = build_encoder_decoder if spec.encoder_decoder else build_lm
    return build(plan.stage_config, optimizer=spec.optimizer)


def weight_classes(plan: ScalePlan, spec: ScaleSpec) -> list[dict[str, Any]]:
    """Each weight class's storage names (``d_model_stored_<class>``: weights,
    masters and slots; ``d_model_slots_<class>``: slots only): where the
    chosen stage rules put it, and the stage's step (one micro-batch) and
    peak with it kept whole, or split over each stage axis, everything else
    unchanged, priced by ``cost_models.evaluate``.  ``saves_*`` is what the
    chosen placement saves against keeping it whole."""
    model = _stage_model(plan, spec)
    graph, outputs = model.graph, [model.loss]
    hw = spec.hardware_profile()
    mesh = plan.choice.stage_mesh
    axes = [(d.name, d.size) for d in convert_to_shape(mesh)]
    rules = dict(convert_to_layout_rules(plan.layout_rules))
    base = evaluate(
        graph, mesh, convert_to_layout_rules(plan.layout_rules), hw, outputs
    )
    names = sorted(
        {
            d.name
            for op in graph.operations
            for t in op.outputs
            for d in t.shape
            if d.name.startswith(tuple(p for p, _ in _KINDS))
        }
    )

    def price(axis: str | None, name: str) -> dict[str, Any]:
        changed = {k: v for k, v in rules.items() if k != name}
        if axis is not None:
            changed[name] = axis
        text = ";".join(f"{k}:{v}" for k, v in changed.items())
        try:
            cost = evaluate(graph, mesh, convert_to_layout_rules(text), hw, outputs)
        except MtfError as e:
            return {
                "mesh_axis": axis,
                "step_time_delta_s": None,
                "peak_memory_delta_bytes": None,
                "invalid": str(e),
            }
        return {
            "mesh_axis": axis,
            "step_time_delta_s": cost.time_s - base.time_s,
            "peak_memory_delta_bytes": cost.peak_memory_bytes - base.peak_memory_bytes,
            "invalid": None,
        }

    out = []
    for name in names:
        prefix, what = next((p, w) for p, w in _KINDS if name.startswith(p))
        axis = rules.get(name)
        options = [None] + [a for a, n in axes if n > 1]
        alternatives = [price(a, name) for a in options if a != axis]
        whole = next((a for a in alternatives if a["mesh_axis"] is None), None)
        out.append(
            {
                "weight_class": name.removeprefix(prefix),
                "storage_dim": name,
                "shards": what,
                "mesh_axis": axis,
                "sharded": axis is not None,
                # What the chosen split saves: keeping it whole costs this.
                "saves_step_time_s": None
                if whole is None
                else whole["step_time_delta_s"],
                "saves_peak_memory_bytes": None
                if whole is None
                else whole["peak_memory_delta_bytes"],
                "alternatives": alternatives,
            }
        )
    return out


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def scale_plan_dict(
    plan: ScalePlan,
    recompute: list[RecomputeCost] | None = None,
    classes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The plan as JSON-able data (``ScalePlanOut.plan``)."""
    c, p = plan.choice, plan.pipeline
    m, s = p.spec.micro_batches, p.spec.stages
    chosen_rc = next(
        (
            r
            for r in recompute or ()
            if (r.attention, r.ffn) == (c.recompute_attention, c.recompute_ffn)
        ),
        None,
    )
    return {
        "status": plan.stage_plan.status.value,
        "fits": plan.fits,
        "devices": plan.devices,
        "hardware": plan.hardware.name,
        "mesh": {"pp": c.stages, "dp": c.data, "sp": c.sequence, "tp": c.tensor},
        "mesh_shape": c.full_mesh,
        "stage_mesh": c.stage_mesh,
        "stage_layout_rules": plan.layout_rules,
        "stages": c.stages,
        "layers_per_stage": plan.config.num_layers // c.stages,
        "micro_batches": c.micro_batches,
        "sequences_per_micro_batch": plan.config.batch // c.micro_batches,
        "schedule": c.schedule,
        "in_flight": p.spec.in_flight,
        "dtypes": {
            "activations": plan.config.activation_dtype,
            "master_weights_and_slots": plan.config.master_dtype,
        },
        "sharded_classes": list(plan.sharded_classes),
        "slot_sharded_classes": list(plan.slot_sharded_classes),
        "weight_classes": classes or [],
        "recompute": {
            "attention": c.recompute_attention,
            "ffn": c.recompute_ffn,
            "options": [
                {
                    "attention": r.attention,
                    "ffn": r.ffn,
                    "chosen": r is chosen_rc,
                    "step_time_s": r.step_time_s,
                    "peak_memory_bytes": r.peak_memory_bytes,
                    "fits": r.fits,
                    "step_time_delta_s": None
                    if r.step_time_s is None
                    else r.step_time_s - plan.step_time_s,
                    "peak_memory_delta_bytes": None
                    if r.peak_memory_bytes is None
                    else r.peak_memory_bytes - plan.peak_memory_bytes,
                    "source": r.source,
                }
                for r in recompute or ()
            ],
        },
        "step": {
            "step_time_s": p.step_time_s,
            "slots": m + s - 1,
            "per_micro_batch_s": p.per_micro_batch_s,
            "send_s": p.send_s,
            # The parts add up to step_time_s.
            "micro_batch_work_s": m * p.per_micro_batch_s,
            "sends_s": m * 2 * p.send_s,
            "bubble_s": p.bubble_s,
            "once_per_step_s": p.once_s,
        },
        "memory": {
            "peak_memory_bytes": p.peak_memory_bytes,
            "memory_capacity_bytes": p.memory_capacity_bytes,
            "held_bytes_per_micro_batch": p.held_bytes,
            "stage_peak_bytes": plan.stage_plan.cost.peak_memory_bytes,
        },
        "model_flops": plan.model_flops,
        "mfu": _finite(plan.mfu),
        "trials": [
            {
                "stages": t.choice.stages,
                "data": t.choice.data,
                "tensor": t.choice.tensor,
                "sequence": t.choice.sequence,
                "micro_batches": t.choice.micro_batches,
                "recompute_attention": t.choice.recompute_attention,
                "recompute_ffn": t.choice.recompute_ffn,
                "step_time_s": t.step_time_s,
                "peak_memory_bytes": t.peak_memory_bytes,
                "fits": t.fits,
                "layout_rules": t.layout_rules,
                "note": t.note,
            }
            for t in plan.trials
        ],
        "planning_s": plan.planning_s,
        "explain": plan.explain(),
    }


def model_name(encoder_decoder: bool, cfg: Mapping[str, Any]) -> str:
    """'lm 4 layers, d_model 512' (and ', 8 experts')."""
    return (
        f"{'encoder-decoder' if encoder_decoder else 'lm'} "
        f"{cfg['num_layers']} layers, d_model {cfg['d_model']}"
        + (f", {cfg['experts']} experts" if cfg["experts"] else "")
    )


def scale_summary(
    spec: Mapping[str, Any],
    plan: Mapping[str, Any],
    profile: ProfileUsed | None = None,
) -> dict[str, Any]:
    """The columns a listing shows (``ScalePlanSummary``)."""
    return {
        "model": model_name(spec["encoder_decoder"], spec["config"]),
        "devices": plan["devices"],
        "hardware": plan["hardware"],
        "mesh_shape": plan["mesh_shape"],
        "micro_batches": plan["micro_batches"],
        "schedule": plan["schedule"],
        "recompute": f"attention={plan['recompute']['attention']} "
        f"ffn={plan['recompute']['ffn']}",
        "status": plan["status"],
        "fits": plan["fits"],
        "step_time_s": plan["step"]["step_time_s"],
        "peak_memory_bytes": plan["memory"]["peak_memory_bytes"],
        "memory_capacity_bytes": plan["memory"]["memory_capacity_bytes"],
        "mfu": plan["mfu"],
        **({} if profile is None else {"profile": profile.to_dict()}),
    }


def scale_record(spec: ScaleSpec, result: Mapping[str, Any]) -> PlanRecord:
    """The scale plan a worker's ``result`` (:func:`solve_scale_task`) makes
    for ``spec``, ready to store (``Store.put_scale_plan``)."""
    plan = result["plan"]
    canonical = spec.canonical()
    return PlanRecord(
        id=spec.request_hash[:16],
        request_hash=spec.request_hash,
        created_at=time.time(),
        graph_hash="",
        summary=scale_summary(canonical, plan, spec.profile),
        plan_json=json.dumps(
            {"request": canonical, "plan": plan},
            separators=(",", ":"),
            allow_nan=False,
        ),
    )


def solve_scale_task(task: Mapping[str, Any], report: Report) -> dict[str, Any]:
    """Runs in a solve worker: plans ``task['spec']`` and prices the
    recomputation options on the chosen mesh."""
    from mtf_core.serialization.schema import json_safe

    t0 = time.perf_counter()
    spec = ScaleSpec.from_canonical(task["spec"])
    report("planning meshes", 0.1)
    # The search reports each mesh it tries and the winner's check: 0.1 .. 0.8.
    plan = plan_spec_locally(
        spec, lambda phase, fraction: report(phase, 0.1 + 0.7 * fraction)
    )
    report("pricing recomputation options", 0.8)
    costs = recompute_costs(plan, spec)
    report("pricing weight classes", 0.9)
    classes = weight_classes(plan, spec)
    report("storing plan", 0.95)
    return {
        "plan": json_safe(scale_plan_dict(plan, costs, classes), "plan"),
        "solve_time_s": time.perf_counter() - t0,
    }
