"""The cost tables of a planning problem, as values.

A :class:`~layout_planner.problem.LayoutProblem` prices each set of free
dims under every local assignment into a :class:`DimsetTable`; a table priced
once can fill an equal one of another problem (:class:`PricedTable`); a full
layout priced from the tables is a :class:`TableCost`; :class:`BuildStats`
says how big a problem is and how long its phases took.  :func:`orbit_images`
finds the assignments that a permutation of interchangeable mesh axes maps
onto one already priced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from layout_planner.dim_graph import Assignment


@dataclass
class DimsetTable:
    """Costs of every local assignment of one set of free dims."""

    dims: tuple[str, ...]
    assignments: Sequence[Assignment]
    factor: list[int]
    time_s: list[float]
    compute_s: list[float]
    comm_s: list[dict[str, float]]
    buffer_bytes: list[int]
    invalid: list[str | None]
    #: The part of ``time_s`` that runs once per step (cost_models.units).
    once_s: list[float] = field(default_factory=list)
    num_units: int = 0
    index: dict[Assignment, int] = field(default_factory=dict)
    # Assignments under which some unit changes a layout in several steps
    # (see LayoutProblem._price_entry): their axis images are priced too.
    ordered: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class PricedTable:
    """A priced :class:`DimsetTable`'s entries, to fill an equal table of
    another problem with (:class:`LayoutProblem`'s ``table_memo``)."""

    time_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    comm_s: tuple[tuple[tuple[str, float], ...], ...]
    buffer_bytes: tuple[int, ...]
    invalid: tuple[str | None, ...]
    once_s: tuple[float, ...]
    ordered: frozenset[int]

    @classmethod
    def of(cls, table: DimsetTable) -> PricedTable:
        return cls(
            tuple(table.time_s),
            tuple(table.compute_s),
            tuple(tuple(c.items()) for c in table.comm_s),
            tuple(table.buffer_bytes),
            tuple(table.invalid),
            tuple(table.once_s),
            frozenset(table.ordered),
        )

    def fill(self, table: DimsetTable) -> None:
        table.time_s = list(self.time_s)
        table.compute_s = list(self.compute_s)
        table.comm_s = [dict(c) for c in self.comm_s]
        table.buffer_bytes = list(self.buffer_bytes)
        table.invalid = list(self.invalid)
        table.once_s = list(self.once_s)
        table.ordered = set(self.ordered)


@dataclass(frozen=True)
class TableCost:
    """A layout priced from the tables (see :meth:`LayoutProblem.table_cost`)."""

    time_s: float
    compute_s: float
    comm_s_by_axis: tuple[tuple[str, float], ...]
    peak_bytes: int
    invalid: str | None  # why the lowering rejects the layout, if it does
    #: The part of ``time_s`` that runs once per step (the rest runs once per
    #: micro-batch); 0 unless the analysis was made with ``once_from``.
    once_s: float = 0.0
    #: Seconds the time objective counts besides the tables' own
    #: (:meth:`LayoutProblem.add_time`); not part of ``time_s``.
    extra_s: float = 0.0


@dataclass(frozen=True)
class BuildStats:
    """How big the problem is and how long each phase took (seconds)."""

    num_ops: int
    num_units: int
    num_signatures: int
    num_dims: int
    num_free_dims: int
    num_dimsets: int
    num_assignments: int
    num_unit_pricings: int
    num_live_sets: int
    num_memory_rows: int
    collect_s: float
    price_s: float
    memory_s: float


def orbit_images(
    table: DimsetTable, perms: Sequence[tuple[int, ...]]
) -> dict[int, tuple[int, tuple[int, ...]]]:
    """For each assignment of ``table`` that is not the smallest of its orbit
    under ``perms``: that smallest one (the canonical, priced) and the
    permutation taking the canonical to it."""
    if not perms:
        return {}

    def rank(asg: Assignment) -> tuple[int, ...]:
        return tuple(-1 if a is None else a for a in asg)

    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    for k, asg in enumerate(table.assignments):
        best = rank(asg)
        best_perm: tuple[int, ...] | None = None
        for p in perms:
            img = tuple(None if a is None else p[a] for a in asg)
            if rank(img) < best:
                best, best_perm = rank(img), p
        canon = tuple(None if a < 0 else a for a in best)
        if best_perm is not None and canon in table.index:
            inverse = [0] * len(best_perm)
            for src, dst in enumerate(best_perm):
                inverse[dst] = src
            out[k] = (table.index[canon], tuple(inverse))
    return out


def invalid_cost(reason: str | None) -> TableCost:
    """The price of a layout the lowering rejects, saying why."""
    return TableCost(float("inf"), float("inf"), (), 0, reason or "invalid layout")
