"""Per-op-class features: what a calibrated profile prices an op and a collective by.

A calibrated :class:`~cost_models.hardware.HardwareProfile` prices time as a
dot product: ``seconds = sum(rate[f] * feature[f])`` over the features below,
with ``rate`` fitted by least squares from measured steps
(:mod:`cost_models.calibration`).  The features are per device and exact (the
same slice bytes and flops the roofline reads); only the rates are measured.

========================  =====================================================
feature                   unit, counted for
========================  =====================================================
``ops``                   1 per op that makes TensorFlow work (per-op overhead:
                          dispatch, scheduling, small kernels)
``matmul_flops``          flops per device of contracting einsums and convs
``matmul_bytes``          their input + output slice bytes (transposes, and
                          small matmuls running below peak)
``elementwise_bytes``     slice bytes read + written by cheap elementwise ops
``transcendental_bytes``  the same for exp, log, tanh, rsqrt, ... (softmax's
                          and layer norm's expensive part)
``reduce_bytes``          reductions (reduce, single-input einsum, top-k, cumsum)
``gather_bytes``          gathers, one-hot lookups and segment sums, one_hot
``random_bytes``          random draws (the full tensor on every device)
``movement_bytes``        concat, split, slice, pad, shift, stack, fed inputs
``assign_bytes``          variable assignments
``large_bytes``           of all the bytes above, those of slices of at least
                          1 MiB (they go to main memory, not the cache)
``transpose_bytes``       slice bytes of the operands a two-input einsum's
                          kernel transposes before or after its matmul
                          (:mod:`cost_models.einsum_transposes`)
``outer_reduce_bytes``    of the reduce bytes, those of a reduction over
                          outer dims that keeps the slice's innermost one (a
                          bias or layer-norm gradient), times the share of its
                          strided reads that miss: ``min(1, row / 4 KiB) *
                          min(1, rows / 2048)``, the row being the kept inner
                          block and the rows those summed
``<kind>_bytes``          a collective's ring bandwidth term in bytes: allreduce
                          ``2(n-1)/n*b``, allconcat ``(n-1)*b``, alltoall
                          ``(n-1)/n*b``, shift and broadcast ``b``
``<kind>_steps``          its latency steps: ``2(n-1)``, ``n-1``, ``n-1``, 1,
                          ``ceil(log2 n)``
========================  =====================================================

With ``rate`` = ``1/peak_flops`` for flops, ``1/hbm_bandwidth`` for bytes,
``1/bandwidth`` and ``latency`` for collectives (:func:`roofline_rates`) the
collective terms are exactly the alpha-beta formulas of
:mod:`cost_models.collectives`; the compute terms are a sum where the roofline
takes a max (a calibrated CPU does both, one after the other).

What the features ignore: fusion, caches, which op follows which, and the
shape of a matmul beyond its flops and bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cost_models.einsum_transposes import kernel_transposes, moved_operands
from cost_models.feature_names import (
    COLLECTIVE_KINDS,
    COMPUTE_CLASSES,
)
from cost_models.hardware import CostModelError, HardwareProfile
from cost_models.layout_cache import LayoutSizes
from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.graph import Operation
from mtf_core.ops.onehot_einsum import OneHotEinsumPlan

#: ``outer_reduce_bytes``: the page a strided read crosses (prefetchers stop
#: at its boundary), and the rows of a strided walk past which its lines are
#: no longer cached for the next one.  Chosen on single-thread timings of
#: TensorFlow's sums over and along the rows of 51 shapes (128-16384 rows,
#: 32-4096 columns, 256 KiB-64 MiB) on the CI host (bench/strided_sum.py);
#: the rate is fitted with the others.
PAGE_BYTES = 4096
STRIDED_ROWS = 2048
#: A slice at least this large no longer stays in a core's cache between ops:
#: its bytes also count as ``large_bytes`` (main-memory traffic).
LARGE_SLICE_BYTES = 1 << 20

_TRANSCENDENTAL = frozenset(
    "exp log sqrt rsqrt sigmoid tanh sin cos softplus silu gelu elu selu reciprocal".split()
)
# Ops that make no TensorFlow work of their own: constants are shared per
# device, identity passes its input (the lowering adds no op for it).
_FREE = frozenset({"Constant", "CausalBias", "Identity", "StopGradient"})
# Ops whose output is a view: overhead, no bytes (a reshape is metadata in TF,
# a variable read aliases the variable's buffer).
_VIEW = frozenset({"Reshape", "Variable", "CustomGradient"})
_BY_TYPE = {
    "Binary": "elementwise",
    "Where": "elementwise",
    "AddN": "elementwise",
    "Cast": "elementwise",
    "Broadcast": "elementwise",
    "Reduce": "reduce",
    "TopK": "reduce",
    "Cumsum": "reduce",
    "Gather": "gather",
    "OneHot": "gather",
    "Range": "gather",
    "Random": "random",
    "Concat": "movement",
    "Split": "movement",
    "Stack": "movement",
    "Unstack": "movement",
    "Slice": "movement",
    "Pad": "movement",
    "Shift": "movement",
    "ImportTensor": "movement",
    "Assign": "assign",
    "Conv2d": "matmul",
    "Conv2dBackpropInput": "matmul",
    "Conv2dBackpropFilter": "matmul",
}


def op_class(op: Operation) -> str | None:
    """The class an op is priced as (None: free, ``"view"``: overhead only)."""
    t = op.op_type
    if t in _FREE:
        return None
    if t in _VIEW:
        return "view"
    if t == "Einsum":
        if getattr(op, "onehot_plan", None) is not None:
            return "gather"  # lowered as a lookup or a segment sum
        if len(op.inputs) == 1:
            return "reduce"
        return "matmul" if _contracts(op) else "elementwise"
    if t == "Unary":
        return (
            "transcendental"
            if getattr(op, "fn_name", "") in _TRANSCENDENTAL
            else "elementwise"
        )
    return _BY_TYPE.get(t, "elementwise")


def _contracts(op: Operation) -> bool:
    """Whether an einsum sums a dim shared by two of its inputs (a matmul)."""
    out = set(op.outputs[0].shape.dimension_names)
    seen: set[str] = set()
    for t in op.inputs:
        names = set(t.shape.dimension_names) - out
        if names & seen:
            return True
        seen |= names
    return False


def op_features(
    op: Operation,
    ctx: LayoutContext,
    sizes: LayoutSizes,
    flops_per_device: float,
) -> tuple[tuple[str, float], ...]:
    """The compute features of ``op`` on one device under ``ctx``."""
    cls = op_class(op)
    if cls is None:
        return ()
    if cls == "view":
        return (("ops", 1.0),)
    if cls == "random":
        nbytes = float(sum(t.size_bytes for t in op.outputs))
    elif cls == "gather" and op.op_type == "Einsum":
        # A lookup reads the ids and the rows it gathers: its output's size
        # (the one-hot operand is never materialized).
        plan: OneHotEinsumPlan = getattr(op, "onehot_plan")  # noqa: B009 (Einsum only)
        ids = op.inputs[plan.hot].operation.inputs[0]
        nbytes = float(sizes.slice_bytes(ids) + 2 * sizes.slice_bytes(op.outputs[0]))
    else:
        nbytes = float(sum(sizes.slice_bytes(t) for t in op.inputs + op.outputs))
    feats: list[tuple[str, float]] = [("ops", 1.0), (f"{cls}_bytes", nbytes)]
    large = _large_bytes(op, cls, sizes)
    if large:
        feats.append(("large_bytes", large))
    if cls == "matmul":
        feats.append(("matmul_flops", float(flops_per_device)))
        if op.op_type == "Einsum" and len(op.inputs) == 2:
            # (tf.einsum splits a longer product into pairs of its choosing)
            moved = _transposed_bytes(op, sizes)
            if moved:
                feats.append(("transpose_bytes", moved))
    elif cls == "reduce" and op.op_type == "Reduce":
        outer = _outer_reduce_bytes(op, ctx, sizes)
        if outer:
            feats.append(("outer_reduce_bytes", outer))
    return tuple(feats)


def _transposed_bytes(op: Operation, sizes: LayoutSizes) -> float:
    """Slice bytes of the operands the einsum kernel transposes."""
    out = op.outputs[0]
    inputs = tuple(tuple(t.shape.dimension_names) for t in op.inputs)
    output = tuple(out.shape.dimension_names)
    if not kernel_transposes(inputs, output):
        return 0.0  # (most einsums: no slice sizes to look up)
    tensors = list(op.inputs) + [out]
    moved = moved_operands(inputs, output, [sizes.slice_dims(t) for t in tensors])
    return float(sum(sizes.slice_bytes(tensors[k]) for k in moved))


def _outer_reduce_bytes(op: Operation, ctx: LayoutContext, sizes: LayoutSizes) -> float:
    """The input slice bytes of a reduction that keeps the slice's innermost
    dim and sums over outer ones, times ``min(1, row / PAGE_BYTES) * min(1,
    rows / STRIDED_ROWS)``; 0 for one that reduces the innermost dim (it
    reads its rows contiguously).

    Summing over outer dims, the kernel walks down ``rows`` rows of the kept
    inner block (``row`` bytes apart) for each vector of outputs.  Hardware
    prefetchers stop at a page boundary, so the share ``row / PAGE_BYTES``
    (up to 1) of those reads land on a page no prefetch reached; and a walk
    over few rows finds them still cached for the next vector, one over
    ``STRIDED_ROWS`` or more does not.  Dims whose slice has one element do
    not count (TensorFlow drops them)."""
    x = op.inputs[0]
    kept = set(op.outputs[0].shape.dimension_names)
    dims = [
        (d.name, n) for d, n in zip(x.shape.dims, ctx.slice_shape(x.shape)) if n > 1
    ]
    if not dims or dims[-1][0] not in kept:
        return 0.0
    row = float(dtypes.size_bytes(x.dtype))
    while dims and dims[-1][0] in kept:
        row *= dims.pop()[1]
    rows = math.prod(n for name, n in dims if name not in kept)
    if rows <= 1:
        return 0.0
    share = min(1.0, row / PAGE_BYTES) * min(1.0, rows / STRIDED_ROWS)
    return sizes.slice_bytes(x) * share


def _large_bytes(op: Operation, cls: str, sizes: LayoutSizes) -> float:
    if cls == "random":
        tensors = [(t.size_bytes) for t in op.outputs]
    elif cls == "gather" and op.op_type == "Einsum":
        tensors = [sizes.slice_bytes(op.outputs[0])] * 2
    else:
        tensors = [sizes.slice_bytes(t) for t in op.inputs + op.outputs]
    return float(sum(b for b in tensors if b >= LARGE_SLICE_BYTES))


def collective_features(spec: CollectiveSpec, n: int) -> tuple[tuple[str, float], ...]:
    """The features of one collective over a group of ``n`` processors."""
    if n <= 1:
        return ()
    b = float(spec.bytes_per_device)
    k = spec.kind
    if k == "allreduce":
        return (
            ("allreduce_bytes", 2 * (n - 1) / n * b),
            ("allreduce_steps", 2.0 * (n - 1)),
        )
    if k == "allconcat":
        return (("allconcat_bytes", (n - 1) * b), ("allconcat_steps", float(n - 1)))
    if k == "alltoall":
        return (("alltoall_bytes", (n - 1) / n * b), ("alltoall_steps", float(n - 1)))
    if k == "shift":
        return (("shift_bytes", b), ("shift_steps", 1.0))
    if k == "broadcast":
        steps = float(math.ceil(math.log2(n)))
        return (("broadcast_bytes", b), ("broadcast_steps", steps))
    raise CostModelError(
        f"unknown collective kind {k!r}; expected one of {COLLECTIVE_KINDS}"
    )


def priced(
    features: tuple[tuple[str, float], ...], rates: Mapping[str, float]
) -> float:
    """``sum(rates[f] * x)`` over ``features`` (a missing rate counts 0)."""
    return sum(rates.get(f, 0.0) * x for f, x in features)


def roofline_rates(hw: HardwareProfile) -> dict[str, float]:
    """Rates that make the features reproduce ``hw``'s uncalibrated formulas:
    the prior a calibration fit starts from (and falls back to for features
    its measurements never exercised)."""
    link = hw.default_link
    rates = {
        "ops": 1e-6,
        "matmul_flops": 1.0 / hw.peak_flops,
        "large_bytes": 0.5 / hw.hbm_bandwidth_bytes_per_s,
        "outer_reduce_bytes": 0.5 / hw.hbm_bandwidth_bytes_per_s,
        "transpose_bytes": 1.0 / hw.hbm_bandwidth_bytes_per_s,
    }
    for c in COMPUTE_CLASSES:
        rates[f"{c}_bytes"] = 1.0 / hw.hbm_bandwidth_bytes_per_s
    for k in COLLECTIVE_KINDS:
        rates[f"{k}_bytes"] = 1.0 / link.bandwidth_bytes_per_s
        rates[f"{k}_steps"] = max(link.latency_s, 1e-7)
    return rates
