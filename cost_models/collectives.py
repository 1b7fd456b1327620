"""Alpha-beta time of each collective: pure functions over a :class:`LinkSpec`.

``nbytes`` is always what the lowering's counters record as
``bytes_per_device``: the slice each device contributes (its local input).
``n`` is the number of processors in each group.

============  ===========================================  =================
collective    bandwidth term                               latency term
============  ===========================================  =================
allreduce     2 (n-1)/n * nbytes / bw   (ring)             2 (n-1) * latency
allgather     (n-1) * nbytes / bw       (ring; n*nbytes    (n-1) * latency
              out)
alltoall      (n-1)/n * nbytes / bw     (pairwise)         (n-1) * latency
reducescatter (n-1)/n * nbytes / bw     (ring)             (n-1) * latency
shift         nbytes / bw                                  latency
broadcast     nbytes / bw               (pipelined)        ceil(log2 n) * latency
============  ===========================================  =================

A calibrated profile (``hw.rates`` set) uses the same terms with the rates
fitted per collective kind and backend (:mod:`cost_models.op_classes`):
``rate[kind_bytes] * bandwidth term + rate[kind_steps] * latency steps``.

What these ignore: contention between concurrent collectives on other axes,
overlap with compute, the reduction arithmetic, topology beyond "the slowest
link of the group", and protocol switches for small messages (the latency term
stands in for them).
"""

from __future__ import annotations

import math

from cost_models.hardware import CostModelError, HardwareProfile, LinkSpec
from cost_models.op_classes import collective_features, priced
from mtf_core.comm import CollectiveSpec
from mtf_core.shapes import ShapeLike, convert_to_shape


def _check(nbytes: float, n: int) -> None:
    if nbytes < 0:
        raise CostModelError(f"collective of {nbytes} bytes; expected bytes >= 0")
    if n < 1:
        raise CostModelError(f"collective over {n} processors; expected n >= 1")


def allreduce_time_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring allreduce: reduce-scatter then allgather of ``nbytes`` per device."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    return (
        2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s
        + 2 * (n - 1) * link.latency_s
    )


def allgather_time_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring allgather (allconcat): each device ends with ``n * nbytes``."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    return (n - 1) * nbytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


def alltoall_time_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Pairwise all-to-all: each device keeps 1/n of its ``nbytes``, sends the rest."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


def reduce_scatter_time_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring reduce-scatter: each device contributes ``nbytes`` and keeps the
    sum of its ``1/n`` shard (half of a ring allreduce)."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


def shift_time_s(nbytes: float, link: LinkSpec) -> float:
    """Every device sends ``nbytes`` to a neighbour at once (one step)."""
    _check(nbytes, 1)
    return nbytes / link.bandwidth_bytes_per_s + link.latency_s


def broadcast_time_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Pipelined tree broadcast of ``nbytes`` from one device to ``n``."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    return (
        nbytes / link.bandwidth_bytes_per_s + math.ceil(math.log2(n)) * link.latency_s
    )


def collective_time_s(
    spec: CollectiveSpec, mesh_shape: ShapeLike, hw: HardwareProfile
) -> float:
    """Seconds ``spec`` takes on ``hw``.

    Over several mesh axes (allreduce only, in practice) the group has the
    product of their sizes as ``n`` and runs at the slowest of their links.
    """
    shape = convert_to_shape(mesh_shape)
    sizes = {d.name: d.size for d in shape}
    for a in spec.mesh_axes:
        if a not in sizes:
            raise CostModelError(
                f"{spec.kind} over mesh axis {a!r}, which mesh [{shape}] does not have"
            )
    n = math.prod(sizes[a] for a in spec.mesh_axes)
    if n == 1:
        return 0.0
    if spec.kind == "reducescatter":
        # Priced by the link's alpha-beta terms, calibrated profile or not
        # (no calibration measures reduce-scatters yet).
        link = hw.slowest_link(spec.mesh_axes, shape)
        return reduce_scatter_time_s(spec.bytes_per_device, n, link)
    rates = hw.rates
    if rates is not None:
        return priced(collective_features(spec, n), rates)
    link = hw.slowest_link(spec.mesh_axes, shape)
    b = spec.bytes_per_device
    if spec.kind == "allreduce":
        return allreduce_time_s(b, n, link)
    if spec.kind == "allconcat":
        return allgather_time_s(b, n, link)
    if spec.kind == "alltoall":
        return alltoall_time_s(b, n, link)
    if spec.kind == "shift":
        return shift_time_s(b, link)
    if spec.kind == "broadcast":
        return broadcast_time_s(b, n, link)
    raise CostModelError(
        f"unknown collective kind {spec.kind!r}; expected allreduce, allconcat, "
        "alltoall, shift or broadcast"
    )


def collective_buffer_bytes(spec: CollectiveSpec, mesh_shape: ShapeLike) -> int:
    """Bytes of the buffer a collective's result needs on each device: ``n *
    nbytes`` for an allconcat, ``nbytes`` for the others (results are not
    written in place)."""
    if spec.kind == "allconcat":
        shape = convert_to_shape(mesh_shape)
        sizes = {d.name: d.size for d in shape}
        return spec.bytes_per_device * math.prod(sizes[a] for a in spec.mesh_axes)
    return spec.bytes_per_device


def axes_key(spec: CollectiveSpec) -> str:
    """How a collective is keyed in ``comm_s_by_axis``: its axes joined by ``,``
    (the same key the lowering's counters use)."""
    return ",".join(spec.mesh_axes)
