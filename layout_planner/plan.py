"""What the planner returns: :class:`LayoutPlan` and the records inside it.

All records are frozen dataclasses with ``to_dict()`` / ``from_dict()`` (the
REST API serves ``LayoutPlan.to_dict()``; ``from_dict`` rebuilds an equal
plan).  Seconds and bytes are in the field names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cost_models.costs import Cost, StepTotals
from cost_models.hardware import HardwareProfile
from layout_planner.errors import PlannerError
from layout_planner.program import Objective, SolveStatus
from mtf_core.errors import MtfError
from mtf_core.layout import LayoutRules, convert_to_layout_rules
from mtf_core.shapes import Shape, convert_to_shape

FORMAT_VERSION = 1


@dataclass(frozen=True)
class PlanCost(StepTotals):
    """A layout's step time, communication and peak memory, as the planner's
    integer program prices it (the sum of the cost units' exact costs; equal
    to ``cost_models.evaluate`` for every layout, which the tests check)."""

    compute_s: float
    comm_s_by_axis: tuple[tuple[str, float], ...]
    peak_memory_bytes: int
    memory_capacity_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "comm_s_by_axis": dict(self.comm_s_by_axis),
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanCost:
        return cls(
            compute_s=float(d["compute_s"]),
            comm_s_by_axis=tuple(
                sorted((str(k), float(v)) for k, v in d["comm_s_by_axis"].items())
            ),
            peak_memory_bytes=int(d["peak_memory_bytes"]),
            memory_capacity_bytes=int(d["memory_capacity_bytes"]),
        )


@dataclass(frozen=True)
class Candidate:
    """One of the top-k layouts, best first (``rank`` 1 is the plan)."""

    rank: int
    layout_rules: LayoutRules
    cost: PlanCost

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "layout_rules": str(self.layout_rules),
            "rules": self.layout_rules.as_dict(),
            "cost": self.cost.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        return cls(
            int(d["rank"]),
            convert_to_layout_rules(d["layout_rules"]),
            PlanCost.from_dict(d["cost"]),
        )


@dataclass(frozen=True)
class Baseline:
    """A named hand-written layout, priced for comparison (``cost`` None and a
    ``note`` saying why when it does not apply to this graph and mesh)."""

    name: str
    layout_rules: LayoutRules | None
    cost: PlanCost | None
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layout_rules": None
            if self.layout_rules is None
            else str(self.layout_rules),
            "cost": None if self.cost is None else self.cost.to_dict(),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Baseline:
        rules = d.get("layout_rules")
        cost = d.get("cost")
        return cls(
            str(d["name"]),
            None if rules is None else convert_to_layout_rules(rules),
            None if cost is None else PlanCost.from_dict(cost),
            str(d.get("note", "")),
        )


@dataclass(frozen=True)
class Alternative:
    """What one other choice for a dim would give (everything else unchanged)."""

    mesh_axis: str | None  # None: not split
    time_s: float | None  # None when the layout is invalid
    peak_memory_bytes: int | None
    invalid: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mesh_axis": self.mesh_axis,
            "time_s": self.time_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "invalid": self.invalid,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Alternative:
        return cls(
            d.get("mesh_axis"),
            None if d.get("time_s") is None else float(d["time_s"]),
            None if d.get("peak_memory_bytes") is None else int(d["peak_memory_bytes"]),
            d.get("invalid"),
        )


@dataclass(frozen=True)
class DimChoice:
    """Where one dimension name went, and why."""

    name: str
    sizes: tuple[int, ...]
    mesh_axis: str | None
    reason: str
    alternatives: tuple[Alternative, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sizes": list(self.sizes),
            "mesh_axis": self.mesh_axis,
            "reason": self.reason,
            "alternatives": [a.to_dict() for a in self.alternatives],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DimChoice:
        return cls(
            str(d["name"]),
            tuple(int(s) for s in d["sizes"]),
            d.get("mesh_axis"),
            str(d["reason"]),
            tuple(Alternative.from_dict(a) for a in d.get("alternatives", ())),
        )


def mesh_text(mesh: Shape | str) -> str:
    """A mesh shape as users write it, ``'x:2;y:4'`` (a tensor shape prints
    ``'x:2,y:4'``): plans, trials and the service echo meshes in this form."""
    return ";".join(f"{d.name}:{d.size}" for d in convert_to_shape(mesh).dims)


@dataclass(frozen=True)
class MeshTrial:
    """One mesh shape the mesh-shape search tried."""

    mesh_shape: str
    status: SolveStatus
    objective_value: float | None
    layout_rules: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mesh_shape": self.mesh_shape,
            "status": self.status.value,
            "objective_value": self.objective_value,
            "layout_rules": self.layout_rules,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeshTrial:
        return cls(
            str(d["mesh_shape"]),
            SolveStatus(d["status"]),
            d.get("objective_value"),
            d.get("layout_rules"),
        )


@dataclass(frozen=True)
class SolverStats:
    """How the plan was solved.

    ``objective_value`` and ``best_bound`` are in seconds (objective ``time``)
    or bytes (``memory``); ``gap = (objective - bound) / objective``.
    ``verified``: ``cost_models.evaluate`` priced the plan and agreed.
    ``memory_rows_added``: live-set constraints the solver needed (it adds
    one only when an answer breaks it; ``problem["num_memory_rows"]`` exist).
    """

    status: SolveStatus
    objective_value: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    plan_time_s: float
    build_time_s: float
    num_solves: int
    num_variables: int
    num_constraints: int
    num_workers: int
    seed: int
    time_limit_s: float
    solved_in: str
    top_k_complete: bool
    verified: bool
    problem: Mapping[str, Any] = field(default_factory=dict)
    memory_rows_added: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["status"] = self.status.value
        out["problem"] = dict(self.problem)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SolverStats:
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        kw["status"] = SolveStatus(d["status"])
        kw["problem"] = dict(d.get("problem", {}))
        return cls(**kw)


@dataclass(frozen=True)
class LayoutPlan:
    """The planner's answer for one graph on one mesh shape.

    ``layout_rules`` is the best layout found (for ``status`` infeasible: the
    layout with the smallest peak memory, which still does not fit, and
    ``reason`` says by how much and which tensors are biggest).  ``cost`` is the
    planner's price of it; ``evaluation`` is ``cost_models.evaluate``'s (with
    the collectives in lowering order), when the plan was verified.
    """

    mesh_shape: Shape
    layout_rules: LayoutRules
    objective: Objective
    status: SolveStatus
    cost: PlanCost
    candidates: tuple[Candidate, ...]
    baselines: tuple[Baseline, ...]
    solver: SolverStats
    dims: tuple[DimChoice, ...]
    hardware: HardwareProfile
    reason: str | None = None
    evaluation: Cost | None = field(default=None, compare=False)
    mesh_trials: tuple[MeshTrial, ...] = ()
    dimension_graph: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def fits(self) -> bool:
        return self.cost.fits

    @property
    def ok(self) -> bool:
        """A layout was found and it fits in memory."""
        return self.status.has_solution and self.fits

    def explain(self) -> str:
        """Why each dim is split where it is (or not split), as text."""
        lines = [
            f"mesh [{mesh_text(self.mesh_shape)}], objective {self.objective.value}, "
            f"status {self.status.value}: {self.layout_rules or '(nothing split)'}",
            f"  step time {fmt_s(self.cost.time_s)} (compute "
            f"{fmt_s(self.cost.compute_s)}, communication {fmt_s(self.cost.comm_s)}"
            + "".join(f", {a}: {fmt_s(s)}" for a, s in self.cost.comm_s_by_axis)
            + f"); peak memory {fmt_bytes(self.cost.peak_memory_bytes)} of "
            f"{fmt_bytes(self.cost.memory_capacity_bytes)} per device",
        ]
        if self.reason:
            lines.append(f"  {self.reason}")
        for d in self.dims:
            where = f"-> {d.mesh_axis}" if d.mesh_axis else "-> whole"
            lines.append(
                f"  {d.name} ({'/'.join(map(str, d.sizes))}) {where}: {d.reason}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "mesh_shape": mesh_text(self.mesh_shape),
            "layout_rules": str(self.layout_rules),
            "rules": self.layout_rules.as_dict(),
            "objective": self.objective.value,
            "status": self.status.value,
            "fits": self.fits,
            "reason": self.reason,
            "cost": self.cost.to_dict(),
            "evaluation": None
            if self.evaluation is None
            else self.evaluation.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
            "baselines": [b.to_dict() for b in self.baselines],
            "solver": self.solver.to_dict(),
            "dims": [d.to_dict() for d in self.dims],
            "hardware": self.hardware.to_dict(),
            "mesh_trials": [t.to_dict() for t in self.mesh_trials],
            "dimension_graph": dict(self.dimension_graph),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayoutPlan:
        """Rebuilds a plan from :meth:`to_dict` (``evaluation`` is not rebuilt:
        its dict form stays in ``to_dict`` for readers, not for round trips)."""
        if not isinstance(d, Mapping):
            raise PlannerError(
                f"layout plan {d!r} is not a mapping; expected LayoutPlan.to_dict()'s "
                "form"
            )
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise PlannerError(
                f"layout plan format_version {version!r} is not supported; "
                f"expected {FORMAT_VERSION}"
            )
        try:
            return cls._from_dict(d)
        except MtfError:
            raise  # names the value already
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise PlannerError(
                f"layout plan dict is malformed ({type(e).__name__}: {e}); expected "
                "LayoutPlan.to_dict()'s form"
            ) from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> LayoutPlan:
        return cls(
            mesh_shape=convert_to_shape(d["mesh_shape"]),
            layout_rules=convert_to_layout_rules(d["layout_rules"]),
            objective=Objective.parse(d["objective"]),
            status=SolveStatus(d["status"]),
            cost=PlanCost.from_dict(d["cost"]),
            candidates=tuple(Candidate.from_dict(c) for c in d["candidates"]),
            baselines=tuple(Baseline.from_dict(b) for b in d["baselines"]),
            solver=SolverStats.from_dict(d["solver"]),
            dims=tuple(DimChoice.from_dict(x) for x in d["dims"]),
            hardware=HardwareProfile.from_dict(d["hardware"]),
            reason=d.get("reason"),
            mesh_trials=tuple(MeshTrial.from_dict(t) for t in d.get("mesh_trials", ())),
            dimension_graph=dict(d.get("dimension_graph", {})),
        )


def _in_units(x: float, units: tuple[tuple[str, float], ...]) -> tuple[float, str]:
    """``x`` in the largest of ``units`` (largest first) in which, rounded to
    three digits, it is at least 1; and never 1000 or more of a unit below
    the largest (1000-1023 MiB are 0.977-0.999 GiB, not ``1e+03 MiB``)."""
    a = abs(x)
    for i, (name, size) in enumerate(units):
        shown = float(f"{a / size:.3g}")
        if shown >= 1 or i == len(units) - 1:
            if shown >= 1000 and i > 0:
                name, size = units[i - 1]
            return x / size, name
    raise AssertionError("unreachable: the last unit always matches")


def fmt_s(s: float) -> str:
    """Seconds, human-readable (``1.5 ms``, ``-20 us``)."""
    if s == 0:
        return "0 s"
    value, unit = _in_units(s, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)))
    return _digits(value, unit)


def fmt_bytes(n: float) -> str:
    """Bytes, human-readable (``3 MiB``, ``-512 KiB``, ``12 B``)."""
    value, unit = _in_units(
        n, (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0))
    )
    return f"{int(n)} B" if unit == "B" else _digits(value, unit)


def _digits(value: float, unit: str) -> str:
    """Three significant digits, or whole ones from 1000 up (``1,234 s``)."""
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}"
