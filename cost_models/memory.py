"""Per-device memory: which tensors are alive together, and how big their slices are.

Model (ops run one at a time in lowering order, i.e. graph order):

* every variable (``param``: trainable; ``slot``: not trainable, e.g. optimizer
  moments and the step counter) lives for the whole step;
* every other op output (``activation``) lives from the op that produces it to
  its last consumer (to the end of the step if it is an exported output; only
  during its producer if nothing reads it).  ``identity``/``stop_gradient``
  outputs are the same buffer as their input, so they extend its life instead
  of adding a tensor;
* a live set is the tensors alive while one op runs (its inputs and outputs
  included).  Only live sets that no other live set contains are kept: for
  intervals, the set at step ``k`` is contained in another one exactly when no
  interval starts at ``k`` or none ends at ``k``;
* per-device bytes of a tensor are its slice bytes under the layout;
* :meth:`MemoryModel.peak_bytes_per_device` is the largest live set, plus,
  when the collectives are given, the largest result buffer of one collective
  (:func:`cost_models.collectives.collective_buffer_bytes`), as if it ran at
  the peak.

Ignored: allocator fragmentation and alignment, TensorFlow's own temporaries
inside a kernel, pending partial sums and their reduced copy being separate
buffers (counted once), gradients of variables that TF may keep alive longer,
and the fed input values on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cost_models.collectives import collective_buffer_bytes
from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import GraphError
from mtf_core.graph import Graph, Tensor
from mtf_core.ops.elementwise import Identity
from mtf_core.ops.variables import Variable
from mtf_core.shapes import Shape

PARAM = "param"
SLOT = "slot"
ACTIVATION = "activation"


@dataclass(frozen=True)
class TensorInfo:
    """One buffer of the step: its shape, dtype, unsplit bytes and kind."""

    name: str
    shape: Shape
    dtype: str
    kind: str  # param | slot | activation
    bytes: int  # unsplit

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(self.shape.dimension_names)

    def bytes_per_device(self, ctx: LayoutContext) -> int:
        return ctx.slice_bytes(self.shape, self.dtype)


@dataclass(frozen=True)
class MemoryUsage:
    """Per-device memory of one layout: the largest live set (its index and
    bytes, and how many of them are activations) and bytes by kind."""

    peak_bytes: int
    peak_live_set: int
    activation_peak_bytes: int
    bytes_by_kind: dict[str, int]


@dataclass(frozen=True)
class MemoryModel:
    """Tensors, their lifetimes, and the steps whose live sets are maximal.

    ``start[i]``/``end[i]``: the first and last step (op index) tensor ``i`` is
    alive; ``steps``: the steps whose live set no other step's contains, in
    order.  :attr:`live_sets` materializes those sets (indices into
    ``tensors``); :attr:`live_set_deltas` gives them as differences from the
    previous one, and the byte totals are computed by a sweep, so a deep
    graph's thousands of large live sets are never summed one by one.
    """

    tensors: tuple[TensorInfo, ...]
    start: tuple[int, ...]
    end: tuple[int, ...]
    steps: tuple[int, ...]

    @functools.cached_property
    def live_set_deltas(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """``(entering, leaving)`` tensor indices of each live set relative to
        the previous one (the first relative to the empty set)."""
        order_start = sorted(range(len(self.tensors)), key=lambda i: self.start[i])
        order_end = sorted(range(len(self.tensors)), key=lambda i: self.end[i])
        out = []
        si = ei = 0
        for k in self.steps:
            entering = []
            while si < len(order_start) and self.start[order_start[si]] <= k:
                entering.append(order_start[si])
                si += 1
            leaving = []
            while ei < len(order_end) and self.end[order_end[ei]] < k:
                leaving.append(order_end[ei])
                ei += 1
            # A tensor that both entered and left between two steps was never
            # in a kept set: report it in neither list.
            both = set(entering) & set(leaving)
            out.append(
                (
                    tuple(i for i in entering if i not in both),
                    tuple(i for i in leaving if i not in both),
                )
            )
        return tuple(out)

    @functools.cached_property
    def live_sets(self) -> tuple[frozenset[int], ...]:
        """The maximal live sets (indices into ``tensors``), in step order."""
        current: set[int] = set()
        out = []
        for entering, leaving in self.live_set_deltas:
            current.update(entering)
            current.difference_update(leaving)
            out.append(frozenset(current))
        return tuple(out)

    @functools.cached_property
    def _classes(self) -> tuple[list[tuple[Shape, str]], list[int]]:
        # Few distinct (shape, dtype) pairs: size each once per layout.
        index: dict[tuple[Shape, str], int] = {}
        of_tensor = [
            index.setdefault((t.shape, t.dtype), len(index)) for t in self.tensors
        ]
        return list(index), of_tensor

    def tensor_bytes_per_device(self, ctx: LayoutContext) -> list[int]:
        """Slice bytes of every tensor under ``ctx`` (raises LayoutError for
        layouts a tensor cannot have)."""
        classes, of_tensor = self._classes
        per_class = [ctx.slice_bytes(shape, dtype) for shape, dtype in classes]
        return [per_class[c] for c in of_tensor]

    def live_set_bytes(
        self, ctx: LayoutContext, kinds: Iterable[str] | None = None
    ) -> list[int]:
        """Per-device bytes of each live set, in ``live_sets`` order (only
        tensors of ``kinds``, if given)."""
        return self._sweep(self.tensor_bytes_per_device(ctx), kinds)

    def _sweep(self, sizes: list[int], kinds: Iterable[str] | None = None) -> list[int]:
        if kinds is not None:
            keep = set(kinds)
            sizes = [b if t.kind in keep else 0 for b, t in zip(sizes, self.tensors)]
        total = 0
        out = []
        for entering, leaving in self.live_set_deltas:
            total += sum(sizes[i] for i in entering) - sum(sizes[i] for i in leaving)
            out.append(total)
        return out

    def usage(self, ctx: LayoutContext) -> MemoryUsage:
        """Everything :func:`cost_models.evaluate` reports, in one pass."""
        sizes = self.tensor_bytes_per_device(ctx)
        by_set = self._sweep(sizes)
        by_kind = {PARAM: 0, SLOT: 0, ACTIVATION: 0}
        for b, t in zip(sizes, self.tensors):
            by_kind[t.kind] += b
        if not by_set:
            return MemoryUsage(0, -1, 0, by_kind)
        peak = max(range(len(by_set)), key=lambda i: (by_set[i], -i))
        acts = self._sweep(sizes, [ACTIVATION])[peak]
        return MemoryUsage(by_set[peak], peak, acts, by_kind)

    def peak_live_set(self, ctx: LayoutContext) -> int:
        """Index of the largest live set (the first one on ties)."""
        return self.usage(ctx).peak_live_set

    def peak_bytes_per_device(
        self, ctx: LayoutContext, collectives: Iterable[CollectiveSpec] = ()
    ) -> int:
        """The largest live set's bytes per device, plus the largest collective
        result buffer among ``collectives`` (none if not given)."""
        by_set = self.live_set_bytes(ctx)
        peak = max(by_set) if by_set else 0
        return peak + max_collective_buffer_bytes(collectives, ctx)

    def bytes_per_device_by_kind(self, ctx: LayoutContext) -> dict[str, int]:
        """Summed per-device bytes of all params, all slots and all activations."""
        return self.usage(ctx).bytes_by_kind

    def activation_peak_bytes(self, ctx: LayoutContext) -> int:
        """Activation bytes per device of the largest live set."""
        return self.usage(ctx).activation_peak_bytes

    def members(self, live_set: int) -> list[int]:
        """Tensor indices of live set number ``live_set``."""
        k = self.steps[live_set]
        return [
            i for i in range(len(self.tensors)) if self.start[i] <= k <= self.end[i]
        ]

    def largest_in_peak(
        self, ctx: LayoutContext, k: int = 5
    ) -> list[tuple[TensorInfo, int]]:
        """The ``k`` biggest tensors (with per-device bytes) of the largest live
        set: what to name when a layout does not fit."""
        if not self.steps:
            return []
        items = [
            (self.tensors[i], self.tensors[i].bytes_per_device(ctx))
            for i in self.members(self.peak_live_set(ctx))
        ]
        items.sort(key=lambda p: (-p[1], p[0].name))
        return items[:k]


def max_collective_buffer_bytes(
    collectives: Iterable[CollectiveSpec], ctx: LayoutContext
) -> int:
    return max(
        (collective_buffer_bytes(c, ctx.mesh_shape) for c in collectives), default=0
    )


def memory_model(graph: Graph, outputs: Sequence[Tensor] = ()) -> MemoryModel:
    """The tensors and live sets of ``graph`` (all ops, in graph order).

    ``outputs`` are exported at the end of the step, so they stay alive to the end.
    """
    ops = graph.operations
    last = len(ops) - 1
    tensors: list[TensorInfo] = []
    root: dict[Tensor, int] = {}  # tensor -> index of its buffer
    start: list[int] = []
    end: list[int] = []
    for k, op in enumerate(ops):
        for t in op.inputs:
            i = root[t]
            end[i] = max(end[i], k)
        if isinstance(op, Identity):
            root[op.outputs[0]] = root[op.inputs[0]]
            continue
        for t in op.outputs:
            if isinstance(op, Variable):
                kind = PARAM if op.trainable else SLOT
            else:
                kind = ACTIVATION
            root[t] = len(tensors)
            tensors.append(
                TensorInfo(
                    t.name,
                    t.shape,
                    t.dtype,
                    kind,
                    t.shape.size * dtypes.size_bytes(t.dtype),
                )
            )
            start.append(0 if kind != ACTIVATION else k)
            end.append(last if kind != ACTIVATION else k)
    for t in outputs:
        if not isinstance(t, Tensor) or t not in root:
            raise GraphError(
                f"output {t!r} is not a tensor of this graph; expected mtf.Tensors "
                "produced by its operations"
            )
        end[root[t]] = last
    return MemoryModel(
        tuple(tensors), tuple(start), tuple(end), _maximal_steps(tensors, start, end)
    )


def _maximal_steps(
    tensors: Sequence[TensorInfo], start: list[int], end: list[int]
) -> tuple[int, ...]:
    """Steps whose live set no other step's live set contains.

    For intervals, the set at step ``k`` is inside the set at ``k + 1`` unless
    an interval ends at ``k``, and inside the set at ``k - 1`` unless one starts
    at ``k``; and a set inside a later (earlier) one is inside the next
    (previous) one.  So the maximal sets are at the steps where an activation
    both starts and ends (variables are in every set and decide nothing).
    """
    acts = [i for i, t in enumerate(tensors) if t.kind == ACTIVATION]
    if not acts:
        return (0,) if tensors else ()
    starts = {start[i] for i in acts}
    ends = {end[i] for i in acts}
    return tuple(sorted(starts & ends))


def describe_overflow(
    model: MemoryModel, ctx: LayoutContext, capacity_bytes: int, k: int = 5
) -> str:
    """A readable reason a layout does not fit: bytes over, biggest tensors."""
    peak = model.peak_bytes_per_device(ctx)
    parts = [
        f"{t.name} [{t.shape}] {t.kind} {b:,} B"
        for t, b in model.largest_in_peak(ctx, k)
    ]
    over = peak - capacity_bytes
    verdict = f"{over:,} B over" if over > 0 else f"{-over:,} B to spare"
    return (
        f"peak live set needs {peak:,} B per device of {capacity_bytes:,} B "
        f"({verdict}); largest: " + "; ".join(parts)
    )
