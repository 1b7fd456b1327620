"""Which collectives a layout implies, without TensorFlow.

The lowering *executes* these plans and the cost model *prices* them, so both
read the same code: :class:`LayoutContext` answers "which mesh axis splits this
dim, how big is a slice", and :func:`plan_layout_change` says how a tensor moves
from one layout to another.

Transition table (per mesh axis m):

============================  ============================  ============
from                          to                            collective
============================  ============================  ============
split(a on m)                 replicated on m               allconcat(m)
partial sum over m            replicated on m               allreduce(m)
replicated on m               split(a on m)                 allsplit (local, free)
split(a on m)                 split(b on m)                 alltoall(m)
============================  ============================  ============

``bytes_per_device`` of a collective is the size of the slice each device
contributes (its local input slice).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from mtf_core import dtypes
from mtf_core.errors import LayoutError
from mtf_core.layout import (
    LayoutRules,
    TensorLayout,
    check_layout_rules,
    convert_to_layout_rules,
)
from mtf_core.shapes import Shape, convert_to_shape

if TYPE_CHECKING:
    from mtf_core.graph import Operation


class CollectiveKind(StrEnum):
    """The collectives a lowering issues (and the cost model prices).

    A ``StrEnum``: members equal their strings, so records read from JSON and
    callers that pass ``"allreduce"`` keep working; an unknown kind is an
    error where a record or spec is made, not a silently unpriced entry.
    """

    ALLREDUCE = "allreduce"
    ALLCONCAT = "allconcat"
    ALLTOALL = "alltoall"
    ALLSPLIT = "allsplit"  # local: no communication
    SHIFT = "shift"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reducescatter"


class Reduction(StrEnum):
    """How an allreduce (or a reduction op) combines values."""

    SUM = "SUM"
    MAX = "MAX"
    MIN = "MIN"
    LOGICAL_OR = "LOGICAL_OR"
    LOGICAL_AND = "LOGICAL_AND"

    @classmethod
    def parse(cls, value: Reduction | str) -> Reduction:
        """``value`` as a Reduction (Mesh TF programs pass the names as
        strings); an unknown name is a ``ValueError`` that lists the known."""
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(r.value for r in cls)
            raise ValueError(
                f"unknown reduction {value!r}; expected one of {known}"
            ) from None


#: Each member by its string (what CollectiveKind(s) and Reduction(s) return).
_KINDS = {k.value: k for k in CollectiveKind}
_REDUCTIONS = {r.value: r for r in Reduction}


@dataclass(frozen=True)
class CollectiveSpec:
    """A collective an op will issue under a layout.

    ``pending`` marks an allreduce(SUM) the lowering defers: sums of pending
    tensors over the same axes stay pending, and it is issued once, when a
    non-sum consumer (or an export) first needs the value.
    """

    kind: str  # a CollectiveKind (canonicalized)
    mesh_axes: tuple[str, ...]
    bytes_per_device: int
    pending: bool = False
    reduction: str = "SUM"  # a Reduction (canonicalized)

    def __post_init__(self) -> None:
        # Members by their strings first: the cost model makes these by the
        # hundred thousand, and an enum's call is slow.
        kind = self.kind
        if type(kind) is not CollectiveKind:
            got = _KINDS.get(kind) if type(kind) is str else None
            object.__setattr__(self, "kind", got or CollectiveKind(kind))
        reduction = self.reduction
        if type(reduction) is not Reduction:
            got_r = _REDUCTIONS.get(reduction) if type(reduction) is str else None
            object.__setattr__(self, "reduction", got_r or Reduction(reduction))


@dataclass
class LayoutContext:
    """A mesh shape and layout rules, with the questions ops and costs ask."""

    mesh_shape: Shape
    rules: LayoutRules
    _cache: dict[Shape, TensorLayout] = field(default_factory=dict, repr=False)

    @classmethod
    def make(cls, mesh_shape: Any, rules: Any) -> LayoutContext:
        mesh_shape = convert_to_shape(mesh_shape)
        rules = convert_to_layout_rules(rules)
        check_layout_rules(rules, mesh_shape)
        return cls(mesh_shape, rules)

    @property
    def ndims(self) -> int:
        return len(self.mesh_shape)

    @property
    def size(self) -> int:
        return self.mesh_shape.size

    def mesh_axis(self, dim: Any) -> int | None:
        """Index of the mesh axis splitting ``dim`` (a name or Dimension), or None."""
        return self.rules.tensor_dimension_to_mesh_axis(dim, self.mesh_shape)

    def live_axis(self, axis: int | None) -> int | None:
        """``axis`` if it is a mesh axis of size > 1, else None (an axis of size 1
        splits nothing)."""
        return axis if axis is not None and self.mesh_shape[axis].size > 1 else None

    def effective_mesh_axis(self, dim: Any) -> int | None:
        """Like :meth:`mesh_axis` but None for axes of size 1 (they split nothing)."""
        return self.live_axis(self.mesh_axis(dim))

    def axis_name(self, axis: int) -> str:
        return self.mesh_shape[axis].name

    def axis_names(self, axes: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.mesh_shape[a].name for a in sorted(axes))

    def tensor_layout(self, shape: Any) -> TensorLayout:
        shape = convert_to_shape(shape)
        layout = self._cache.get(shape)
        if layout is None:
            layout = self.rules.tensor_layout(shape, self.mesh_shape)
            self._cache[shape] = layout
        return layout

    def local_shape(self, shape: Shape, layout: TensorLayout) -> list[int]:
        """Per-device slice shape of ``shape`` under ``layout`` (any layout, not
        only the rules' own)."""
        return [
            d.size if m is None else d.size // self.mesh_shape[m].size
            for d, m in zip(shape, layout)
        ]

    def slice_shape(self, shape: Any) -> list[int]:
        """Per-device slice shape of ``shape`` under the rules' layout."""
        shape = convert_to_shape(shape)
        return self.local_shape(shape, self.tensor_layout(shape))

    def slice_size(self, shape: Any) -> int:
        return math.prod(self.slice_shape(shape))

    def slice_bytes(self, shape: Any, dtype: Any) -> int:
        return self.slice_size(shape) * dtypes.size_bytes(dtype)

    def reduced_axes(self, dim_names: Sequence[str]) -> list[int]:
        """Mesh axes (size > 1) that split any of ``dim_names``, sorted."""
        return sorted(
            {a for n in dim_names if (a := self.effective_mesh_axis(n)) is not None}
        )

    def devices_splitting(self, dim_names: Iterable[str]) -> int:
        """Product of the sizes of the mesh axes splitting any of ``dim_names``."""
        axes = {self.mesh_axis(n) for n in dim_names}
        return math.prod(self.mesh_shape[a].size for a in axes if a is not None)

    def check_op_dims(self, what: str, dim_names: Sequence[str]) -> None:
        """Raises if two of an op's dims share a mesh axis of size > 1."""
        used: dict[int, str] = {}
        for n in sorted(dim_names):
            a = self.effective_mesh_axis(n)
            if a is None:
                continue
            if a in used:
                raise LayoutError(
                    f"{what} would split both {used[a]!r} and {n!r} over mesh "
                    f"dimension {self.axis_name(a)!r}; one op's dims cannot share a "
                    "mesh dimension"
                )
            used[a] = n

    def check_op(self, op: Operation) -> None:
        """:meth:`check_op_dims` over every dim of ``op``'s inputs and outputs:
        ops computed slice by slice cannot put two of their dims on one axis."""
        self.check_op_dims(f"{op.op_type} {op.name}", sorted(op.all_dim_names))


def allreduce_collectives(
    ctx: LayoutContext,
    shape: Shape,
    dtype: Any,
    axes: Sequence[int],
    pending: bool = True,
    reduction: str = "SUM",
) -> list[CollectiveSpec]:
    """The allreduce over mesh ``axes`` (indices) of a result of ``shape``
    (none when ``axes`` is empty): what ops that sum (or max, min) partial
    results over split dims issue.  ``pending``: the lowering defers it
    (see :class:`CollectiveSpec`)."""
    if not axes:
        return []
    return [
        CollectiveSpec(
            "allreduce",
            ctx.axis_names(axes),
            ctx.slice_bytes(shape, dtype),
            pending=pending,
            reduction=reduction,
        )
    ]


@dataclass(frozen=True)
class LayoutStep:
    """One step of a layout change: ``kind`` over ``mesh_axis``."""

    kind: str  # CollectiveKind: alltoall | allconcat | allsplit
    mesh_axis: int
    split_axis: int | None  # tensor axis split (alltoall, allsplit)
    concat_axis: int | None  # tensor axis gathered (alltoall, allconcat)
    bytes_per_device: int  # local slice bytes going in (0 for allsplit)

    def __post_init__(self) -> None:
        kind = self.kind
        if type(kind) is not CollectiveKind:
            got = _KINDS.get(kind) if type(kind) is str else None
            object.__setattr__(self, "kind", got or CollectiveKind(kind))


def plan_layout_change(
    ctx: LayoutContext,
    shape: Shape,
    dtype: Any,
    old_layout: TensorLayout,
    new_layout: TensorLayout,
) -> list[LayoutStep]:
    """The steps that move a tensor of ``shape`` between two layouts.

    A tensor dim is never split over two mesh axes at once: the slices of the
    inner axis would interleave (device i of the outer axis would hold pieces
    i, i+n, ... instead of one contiguous block).  So a dim loses its old mesh
    axis before it gains a new one.  Alltoalls go as soon as their target dim
    is free (they keep slices small for what follows); an allconcat goes early
    only to free such a target; when moves block each other in a cycle (two
    axes swapping dims) one becomes an allconcat now and an allsplit at the
    end.  Then the remaining allconcats, then the allsplits.  Mesh axes of size
    1 are ignored.
    """
    if old_layout == new_layout:
        return []  # most of the layout changes the planner prices
    nd = ctx.ndims
    old_m2t = old_layout.mesh_axis_to_tensor_axis(nd)
    new_m2t = new_layout.mesh_axis_to_tensor_axis(nd)
    local = ctx.local_shape(shape, old_layout)
    elem = dtypes.size_bytes(dtype)
    live = [m for m in range(nd) if ctx.mesh_shape[m].size > 1]
    # tensor axis -> the mesh axis splitting it right now
    split_by = {old_m2t[m]: m for m in live if old_m2t[m] is not None}
    moves = [m for m in live if old_m2t[m] not in (None, new_m2t[m])]
    concats = [m for m in moves if new_m2t[m] is None]
    moves = [m for m in moves if m not in concats]
    splits = [m for m in live if old_m2t[m] is None and new_m2t[m] is not None]
    steps: list[LayoutStep] = []

    def concat(m: int) -> None:
        a = old_m2t[m]
        assert a is not None
        steps.append(LayoutStep("allconcat", m, None, a, math.prod(local) * elem))
        local[a] *= ctx.mesh_shape[m].size
        del split_by[a]

    while moves or concats:
        ready = [m for m in moves if new_m2t[m] not in split_by]
        if ready:
            m = ready[0]
            a, b = old_m2t[m], new_m2t[m]
            assert a is not None and b is not None
            steps.append(LayoutStep("alltoall", m, b, a, math.prod(local) * elem))
            local[b] //= ctx.mesh_shape[m].size
            local[a] *= ctx.mesh_shape[m].size
            del split_by[a]
            split_by[b] = m
            moves.remove(m)
            continue
        targets = {new_m2t[m] for m in moves}
        freeing = [m for m in concats if old_m2t[m] in targets]
        if freeing or not moves:
            m = (freeing or concats)[0]
            concats.remove(m)
        else:  # a cycle of moves: break it
            m = moves.pop(0)
            splits.append(m)
        concat(m)
    for m in splits:
        b = new_m2t[m]
        assert b is not None
        steps.append(LayoutStep("allsplit", m, b, None, 0))
        local[b] //= ctx.mesh_shape[m].size
    return steps


def layout_change_collectives(
    ctx: LayoutContext,
    shape: Shape,
    dtype: Any,
    old_layout: TensorLayout,
    new_layout: TensorLayout,
) -> list[CollectiveSpec]:
    """The collectives (allsplit excluded: it moves no data) of a layout change."""
    return [
        CollectiveSpec(s.kind, (ctx.axis_name(s.mesh_axis),), s.bytes_per_device)
        for s in plan_layout_change(ctx, shape, dtype, old_layout, new_layout)
        if s.kind != "allsplit"
    ]
