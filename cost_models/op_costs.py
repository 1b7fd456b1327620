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
"""

from __future__ import annotations

from cost_models.hardware import HardwareProfile
from mtf_core.comm import LayoutContext
from mtf_core.graph import Operation
from mtf_core.ops.elementwise import Identity
from mtf_core.ops.random import RandomOp
from mtf_core.ops.variables import Variable

# Ops whose output is a view of existing memory: no HBM traffic of their own.
_ALIASING = (Variable, Identity)


def flops_per_device(op: Operation, ctx: LayoutContext) -> float:
    """``op.flops()`` divided over the mesh axes splitting one of its dims."""
    flops = op.flops()
    if not flops:
        return 0.0
    return flops / ctx.devices_splitting(sorted(op.all_dim_names))


def hbm_bytes_per_device(op: Operation, ctx: LayoutContext) -> int:
    """Local bytes ``op`` reads and writes (inputs plus outputs)."""
    if isinstance(op, _ALIASING):
        return 0
    if isinstance(op, RandomOp):
        return sum(t.size_bytes for t in op.outputs)
    return sum(ctx.slice_bytes(t.shape, t.dtype) for t in op.inputs + op.outputs)


def compute_time_s(op: Operation, ctx: LayoutContext, hw: HardwareProfile) -> float:
    """Roofline time of ``op`` on one device: the slower of math and memory."""
    return max(
        flops_per_device(op, ctx) / hw.peak_flops,
        hbm_bytes_per_device(op, ctx) / hw.hbm_bandwidth_bytes_per_s,
    )
