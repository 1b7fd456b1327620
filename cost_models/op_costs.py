"""Per-op compute under a layout: flops per device and a roofline time.

``flops_per_device = op.flops() / ctx.devices_splitting(op's dim names)``: the
work is divided only over the mesh axes that split one of the op's dims; work
duplicated over the other axes counts in full on every device (this is exactly
what the lowering's counters record).

``compute_time_s = max(flops_per_device / peak_flops,
hbm_bytes_per_device / hbm_bandwidth_bytes_per_s)`` where
``hbm_bytes_per_device`` is the local slice bytes the op reads (its inputs)
plus writes (its outputs).  Reading a variable and ``identity`` move no data;
a random op draws the *full* tensor on every device (so that layouts never
change the numbers), so it writes the full bytes.
Ignored: caches and fusion (every op reads and writes its tensors once),
kernel launch overhead, lower efficiency of small matmuls.

A *calibrated* profile (``hw.rates`` set) prices the op instead by its
per-class features (:mod:`cost_models.op_classes`): per-op overhead plus
measured seconds per flop and per byte of its class, added, not maxed.
The flops per device are the same either way.
"""

from __future__ import annotations

from cost_models.hardware import HardwareProfile

# LayoutSizes lives beside the context it caches; re-exported for importers here.
from cost_models.layout_cache import LayoutSizes as LayoutSizes
from cost_models.op_classes import op_features, priced
from mtf_core.comm import LayoutContext
from mtf_core.graph import Operation, Tensor
from mtf_core.ops.elementwise import Identity
from mtf_core.ops.random import RandomOp
from mtf_core.ops.variables import Variable

# Ops whose output is a view of existing memory: no HBM traffic of their own.
_ALIASING = (Variable, Identity)


def flops_per_device(
    op: Operation,
    ctx: LayoutContext,
    sizes: LayoutSizes | None = None,
    flops: float | None = None,
) -> float:
    """``op.flops()`` divided over the mesh axes splitting one of its dims
    (``flops``: ``op.flops()``, if the caller knows it already)."""
    if flops is None:
        flops = op.flops()
    if not flops:
        return 0.0
    names = op.all_dim_names
    n = (
        sizes.devices_splitting(names)
        if sizes is not None
        else ctx.devices_splitting(names)
    )
    return flops / n


def hbm_bytes_per_device(
    op: Operation,
    ctx: LayoutContext,
    sizes: LayoutSizes | None = None,
    tensors: tuple[int, tuple[Tensor, ...]] | None = None,
) -> int:
    """Local bytes ``op`` reads and writes (inputs plus outputs);
    ``tensors``: :func:`hbm_tensors` of ``op``, if the caller keeps it."""
    fixed, moved = hbm_tensors(op) if tensors is None else tensors
    if not moved:
        return fixed
    if sizes is not None:
        return sum(sizes.slice_bytes(t) for t in moved)
    return sum(ctx.slice_bytes(t.shape, t.dtype) for t in moved)


def hbm_tensors(op: Operation) -> tuple[int, tuple[Tensor, ...]]:
    """What :func:`hbm_bytes_per_device` reads of ``op`` whatever the layout:
    ``(bytes, ())`` when that is all it moves, else ``(0, tensors)`` whose
    local slices it moves."""
    if isinstance(op, _ALIASING):
        return 0, ()
    if isinstance(op, RandomOp):
        return sum(t.size_bytes for t in op.outputs), ()
    return 0, tuple(op.inputs + op.outputs)


def op_compute(
    op: Operation,
    ctx: LayoutContext,
    hw: HardwareProfile,
    sizes: LayoutSizes | None = None,
    flops: float | None = None,
    tensors: tuple[int, tuple[Tensor, ...]] | None = None,
) -> tuple[float, float]:
    """``(flops_per_device, compute_time_s)`` of ``op`` (``flops``: ``op.flops()``,
    and ``tensors``: :func:`hbm_tensors` of ``op``, if the caller knows them
    already)."""
    flops = flops_per_device(op, ctx, sizes, flops)
    rates = hw.rates
    if rates is not None:
        if sizes is None:
            sizes = LayoutSizes(ctx)
        return flops, priced(op_features(op, ctx, sizes, flops), rates)
    return flops, max(
        flops / hw.peak_flops,
        hbm_bytes_per_device(op, ctx, sizes, tensors) / hw.hbm_bandwidth_bytes_per_s,
    )


def compute_time_s(
    op: Operation,
    ctx: LayoutContext,
    hw: HardwareProfile,
    sizes: LayoutSizes | None = None,
) -> float:
    """Roofline time of ``op`` on one device: the slower of math and memory."""
    return op_compute(op, ctx, hw, sizes)[1]
