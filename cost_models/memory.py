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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from cost_models.collectives import collective_buffer_bytes
from cost_models.gc_pause import gc_paused
from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import GraphError
from mtf_core.graph import Graph, Tensor
from mtf_core.liveness import step_operations
from mtf_core.ops.elementwise import Identity
from mtf_core.ops.variables import Variable
from mtf_core.shapes import Shape


class MemoryKind(StrEnum):
    """What a buffer holds: a trainable parameter, an optimizer slot (or other
    non-trainable variable), or an activation of the step."""

    PARAM = "param"
    SLOT = "slot"
    ACTIVATION = "activation"


PARAM = MemoryKind.PARAM
SLOT = MemoryKind.SLOT
ACTIVATION = MemoryKind.ACTIVATION


@dataclass(frozen=True)
class TensorInfo:
    """One buffer of the step: its shape, dtype, unsplit bytes and kind."""

    name: str
    shape: Shape
    dtype: str
    kind: MemoryKind
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
    """Buffers, their lifetimes, and the steps whose live sets are maximal.

    Buffer ``i`` is the output ``buffers[i]`` (an identity's output shares its
    input's buffer), of kind ``kinds[i]`` and ``nbytes[i]`` unsplit bytes;
    ``start[i]``/``end[i]``: the first and last step (op index) it is alive;
    ``steps``: the steps whose live set no other step's contains, in order.
    :attr:`tensors` describes the buffers as :class:`TensorInfo` values.

    Live sets are never materialized to price a layout: each buffer joins one
    live set and leaves at a later one (:attr:`spans`), so every per-set total
    is one cumulative sum over those events.  :attr:`live_sets` and
    :attr:`live_set_deltas` give the sets themselves when asked.
    """

    buffers: tuple[Tensor, ...]
    kinds: tuple[MemoryKind, ...]
    nbytes: tuple[int, ...]
    start: tuple[int, ...]
    end: tuple[int, ...]
    steps: tuple[int, ...]

    @functools.cached_property
    def tensors(self) -> tuple[TensorInfo, ...]:
        """One :class:`TensorInfo` per buffer."""
        return tuple(
            TensorInfo(t.name, t.shape, t.dtype, kind, b)
            for t, kind, b in zip(self.buffers, self.kinds, self.nbytes)
        )

    @functools.cached_property
    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(joins, leaves)``: for each buffer, the index (into ``steps``) of
        the first live set it is in and of the first one after it is gone;
        ``len(steps)`` for never.  A buffer with ``joins == leaves`` is in no
        kept live set."""
        steps = np.asarray(self.steps, dtype=np.int64)
        joins = np.searchsorted(steps, np.asarray(self.start, dtype=np.int64), "left")
        leaves = np.searchsorted(steps, np.asarray(self.end, dtype=np.int64), "right")
        return joins, leaves

    @functools.cached_property
    def live_set_deltas(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """``(entering, leaving)`` tensor indices of each live set relative to
        the previous one (the first relative to the empty set); entering in
        order of ``start``, leaving in order of ``end`` (ties: by index)."""
        joins, leaves = self.spans
        n = len(self.steps)
        kept = joins != leaves  # a buffer that comes and goes between two kept sets

        def grouped(order: np.ndarray, at: np.ndarray) -> list[list[int]]:
            order = order[kept[order] & (at[order] < n)]
            bounds = np.cumsum(np.bincount(at[order], minlength=n)).tolist()
            flat = order.tolist()
            return [flat[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]

        entering = grouped(np.argsort(self.start, kind="stable"), joins)
        leaving = grouped(np.argsort(self.end, kind="stable"), leaves)
        return tuple((tuple(e), tuple(lv)) for e, lv in zip(entering, leaving))

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
    def _classes(self) -> tuple[list[tuple[Shape, str]], np.ndarray]:
        # Few distinct (shape, dtype) pairs: size each once per layout.
        index: dict[tuple[Shape, str], int] = {}
        of_tensor = [
            index.setdefault((t.shape, t.dtype), len(index)) for t in self.buffers
        ]
        return list(index), np.asarray(of_tensor, dtype=np.int64)

    @functools.cached_property
    def _dtype(self) -> type:
        # Exact integers: int64 unless the bytes could overflow it.
        return np.int64 if sum(self.nbytes) < 2**62 else object

    def _per_tensor(self, ctx: LayoutContext) -> np.ndarray:
        classes, of_tensor = self._classes
        per_class = [ctx.slice_bytes(shape, dtype) for shape, dtype in classes]
        sizes: np.ndarray = np.asarray(per_class, dtype=self._dtype)[of_tensor]
        return sizes

    def counts_by_class(self, mask: Sequence[bool]) -> dict[tuple[Shape, str], int]:
        """How many of the buffers ``mask`` selects have each (shape, dtype):
        with :meth:`selected_bytes_per_device`, the per-device bytes of a
        fixed selection under many layouts, each class sized once."""
        classes, of_tensor = self._classes
        picked = of_tensor[np.asarray(mask, dtype=bool)]
        counts = np.bincount(picked, minlength=len(classes))
        return {classes[c]: int(counts[c]) for c in np.nonzero(counts)[0]}

    @staticmethod
    def selected_bytes_per_device(
        counts: Mapping[tuple[Shape, str], int], ctx: LayoutContext
    ) -> int:
        """Slice bytes under ``ctx`` of buffers counted by
        :meth:`counts_by_class` (the same integers as summing
        :meth:`tensor_bytes_per_device` over them)."""
        return sum(
            n * ctx.slice_bytes(shape, dtype) for (shape, dtype), n in counts.items()
        )

    def tensor_bytes_per_device(self, ctx: LayoutContext) -> list[int]:
        """Slice bytes of every tensor under ``ctx`` (raises LayoutError for
        layouts a tensor cannot have)."""
        out: list[int] = self._per_tensor(ctx).tolist()
        return out

    def live_set_bytes(
        self, ctx: LayoutContext, kinds: Iterable[str] | None = None
    ) -> list[int]:
        """Per-device bytes of each live set, in ``live_sets`` order (only
        tensors of ``kinds``, if given)."""
        out: list[int] = self._sweep(self._per_tensor(ctx), kinds).tolist()
        return out

    def _sweep(
        self, sizes: np.ndarray, kinds: Iterable[str] | None = None
    ) -> np.ndarray:
        if kinds is not None:
            keep = set(kinds)
            mask = np.fromiter((k in keep for k in self.kinds), bool, len(self.kinds))
            sizes = np.where(mask, sizes, 0).astype(self._dtype)
        joins, leaves = self.spans
        events: np.ndarray = np.zeros(len(self.steps) + 1, dtype=self._dtype)
        np.add.at(events, joins, sizes)
        np.subtract.at(events, leaves, sizes)
        totals: np.ndarray = np.cumsum(events[:-1])
        return totals

    def usage(self, ctx: LayoutContext) -> MemoryUsage:
        """Everything :func:`cost_models.evaluate` reports, in one pass."""
        sizes = self._per_tensor(ctx)
        by_kind: dict[str, int] = {PARAM: 0, SLOT: 0, ACTIVATION: 0}
        for kind, b in zip(self.kinds, sizes.tolist()):
            by_kind[kind] += b
        if not self.steps:
            return MemoryUsage(0, -1, 0, by_kind)
        by_set = self._sweep(sizes)
        peak = int(np.argmax(by_set))  # the first of the largest
        acts = int(self._sweep(sizes, [ACTIVATION])[peak])
        return MemoryUsage(int(by_set[peak]), peak, acts, by_kind)

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
            i for i in range(len(self.buffers)) if self.start[i] <= k <= self.end[i]
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
    """The tensors and live sets of ``graph`` (in graph order; steps are op
    indices of the graph).

    ``outputs`` are exported at the end of the step, so they stay alive to the
    end.  With outputs, only the ops the step runs
    (:func:`mtf_core.liveness.step_operations`) make or read buffers; every
    variable is held (the step keeps all of them).
    """
    with gc_paused():
        return _memory_model(graph, outputs)


def _memory_model(graph: Graph, outputs: Sequence[Tensor]) -> MemoryModel:
    ops = graph.operations
    runs = set(step_operations(graph, outputs)) if outputs else None
    # The step's last op: variables and outputs are held to there.
    last = len(ops) - 1
    while runs is not None and last > 0 and ops[last] not in runs:
        last -= 1
    buffers: list[Tensor] = []
    kinds: list[MemoryKind] = []
    nbytes: list[int] = []
    start: list[int] = []
    end: list[int] = []
    root: dict[Tensor, int] = {}  # tensor -> index of its buffer
    # Deep graphs repeat a few shapes and dtypes: size each once.
    elements: dict[int, tuple[Shape, int]] = {}
    itemsize: dict[str, int] = {}
    for k, op in enumerate(ops):
        if runs is not None and op not in runs and not isinstance(op, Variable):
            continue
        for t in op.inputs:
            i = root[t]
            if end[i] < k:
                end[i] = k
        if isinstance(op, Identity):
            root[op.outputs[0]] = root[op.inputs[0]]
            continue
        if isinstance(op, Variable):
            kind, first, final = (PARAM if op.trainable else SLOT), 0, last
        else:
            kind, first, final = ACTIVATION, k, k
        for t in op.outputs:
            shape = t.shape
            hit = elements.get(id(shape))
            if hit is None or hit[0] is not shape:
                hit = elements[id(shape)] = (shape, shape.size)
            elem = itemsize.get(t.dtype)
            if elem is None:
                elem = itemsize[t.dtype] = dtypes.size_bytes(t.dtype)
            root[t] = len(buffers)
            buffers.append(t)
            kinds.append(kind)
            nbytes.append(hit[1] * elem)
            start.append(first)
            end.append(final)
    for t in outputs:
        if not isinstance(t, Tensor) or t not in root:
            raise GraphError(
                f"output {t!r} is not a tensor of this graph; expected mtf.Tensors "
                "produced by its operations"
            )
        end[root[t]] = last
    return MemoryModel(
        tuple(buffers),
        tuple(kinds),
        tuple(nbytes),
        tuple(start),
        tuple(end),
        _maximal_steps(kinds, start, end),
    )


def _maximal_steps(
    kinds: Sequence[str], start: list[int], end: list[int]
) -> tuple[int, ...]:
    """Steps whose live set no other step's live set contains.

    For intervals, the set at step ``k`` is inside the set at ``k + 1`` unless
    an interval ends at ``k``, and between two ends the sets only grow.  So
    the maximal sets are at the ends ``e`` of activations such that one
    starts after the previous end and by ``e`` (usually at ``e``: each op's
    output starts at its step; not when the op at ``e`` only reads, as an
    identity or an assignment does).  Variables are in every set and decide
    nothing.
    """
    acts = np.fromiter((k == ACTIVATION for k in kinds), bool, len(kinds))
    if not acts.any():
        return (0,) if len(kinds) else ()
    starts = np.sort(np.asarray(start)[acts])
    ends = np.unique(np.asarray(end)[acts])
    before = np.concatenate(([-1], ends[:-1]))
    new = np.searchsorted(starts, ends, "right") > np.searchsorted(
        starts, before, "right"
    )
    return tuple(ends[new].tolist())


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
