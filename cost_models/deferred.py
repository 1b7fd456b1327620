"""Deferred (pending) allreduces, simulated exactly as the lowering runs them.

An einsum or ``reduce_sum`` over a split dim leaves its allreduce(SUM) pending
(:class:`mtf_core.lazy_sum.LazyAllreduceSum`).  The lowering then:

* keeps ``x + y`` pending when ``x`` and ``y`` are both still pending over the
  same mesh axes and ``x``, ``y`` and the sum have equal shapes;
* keeps ``add_n(xs)`` pending when every input is still pending over one set
  of axes;
* passes a pending value through ``identity``/``stop_gradient`` unchanged (the
  output *is* the input's pending value, so forcing either forces both);
* issues the allreduce once, when anything else reads the value (in the order
  the consumer reads its inputs) or when the value is exported.

This module mirrors those rules without TensorFlow.  :func:`static_deferral`
says, from the graph alone, which tensors *may* be pending under some layout;
the cost units group their producers and consumers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.graph import Operation, Tensor
from mtf_core.ops.conv import Conv2d, Conv2dBackpropFilter, Conv2dBackpropInput
from mtf_core.ops.einsum import Einsum
from mtf_core.ops.elementwise import AddN, BinaryOp, Identity
from mtf_core.ops.indexing import Gather
from mtf_core.ops.reduce import Reduce
from mtf_core.ops.reshape import gather_collectives
from mtf_core.ops.slicing import WholeDimOp

_DEFERRING = (Gather, Conv2d, Conv2dBackpropInput, Conv2dBackpropFilter)


class _Pending:
    """One LazyAllreduceSum: its axes, its slice bytes, whether it ran yet."""

    __slots__ = ("axes", "bytes_per_device", "issued")

    def __init__(self, axes: tuple[str, ...], bytes_per_device: int) -> None:
        self.axes = axes
        self.bytes_per_device = bytes_per_device
        self.issued = False


class Issued(NamedTuple):
    """A collective that runs while an op lowers; ``forced``: a deferred
    allreduce of one of its inputs (else one of the op's own)."""

    spec: CollectiveSpec
    forced: bool


def _sum_spec(p: _Pending) -> CollectiveSpec:
    return CollectiveSpec("allreduce", p.axes, p.bytes_per_device)


class DeferredAllreduces:
    """Tracks pending allreduces while walking ops in lowering order."""

    def __init__(self, ctx: LayoutContext) -> None:
        self.ctx = ctx
        self._pending: dict[Tensor, _Pending] = {}

    def force(self, t: Tensor) -> list[CollectiveSpec]:
        """What reading ``t`` (or exporting it) issues: its allreduce, once."""
        p = self._pending.get(t)
        if p is None or p.issued:
            return []
        p.issued = True
        return [_sum_spec(p)]

    def _live(self, t: Tensor) -> _Pending | None:
        p = self._pending.get(t)
        return None if p is None or p.issued else p

    def step(self, op: Operation, own: Sequence[CollectiveSpec]) -> list[Issued]:
        """Lowers ``op`` whose own collectives (``op.communication``) are ``own``.

        Returns what runs while lowering it, in order: each pending input
        allreduce it forces (``forced=True``) and each of its own collectives
        that runs now.  A pending collective in ``own`` becomes the pending
        value of ``op.outputs[0]`` instead.
        """
        if not own and not any(t in self._pending for t in op.inputs):
            return []  # nothing of its own, nothing pending to read or pass on
        if isinstance(op, Identity):
            p = self._pending.get(op.inputs[0])
            if p is not None:
                self._pending[op.outputs[0]] = p
            return []
        if isinstance(op, BinaryOp) and op.fn_name == "add":
            x, y = op.inputs
            out = op.outputs[0]
            px, py = self._live(x), self._live(y)
            if (
                px is not None
                and py is not None
                and px.axes == py.axes
                and x.shape == y.shape == out.shape
            ):
                self._keep_pending(out, px.axes)
                return []
        if isinstance(op, AddN):
            ps = [self._live(t) for t in op.inputs]
            axes = {p.axes for p in ps if p is not None}
            if all(p is not None for p in ps) and len(axes) == 1:
                self._keep_pending(op.outputs[0], axes.pop())
                return []
        consume = getattr(op, "consume_pending", None)
        if consume is not None:
            # An op that takes its input's pending sum as it is (a
            # reduce-scatter, mtf_core.ops.stored): what it issues instead.
            p = self._live(op.inputs[0])
            if p is not None:
                got = consume(self.ctx, p.axes, p.bytes_per_device)
                return [Issued(c, True) for c in got] + [
                    Issued(c, False) for c in own if not c.pending
                ]
        done: list[Issued] = []
        per_input = self._per_input(op, own)
        if per_input is not None:
            # Reads and gathers one input after the other.
            for t, specs in zip(op.inputs, per_input):
                done.extend(Issued(c, True) for c in self.force(t))
                done.extend(Issued(c, False) for c in specs)
            return done
        for t in op.inputs:
            p = self._live(t)
            if p is not None:  # force(t), inlined: most inputs are not pending
                p.issued = True
                done.append(Issued(_sum_spec(p), True))
        for spec in own:
            if spec.pending:
                self._pending[op.outputs[0]] = _Pending(
                    spec.mesh_axes, spec.bytes_per_device
                )
            else:
                done.append(Issued(spec, False))
        return done

    def _keep_pending(self, out: Tensor, axes: tuple[str, ...]) -> None:
        self._pending[out] = _Pending(axes, self.ctx.slice_bytes(out.shape, out.dtype))

    def _per_input(
        self, op: Operation, own: Sequence[CollectiveSpec]
    ) -> list[list[CollectiveSpec]] | None:
        """For ops that lower input by input (read, then gather), ``own`` split
        by input; None for ops that read all inputs first."""
        if not isinstance(op, WholeDimOp) or len(op.inputs) < 2 or not own:
            return None
        parts = [gather_collectives(self.ctx, t, [op.dim_name]) for t in op.inputs]
        if [c for p in parts for c in p] != list(own):
            return None
        return parts


def may_defer(op: Operation) -> bool:
    """Whether ``op`` leaves an allreduce pending under some layout.

    An op family can say so itself with a ``may_defer_allreduce`` attribute (a
    bool, or a method taking no arguments); else the known families answer.
    Saying yes too often only makes cost units bigger; saying no wrongly makes
    :func:`cost_models.unit_cost` raise.
    """
    declared = getattr(op, "may_defer_allreduce", None)
    if declared is not None:
        return bool(declared() if callable(declared) else declared)
    if isinstance(op, Einsum):
        return bool(op.reduced_dims)
    if isinstance(op, Reduce):
        return op.reduction == "SUM" and bool(op.reduced_dims)
    # A lookup along a split dim sums the devices' partial lookups; a conv with
    # split summed channels (or batch, for the filter gradient) sums partials.
    return isinstance(op, _DEFERRING)


@dataclass(frozen=True)
class StaticDeferral:
    """Which tensors may be pending under some layout, and who produces them.

    ``carriers`` are those tensors; ``propagators`` the identity/add/add_n ops
    that may keep one pending; ``producers`` the ops that may start one;
    ``reads[op]`` the carriers ``op`` reads while they may still be pending
    (an input another op already forced is not among them).
    """

    carriers: frozenset[Tensor]
    producers: frozenset[Operation]
    propagators: frozenset[Operation]
    reads: dict[Operation, tuple[Tensor, ...]]


def static_deferral(ops: Iterable[Operation]) -> StaticDeferral:
    """The may-be-pending closure of ``ops`` (in lowering order).

    A pending value is forced by its first reader that is not a propagator;
    after that it is never pending again, whatever the layout.  So an ``add``
    whose input was already read by such an op cannot keep a sum pending (in a
    residual stream ``x + f(x)``, ``f`` reads ``x`` first), and later readers
    of a forced value are not tied to its producer.  This keeps deferred units
    per layer instead of one unit chained through the whole graph.
    """
    carriers: set[Tensor] = set()
    producers: set[Operation] = set()
    propagators: set[Operation] = set()
    reads: dict[Operation, tuple[Tensor, ...]] = {}
    root: dict[Tensor, Tensor] = {}  # identity outputs share their input's sum
    forced: set[Tensor] = set()  # roots some op has certainly forced

    def live(t: Tensor) -> bool:
        return t in carriers and root.get(t, t) not in forced

    for op in ops:
        live_in = tuple(t for t in op.inputs if live(t))
        if live_in:
            reads[op] = live_in
        keeps = False
        if may_defer(op):
            producers.add(op)
            carriers.add(op.outputs[0])
        elif isinstance(op, Identity) and live(op.inputs[0]):
            keeps = True
            root[op.outputs[0]] = root.get(op.inputs[0], op.inputs[0])
        elif isinstance(op, BinaryOp) and op.fn_name == "add":
            x, y = op.inputs
            keeps = live(x) and live(y) and x.shape == y.shape == op.outputs[0].shape
        elif isinstance(op, AddN):
            keeps = all(live(t) for t in op.inputs)
        if keeps:
            propagators.add(op)
            carriers.add(op.outputs[0])
        else:
            forced.update(root.get(t, t) for t in live_in)
    return StaticDeferral(
        frozenset(carriers), frozenset(producers), frozenset(propagators), reads
    )
