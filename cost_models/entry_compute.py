"""Compute-only op units priced under every assignment of a table at once.

Most of a graph's ops issue no collective of their own under any layout:
elementwise ops, casts, variables and their updates (whose ``communication``
is :class:`~mtf_core.graph.Operation`'s, none), and einsums and sums (whose
sums over split dims are left pending: the deferred units price them).
Such an op unit costs its roofline compute and nothing else
(:func:`cost_models.op_costs.op_compute`):

    max(flops / devices splitting its dims / peak, local bytes / HBM bandwidth)

where the local bytes are its inputs' and outputs' slices.  The planner's
tables price every unit under every assignment of a dim set, so for these
units :func:`compute_seconds` does that arithmetic for all the table's
assignments in one pass over plain integers, instead of building a layout
context per assignment and walking the general path
(:meth:`cost_models.units.UnitPricer.cost`).  It computes the same floats in
the same order, so a table is the same to the last bit either way.

An assignment the fast arithmetic cannot vouch for (a tensor that would put
two dims on one axis or split a dim unevenly, an einsum with two dims on one
axis) gets None: the caller prices that entry the general way, which raises
the lowering's own error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cost_models.hardware import HardwareProfile
from mtf_core import dtypes
from mtf_core.graph import Operation, Tensor
from mtf_core.ops.einsum import Einsum
from mtf_core.ops.reduce import Reduce

__all__ = ["compute_only", "compute_seconds"]


def compute_only(op: Operation) -> bool:
    """Whether ``op``'s unit is its compute alone under every layout: it
    issues no collective itself (an einsum's or a sum's sums stay pending)."""
    if isinstance(op, Einsum):
        return type(op).communication is Einsum.communication
    if isinstance(op, Reduce):
        return type(op).communication is Reduce.communication and (
            op.reduction == "SUM"
        )
    return type(op).communication is Operation.communication


def compute_seconds(
    op: Operation,
    flops: float,
    tensors: tuple[int, tuple[Tensor, ...]],
    hw: HardwareProfile,
    axis_sizes: Sequence[int],
    dims: Sequence[str],
    assignments: Sequence[tuple[int | None, ...]],
) -> list[float | None]:
    """The roofline seconds of compute-only ``op`` (its ``flops`` and
    :func:`~cost_models.op_costs.hbm_tensors` ``tensors``) under each
    assignment of ``dims`` to mesh axes (indices into ``axis_sizes``; the
    op's other dims unsplit), or None where the general path must decide."""
    fixed, moved = tensors
    where = {d: j for j, d in enumerate(dims)}
    # Per moved tensor: its bytes over the dims no assignment splits (its
    # element bytes times their sizes, in the dims' order as the general
    # path multiplies them, which integers make exact in any order), and
    # (index in dims, size) of the others.
    shapes = []
    for t in moved:
        whole = dtypes.size_bytes(t.dtype)
        split = []
        for d in t.shape.dims:
            j = where.get(d.name)
            if j is None:
                whole *= d.size
            else:
                split.append((j, d.size))
        shapes.append((whole, split))
    own = [where[n] for n in sorted(op.all_dim_names) if n in where]
    check_op = isinstance(op, Einsum)
    peak, bandwidth = hw.peak_flops, hw.hbm_bandwidth_bytes_per_s
    out: list[float | None] = []
    for asg in assignments:
        total = fixed
        ok = True
        for nbytes, split in shapes:
            used = 0
            for j, size in split:
                a = asg[j]
                if a is None:
                    nbytes *= size
                    continue
                n = axis_sizes[a]
                if used >> a & 1 or size % n:
                    ok = False
                    break
                used |= 1 << a
                nbytes *= size // n
            if not ok:
                break
            total += nbytes
        axes = {a for j in own if (a := asg[j]) is not None}
        if not ok or (check_op and len(axes) < sum(asg[j] is not None for j in own)):
            out.append(None)
            continue
        per_device = flops / math.prod(axis_sizes[a] for a in axes) if flops else 0.0
        out.append(max(per_device / peak, total / bandwidth))
    return out
