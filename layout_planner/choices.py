"""Plans for Transformers at scale: mesh shape, pipeline, recomputation, layout.

:func:`plan_transformer` chooses, for a Transformer config on ``devices``
devices of ``hardware``:

* the mesh: ``pp`` pipeline stages (outermost axis) x ``dp`` x ``tp`` (the
  two axes the layout rules use; which dims go where, ZeRO sharding of the
  stored weights included, is the CP-SAT program's choice, so "tensor
  parallel inside a host" is found by the cost model, not assumed), and on
  request a sequence axis ``sp`` between them (``sequence=``: a third axis
  for the rules, which may split the sequence there);
* micro-batches: first one sequence per data-parallel replica (the
  shortest bubble for 1F1B), then, on the best mesh, fewer and larger ones
  (half, a quarter, ...) while the step improves and their layout fits
  without more recomputation; and the schedule;
* recomputation per block class (keep all / attention scores / whole blocks);
* the layout rules of a stage: one :func:`layout_planner.auto_layout` per
  (mesh, recomputation) trial, on the stage's graph (its ``L/pp`` layers at
  one micro-batch), under the device memory, with what the other
  micro-batches in flight hold counted in every memory row (the peak
  ``cost_models.pipeline`` prices).

How the choices are made: the mesh is enumerated in order of a lower bound
(:mod:`layout_planner.scale_bounds`), stopping when no remaining mesh can
beat the best step found; on each mesh the recomputation and the stage's
layout (the stored-weight and optimizer-slot sharding included) are one
CP-SAT program (:mod:`layout_planner.recompute_program`: a selector picks
the option, each option's time and memory rows count only when it is
picked), unless the option that recomputes least, laid out with no memory
limit, already fits: recomputation only adds work, so nothing beats it
there (:mod:`layout_planner.scale_search`).  The best mesh that fits wins
(fastest step; ties: fewer stages, a smaller sequence axis, then less
recomputation).  Each trial's layout is optimal for its pipelined step
without the stage-to-stage sends
(the CP-SAT objective weighs the per-micro-batch work ``m + p - 1`` times
and the once-per-step work once).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Callable, Iterable, Sequence

from cost_models.gc_pause import gc_paused
from cost_models.hardware import HardwareProfile
from cost_models.pipeline import (
    PipelineError,
    PipelineSpec,
)
from cost_models.profiles import get_hardware
from layout_planner import scale_search
from layout_planner.options import memory_limit_bytes
from layout_planner.scale_bounds import flops_bound_s
from layout_planner.scale_plan import (
    ScaleChoice,
    ScaleError,
    ScalePlan,
    ScaleTrial,
)
from layout_planner.scale_workers import default_workers
from mtf_core import dtypes
from mtf_core.layout import convert_to_layout_rules
from mtf_core.models import TransformerConfig, build_encoder_decoder, build_lm
from mtf_core.models.base import ModelGraph
from mtf_core.models.transformer import RECOMPUTE_ATTENTION, RECOMPUTE_FFN
from mtf_core.optimize import Optimizer, make_optimizer

__all__ = [
    "RECOMPUTE_TRIALS",
    "ScaleChoice",
    "ScaleError",
    "ScalePlan",
    "ScaleTrial",
    "check_request",
    "model_flops",
    "plan_transformer",
    "price_layout",
    "sequence_sizes",
]

#: Recomputation trials: (attention, ffn), least recomputation first.
RECOMPUTE_TRIALS = (("none", "none"), ("scores", "none"), ("block", "block"))

#: Dtypes a hardware preset cannot compute in (everything else it can).
_LACKS = {"tpu-v4": {"float16"}, "tpu-v5e": {"float16"}}


def model_flops(cfg: TransformerConfig, encoder_decoder: bool = False) -> float:
    """Flops of one training step of the model's matmuls (3x the forward:
    forward, and two for the backward), recomputation not counted; attention
    scores at full (not causal-halved) size, as Megatron-LM counts them."""
    d, h = cfg.d_model, cfg.heads * cfg.d_kv
    per_layer = 4 * d * h + 2 * d * cfg.d_ff  # q, k, v, o; wi, wo
    attn = 2 * cfg.length * h  # logits and weighted values, per token
    tokens = cfg.batch * cfg.length
    layers = cfg.num_layers
    if encoder_decoder:
        # encoder layers + decoder layers (self, enc-dec attention, ffn)
        weights = layers * per_layer + layers * (per_layer + 4 * d * h)
        attn_total = layers * attn + 2 * layers * attn
    else:
        weights, attn_total = layers * per_layer, layers * attn
    forward = 2 * tokens * (weights + cfg.vocab * d) + 2 * tokens * attn_total
    return 3.0 * forward


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def sequence_sizes(
    sizes: Sequence[int], length: int, devices: int | None = None
) -> list[int]:
    """``sizes`` of a sequence axis, checked: positive integers dividing the
    sequence ``length`` (and the ``devices``, where given), sorted."""
    if isinstance(sizes, str) or not isinstance(sizes, Iterable):
        raise ScaleError(
            f"sequence is {sizes!r}; expected sizes to try, such as (1,) or (1, 2)"
        )
    out = list(sizes)
    if not out:
        raise ScaleError("sequence is empty; expected sizes such as (1,) or (1, 2)")
    for s in out:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ScaleError(f"sequence axis size {s!r}; expected a positive integer")
        if length % s:
            raise ScaleError(
                f"sequence axis size {s} does not divide the length {length}"
            )
        if devices is not None and devices % s:
            raise ScaleError(
                f"sequence axis size {s} does not divide {devices} devices"
            )
    return sorted(set(out))


def check_request(cfg: TransformerConfig, hw: HardwareProfile, devices: int) -> None:
    """Clear errors for requests no plan can satisfy."""
    if (
        isinstance(devices, bool)
        or not isinstance(devices, numbers.Integral)
        or devices < 1
    ):
        raise ScaleError(f"devices must be a positive integer, got {devices!r}")
    if devices > 4096:
        raise ScaleError(f"{devices} devices; the scale planner plans up to 4096")
    for f in ("activation_dtype", "master_dtype"):
        dt = dtypes.as_dtype_name(getattr(cfg, f))
        if dt in _LACKS.get(hw.name, set()):
            raise ScaleError(
                f"{f} {dt!r}: hardware {hw.name!r} has no {dt} arithmetic; "
                "expected one of 'bfloat16', 'float32'"
            )


def _check_config(config: object) -> TransformerConfig:
    if not isinstance(config, TransformerConfig):
        raise ScaleError(
            f"config is {config!r}; expected an mtf_core.models.TransformerConfig"
        )
    return config


def _check_sizes(what: str, given: object) -> list[int]:
    """``stages``/``tensor`` sizes to try, checked: positive integers (numpy
    ones as plain ``int``)."""
    if isinstance(given, str) or not isinstance(given, Iterable):
        raise ScaleError(
            f"{what} is {given!r}; expected sizes to try, such as [1, 2, 4], or "
            "None to search the defaults"
        )
    out = list(given)
    for s in out:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1:
            raise ScaleError(f"{what} size {s!r}; expected a positive integer")
    return [int(s) for s in out]


def _check_recompute(recompute: object) -> list[tuple[str, str]]:
    """Recomputation trials, checked: (attention, ffn) pairs of known options."""
    pairs = (
        None
        if isinstance(recompute, str) or not isinstance(recompute, Iterable)
        else list(recompute)
    )
    if not pairs:
        raise ScaleError(
            f"recompute is {recompute!r}; expected (attention, ffn) pairs to try, "
            f"such as {list(RECOMPUTE_TRIALS[:2])}"
        )
    for pair in pairs:
        if (
            isinstance(pair, str)
            or not isinstance(pair, Sequence)
            or len(pair) != 2
            or pair[0] not in RECOMPUTE_ATTENTION
            or pair[1] not in RECOMPUTE_FFN
        ):
            raise ScaleError(
                f"recompute option {pair!r}; expected an (attention, ffn) pair, "
                f"attention one of {list(RECOMPUTE_ATTENTION)} and ffn one of "
                f"{list(RECOMPUTE_FFN)}"
            )
    return [(a, f) for a, f in pairs]


def _check_flags(**flags: object) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ScaleError(f"{name} is {value!r}; expected True or False")


def _check_optimizer(optimizer: object) -> None:
    if isinstance(optimizer, str):
        make_optimizer(optimizer)  # a name it knows (ConfigError naming it)
    elif not isinstance(optimizer, Optimizer):
        raise ScaleError(
            f"optimizer is {optimizer!r}; expected one of 'sgd', 'momentum', "
            "'adam', 'adamw', 'adafactor' (or an mtf Optimizer)"
        )


def _one_stage(stages: Sequence[int]) -> None:
    """An encoder-decoder is planned on one stage: a pipeline of its stages
    would send the encoder output to the decoder layers of every stage (and
    their gradients back), which is neither priced nor built
    (:func:`mtf_core.pipeline.build_pipelined_encoder_decoder`)."""
    if any(s != 1 for s in stages):
        raise ScaleError(
            f"stages {list(stages)} for an encoder-decoder; expected [1]: its "
            "encoder output would have to reach every stage's decoder layers, "
            "which is neither priced nor built (docs/scale.md, "
            '"An encoder-decoder is planned on one stage")'
        )


# The search builds and walks graphs of thousands of ops, allocating millions
# of small objects and few cycles: a paused collector saves a quarter of the
# time (cost_models.gc_pause).
@gc_paused()
def plan_transformer(
    config: TransformerConfig,
    devices: int,
    hardware: str | HardwareProfile = "h100-nvlink-ib",
    optimizer: str = "adam",
    encoder_decoder: bool = False,
    stages: Sequence[int] | None = None,
    tensor: Sequence[int] | None = None,
    micro_batches: int | None = None,
    schedule: str = "1f1b",
    recompute: Sequence[tuple[str, str]] = RECOMPUTE_TRIALS,
    time_limit_s: float = 5.0,
    memory_limit: int | None = None,
    exhaustive: bool = False,
    verify: bool = True,
    progress: Callable[[str, float], None] | None = None,
    workers: int | None = None,
    sequence: Sequence[int] = (1,),
) -> ScalePlan:
    """The fastest fitting plan for ``config`` on ``devices`` devices.

    ``stages`` / ``tensor`` restrict the pipeline and tensor-axis sizes tried
    (default: every power of two up to 64 that divides; stages must divide the
    layers; an ``encoder_decoder`` has one stage, :func:`_one_stage`);
    ``sequence`` the sizes of a sequence axis ``sp`` tried (default none:
    on the reference models it never won, and each size multiplies the
    meshes searched, docs/scale.md "A sequence axis"; each must divide the
    length); ``micro_batches`` fixes the micro-batch count (default: one
    sequence per data-parallel replica on every mesh, then on the best mesh
    half as many, a quarter, ... while the step improves: see
    :func:`layout_planner.scale_search._fewer_rounds`).  Weights are stored shardable
    (``d_model_stored_<class>``) and computed in ``config``'s dtypes.

    Trials are priced on representative stage graphs of 2-4 layers
    (:mod:`layout_planner.scale_search`) and the winner, when ``verify``, on
    its full stage graph; ``exhaustive=True`` builds and plans every trial's
    full stage graph instead (same plan, slower).  ``progress(phase,
    fraction)`` is called before each mesh of the search (and once more
    before the winner's check).  ``workers``: processes for the search's
    two passes (default: the usable cores, at most 8,
    :func:`layout_planner.scale_workers.default_workers`): forked (watched
    for a stall wherever their CPU time can be read, and so beside a running
    TensorFlow too), or helper interpreters where no fork is possible
    (:mod:`layout_planner.scale_workers`); the plan is the same for any
    number and either kind.
    """
    start = time.perf_counter()
    _check_config(config)
    hw = (
        get_hardware(hardware)
        if not isinstance(hardware, HardwareProfile)
        else hardware
    )
    if memory_limit is not None:
        hw = hw.with_memory(memory_limit_bytes(memory_limit))
    check_request(config, hw, devices)
    devices = int(devices)  # a numpy integer too
    PipelineSpec(1, 1, schedule)  # checks the schedule's name
    _check_optimizer(optimizer)
    _check_flags(encoder_decoder=encoder_decoder, exhaustive=exhaustive, verify=verify)
    recompute = _check_recompute(recompute)
    t = time_limit_s
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0 < t < math.inf:
        raise ScaleError(f"time_limit_s is {t!r}; expected seconds > 0")
    if workers is not None:
        if (
            isinstance(workers, bool)
            or not isinstance(workers, numbers.Integral)
            or workers < 1
        ):
            raise ScaleError(
                f"workers is {workers!r}; expected an integer >= 1 or None"
            )
        workers = int(workers)  # a numpy integer too
    if progress is not None and not callable(progress):
        raise ScaleError(f"progress is {progress!r}; expected a callable or None")
    cfg = config.replace(shardable_weights=True, shardable_slots=True)
    layers = cfg.num_layers
    pows = [2**i for i in range(7)]
    asked: dict[str, list[int]] = {}
    for what, given in (("stages", stages), ("tensor", tensor)):
        if given is not None:
            asked[what] = _check_sizes(what, given)  # read once: an iterator too
            if not asked[what]:
                raise ScaleError(
                    f"{what} is empty; expected sizes to try, such as [1, 2, 4], "
                    "or None to search the defaults"
                )
    stage_sizes = asked.get(
        "stages",
        [1]
        if encoder_decoder
        else [s for s in pows if layers % s == 0 and devices % s == 0],
    )
    if encoder_decoder:
        _one_stage(stage_sizes)
    for s in stage_sizes:
        if s > layers:
            raise PipelineError(
                f"{s} pipeline stages for {layers} layer{'s' * (layers != 1)}; "
                "expected at most one stage per layer"
            )
    # Tensor axes up to two hosts' worth (the cost model decides whether one
    # host's is best); any size on meshes without a host hierarchy.
    per_host = hw.devices_per_host
    tensor_sizes = asked.get(
        "tensor", [t for t in pows if per_host is None or t <= 2 * per_host]
    )
    sp_sizes = sequence_sizes(sequence, cfg.length, devices)
    builder: Callable[..., ModelGraph] = (
        build_encoder_decoder if encoder_decoder else build_lm
    )
    flops = model_flops(cfg, encoder_decoder)
    meshes = []
    skipped: list[str] = []  # why each (pp, sp, tp) is no mesh
    for pp in stage_sizes:
        for sp in sp_sizes:
            for tp in tensor_sizes:
                sizes = (
                    f"pp {pp} x sp {sp} x tp {tp}" if sp > 1 else f"pp {pp} x tp {tp}"
                )
                if devices % (pp * sp * tp):
                    skipped.append(
                        f"{sizes} = {pp * sp * tp} does not divide {devices}"
                    )
                    continue
                dp = devices // (pp * sp * tp)
                if cfg.batch % dp:
                    skipped.append(
                        f"{sizes} leaves dp {dp}, which does not divide the batch "
                        f"{cfg.batch}"
                    )
                    continue
                m = micro_batches if micro_batches is not None else cfg.batch // dp
                spec = PipelineSpec(pp, m, schedule)
                spec.check(layers, cfg.batch)
                if (cfg.batch // m) % dp:  # a micro-batch must split over dp
                    skipped.append(
                        f"{sizes} leaves dp {dp}, which does not divide a "
                        f"micro-batch of {cfg.batch // m} sequences"
                    )
                    continue
                # No step beats the model's flops at peak on every device,
                # stretched by the bubble (layout_planner.scale_bounds).
                bound = flops_bound_s(flops, hw, devices, m, pp)
                meshes.append((bound, pp, tp, dp, m, spec, sp))
    if not meshes:
        more = f" (and {len(skipped) - 3} more)" if len(skipped) > 3 else ""
        raise ScaleError(
            f"no mesh of {devices} devices to try: {'; '.join(skipped[:3])}{more}; "
            "expected stage, sequence and tensor sizes whose product divides the "
            "devices and leaves a data axis dividing the batch (and each "
            "micro-batch)"
        )
    meshes.sort(key=lambda t: (t[0], t[1], t[2], t[6]))

    found = scale_search.search(
        cfg,
        [scale_search.Mesh(*t) for t in meshes],
        hw,
        builder,
        optimizer,
        schedule,
        recompute,
        time_limit_s,
        flops,
        devices,
        verify,
        progress,
        exhaustive=exhaustive,
        encoder_decoder=encoder_decoder,
        workers=default_workers() if workers is None else workers,
        fewer_micro_batches=micro_batches is None,
    )
    return dataclasses.replace(found, planning_s=time.perf_counter() - start)


def price_layout(
    config: TransformerConfig,
    choice: ScaleChoice,
    rules: str,
    hardware: str | HardwareProfile = "h100-nvlink-ib",
    optimizer: str = "adam",
    encoder_decoder: bool = False,
) -> ScalePlan:
    """A given mesh, pipeline, recomputation and stage layout rules (e.g. a
    published configuration) priced exactly as the planner's trials are."""
    hw = get_hardware(hardware)
    cfg = _check_config(config).replace(shardable_weights=True, shardable_slots=True)
    if not isinstance(choice, ScaleChoice):
        raise ScaleError(f"choice is {choice!r}; expected a ScaleChoice")
    sizes = ("stages", "data", "tensor", "micro_batches", "sequence")
    for f in sizes:
        v = getattr(choice, f)
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ScaleError(f"choice.{f} is {v!r}; expected an integer >= 1")
    # numpy integers as plain ones (the plan's JSON and mesh strings)
    choice = dataclasses.replace(
        choice,
        stages=int(choice.stages),
        data=int(choice.data),
        tensor=int(choice.tensor),
        micro_batches=int(choice.micro_batches),
        sequence=int(choice.sequence),
    )
    _check_optimizer(optimizer)
    _check_flags(encoder_decoder=encoder_decoder)
    if encoder_decoder:
        _one_stage([choice.stages])
    check_request(cfg, hw, choice.devices)
    sequence_sizes((choice.sequence,), cfg.length)
    spec = PipelineSpec(choice.stages, choice.micro_batches, choice.schedule)
    spec.check(cfg.num_layers, cfg.batch)
    builder = build_encoder_decoder if encoder_decoder else build_lm
    return scale_search.price_given(
        cfg,
        choice,
        convert_to_layout_rules(rules),
        hw,
        builder,
        optimizer,
        model_flops(cfg, encoder_decoder),
        encoder_decoder,
    )
