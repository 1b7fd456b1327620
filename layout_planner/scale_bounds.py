"""A lower bound on a pipelined step, for ordering and pruning the mesh search.

The scale search (:mod:`layout_planner.scale_search`) tries meshes
``pp x dp x tp`` in order of a lower bound and stops when no remaining mesh's
bound beats the best step found.  It must never exceed what a trial on that
mesh can cost, or the search would skip the best mesh.

The bound is the model's matmul flops (:func:`layout_planner.choices.model_flops`)
at peak on every device, stretched by the bubble::

    step >= (m + pp - 1) / m * flops / (pp * dp * tp * peak)

Why it is a bound: a stage runs ``L / pp`` of the layers (and is priced with
the embedding and the head besides), so one micro-batch's stage work is at
least ``flops / (pp * m)``, spread at best over its ``dp * tp`` devices, each
at most at peak (:mod:`cost_models.op_costs`); the pipelined step is
``(m + p - 1) (t_mb + 2 t_send) + t_once`` (``cost_models.pipeline``) and
recomputation, collectives and memory-bound ops only add.

A roofline bound (each op's flops or HBM bytes, whichever takes longer,
spread over ``dp * tp`` devices, from six small graphs of 2-4 layers) was
used before: it is tighter, but on the reference models it skipped one
mesh's free layout at most, and its graphs took 0.13-0.29 s before the
search could start, more than it saved (docs/scale.md, "Planning time").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from cost_models.hardware import HardwareProfile
from cost_models.op_costs import hbm_tensors
from layout_planner.scale_stages import StageGraph
from mtf_core.liveness import step_operations
from mtf_core.models import TransformerConfig
from mtf_core.models.base import ModelGraph

__all__ = ["copy_rates", "flops_bound_s", "recompute_bound_s"]


def flops_bound_s(
    flops: float, hw: HardwareProfile, devices: int, micro_batches: int, stages: int
) -> float:
    """The model's ``flops`` at peak on every one of ``devices``, stretched by
    the bubble of ``stages`` stages and ``micro_batches`` micro-batches."""
    m, pp = micro_batches, stages
    return flops / (devices * hw.peak_flops) * (m + pp - 1) / m


#: A recomputation option: what is recomputed of (attention, ffn).
Option = tuple[str, str]


def copy_rates(
    cfg: TransformerConfig,
    builder: Callable[..., ModelGraph],
    optimizer: str,
    least: Option,
    options: Sequence[Option],
    hw: HardwareProfile,
    encoder_decoder: bool = False,
) -> dict[Option, float]:
    """Per option of ``options``: the seconds that one layer's recomputed
    copy takes at least per sequence of a micro-batch, on a mesh of one
    device, over the graph of ``least`` (the option each mesh's free layout
    takes); :func:`recompute_bound_s` spreads it over a stage.

    A recomputed block runs its forward again in the backward pass
    (:func:`mtf_core.recompute.recompute_block`): an option's stage graph
    holds every op of ``least``'s, priced the same under a layout, and the
    copy besides (less what no gradient reads, which the step does not
    run).  On a roofline profile each op of the copy takes at least its
    flops at peak or its bytes (inputs and outputs) at HBM bandwidth,
    whichever is longer, on each of ``n`` devices when all ``n`` split it
    evenly; its collectives only add.  So the copy is found as the ops of
    a one-layer graph of the whole batch that ``least``'s lacks (the step's
    ops before the optimizer's update, each known by its flops and bytes),
    and the rate is their roofline seconds over the batch.  An op's flops
    and bytes are affine in the sequences of a micro-batch, with nothing
    negative left at none (a weight it reads), so a micro-batch of ``b``
    sequences takes at least ``b`` times the rate.

    0 (no bound) where an option's graph lacks some op of ``least``'s (the
    copy is then not all it adds), for a mixture of experts (its capacity
    is rounded per micro-batch, not affine), an encoder-decoder (its stage
    is not ``layers`` copies of one layer) or a fitted profile (its rates
    are not a roofline)."""
    rates = dict.fromkeys(options, 0.0)
    if encoder_decoder or cfg.experts or hw.rates is not None:
        return rates
    base = _step_ops(cfg, builder, optimizer, least)
    for option in options:
        if option == least:
            continue
        per_batch, once = _step_ops(cfg, builder, optimizer, option)
        if base[0] - per_batch or base[1] - once:
            continue
        rates[option] = (
            sum(
                n * max(flops / hw.peak_flops, moved / hw.hbm_bandwidth_bytes_per_s)
                for (flops, moved), n in (per_batch - base[0]).items()
            )
            / cfg.batch
        )
    return rates


def _step_ops(
    cfg: TransformerConfig,
    builder: Callable[..., ModelGraph],
    optimizer: str,
    option: Option,
) -> tuple[Counter[tuple[float, int]], Counter[tuple[float, int]]]:
    """The (flops, HBM bytes) of each op a step of ``option``'s one-layer
    graph of the whole batch runs: those before the optimizer's update, and
    the update's."""
    attention, ffn = option
    model = builder(
        cfg.replace(num_layers=1, recompute_attention=attention, recompute_ffn=ffn),
        optimizer=optimizer,
    )
    first_update = StageGraph(model).first_update
    per_batch: Counter[tuple[float, int]] = Counter()
    once: Counter[tuple[float, int]] = Counter()
    for op in step_operations(model.graph, [model.loss]):
        fixed, moved = hbm_tensors(op)
        key = (op.flops(), fixed + sum(t.size_bytes for t in moved))
        (once if op.graph_index >= first_update else per_batch)[key] += 1
    return per_batch, once


def recompute_bound_s(
    rate_s: float,
    cfg: TransformerConfig,
    stages: int,
    micro_batches: int,
    stage_devices: int,
) -> float:
    """What a recomputation option whose copy takes ``rate_s`` (from
    :func:`copy_rates`) adds at least to the pipelined step of every layout
    of a mesh with ``stages`` stages of ``stage_devices`` devices each: each
    of a stage's layers recomputes its copy for the micro-batch's
    sequences, spread evenly over the stage's devices, in each of the
    ``m + pp - 1`` slots.  So a mesh whose free layout's bound plus this is
    slower than a fitting step found has no faster layout of the option."""
    layers = cfg.num_layers // stages
    sequences = cfg.batch // micro_batches
    return (micro_batches + stages - 1) * layers * sequences * rate_s / stage_devices
