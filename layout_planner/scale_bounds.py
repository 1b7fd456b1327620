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

from cost_models.hardware import HardwareProfile
from mtf_core.models import TransformerConfig

__all__ = ["flops_bound_s", "recompute_bound_s"]


def flops_bound_s(
    flops: float, hw: HardwareProfile, devices: int, micro_batches: int, stages: int
) -> float:
    """The model's ``flops`` at peak on every one of ``devices``, stretched by
    the bubble of ``stages`` stages and ``micro_batches`` micro-batches."""
    m, pp = micro_batches, stages
    return flops / (devices * hw.peak_flops) * (m + pp - 1) / m


def recompute_bound_s(
    cfg: TransformerConfig,
    recompute: tuple[str, str],
    hw: HardwareProfile,
    stages: int,
    micro_batches: int,
    stage_devices: int,
    encoder_decoder: bool = False,
) -> float:
    """What recomputing ``recompute`` (attention, ffn) adds at least to the
    pipelined step of every layout of a mesh with ``stages`` stages of
    ``stage_devices`` devices each: the recomputed blocks' input projections
    at peak on every device of a stage, in each of the ``m + pp - 1`` slots.

    A recomputed block runs its forward again in the backward pass
    (:func:`mtf_core.recompute.recompute_block`): the graph holds every op
    of the graph without recomputation, priced the same under a layout,
    and a copy of the block's forward besides, less what no gradient
    reads (the output projections, ``o`` and ``wo``, whose outputs only the
    next block reads).  So each layer recomputes at least its q, k, v and
    wi projections, ``2 x tokens x (3 d_model heads d_kv + d_model d_ff)``
    flops (the attention scores, norms and activations besides are not
    counted), and an op takes at least its flops per device at peak on a
    roofline profile.  So a mesh whose free layout's bound plus this
    is slower than a fitting step found has no faster layout of the
    option.  0 (no bound) for another option, a mixture of experts, an
    encoder-decoder or a fitted profile (its rates are not a roofline)."""
    if (
        tuple(recompute) != ("block", "block")
        or encoder_decoder
        or cfg.experts
        or hw.rates is not None
    ):
        return 0.0
    d, h = cfg.d_model, cfg.heads * cfg.d_kv
    tokens = cfg.batch // micro_batches * cfg.length
    layers = cfg.num_layers // stages
    flops = 2.0 * tokens * layers * (3 * d * h + d * cfg.d_ff)
    return (micro_batches + stages - 1) * flops / (stage_devices * hw.peak_flops)
