"""Mesh TF's ``auto_mtf.layout_optimizer``: the layout of an mtf graph that
minimises peak memory per device, as Mesh TF's own memory-only integer
program (``mesh_tensorflow.auto_mtf.layout_optimizer`` under
``mtf_core.compat``).  The planner proper (:mod:`layout_planner.planner`)
prices time and communication too; this is the narrower model Mesh TF
programs and tests build by name.

Model.  ``T``: the splittable tensor dims (``LayoutValidator``); ``M``: the
mesh dims; ``S``: the distinct sets ``dims(o) ∩ T`` of every operation and
tensor ``o``; ``A(s)``: the assignments of ``s``, maps from a subset of ``s``
one-to-one into ``M``.  A schedule (``scheduler.minimize_peak_memory``) gives
``live_k``, the tensors in memory at each step ``k``.

* ``x[t,m] ∈ {0,1}``: dim ``t`` is split over mesh dim ``m``.
* ``y[s,a] ∈ {0,1}``: the dims of ``s`` are laid out exactly as ``a``.
* ``z ∈ [0, Σ bytes]``: peak bytes per device.

Constraints::

    Σ_m x[t,m] ≤ 1                       each dim on at most one mesh dim
    Σ_{t∈s} x[t,m] ≤ 1                   an operation's dims (s) on distinct mesh dims
    x[t,m] = 0  unless |m| divides t     (LayoutValidator.is_valid_assignment)
    Σ_a y[s,a] = 1                       one assignment per set
    y[s,a] ⇒ x[t,a(t)]  (t assigned)     the assignment agrees with x
    x[t,m] ⇒ ¬y[s,a]    (t unassigned in a, every m)
    Σ_{v∈live_k} Σ_a bytes(v | a)·y[s(v),a] ≤ z      for every step k

Objective: minimise ``(|T| + 1)·z − Σ x``: the least peak memory, then the
most dims split (smaller tensors, less repeated work).  The model's variables
are per dim set, not per operation, so a graph of many like operations stays
small.  :meth:`LayoutOptimizer.evaluate_layout` is the independent
evaluator: the peak bytes of a layout under the same schedule.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from layout_planner.errors import PlannerError, SolverError
from layout_planner.ortools_import import cp_sat_import
from mtf_core.compat.auto_mtf import scheduler
from mtf_core.compat.auto_mtf.memory_estimator import MemoryEstimator

with cp_sat_import():
    from ortools.sat.python import cp_model

_log = logging.getLogger(__name__)

Assignment = dict[str, str]  # tensor dim name -> mesh dim name


def _global_var_name(splittable_dimension: str, mesh_dimension: str) -> str:
    """Name of ``x[t,m]``: ``x_(t:m)``."""
    return f"x_({splittable_dimension}:{mesh_dimension})"


def _local_var_name(
    splittable_dimensions: Iterable[str], assignment: Mapping[str, str]
) -> str:
    """Name of ``y[s,a]``: the dims of ``s`` in order, each ``t:m`` if
    assigned, e.g. ``y_(channel:y,hidden)``."""
    parts = [
        f"{t}:{assignment[t]}" if t in assignment else t
        for t in sorted(splittable_dimensions)
    ]
    return "y_(" + ",".join(parts) + ")"


def _generate_assignments(
    splittable_dimensions: Iterable[str], mesh_dimension_to_size: Mapping[str, int]
) -> list[Assignment]:
    """Every one-to-one map from a subset of the dims into the mesh dims
    (the empty map included), smallest first."""
    dims = sorted(splittable_dimensions)
    mesh = sorted(mesh_dimension_to_size)
    out: list[Assignment] = []
    for k in range(min(len(dims), len(mesh)) + 1):
        for chosen in itertools.combinations(dims, k):
            for onto in itertools.permutations(mesh, k):
                out.append(dict(zip(chosen, onto)))
    return out


def _parse_layout(layout: str) -> list[tuple[str, str]]:
    pairs = []
    for part in filter(None, (p.strip() for p in layout.split(";"))):
        dim, sep, mesh_dim = part.partition(":")
        if not sep or not dim or not mesh_dim:
            raise SolverError(
                f"layout {layout!r}: {part!r} is not 'tensor_dim:mesh_dim'"
            )
        pairs.append((dim, mesh_dim))
    return pairs


class LayoutOptimizer:
    """The integer program of the module docstring for one graph and mesh.

    ``solve()`` returns the layout as Mesh TF writes it (``"a:m2;c:m1"``,
    pairs sorted); ``evaluate_layout(layout)`` its peak bytes per device.
    """

    def __init__(
        self,
        memory_estimator: MemoryEstimator,
        scheduler_alg: str = "LIST",
        max_time_s: float = 60.0,
    ) -> None:
        self._estimator = memory_estimator
        self._scheduler_alg = scheduler_alg
        self._max_time_s = max_time_s
        self._layout_validator = memory_estimator.get_layout_validator()
        self._graph = memory_estimator.get_graph_interface()
        self._dims = sorted(self._layout_validator.splittable_mtf_dimension_names)
        self._mesh = self._layout_validator.mesh_dimension_name_to_size
        self._memory_contents: list[frozenset[str]] | None = None
        self._model = cp_model.CpModel()
        self._collect_dim_sets()
        self._create_variables()
        self._add_layout_constraints()
        self._add_memory_constraints()
        self._set_objective()

    # -- building the model ------------------------------------------------------
    def _splittable(self, names: Iterable[str]) -> frozenset[str]:
        return frozenset(names) & frozenset(self._dims)

    def _collect_dim_sets(self) -> None:
        g = self._graph
        self._op_sets = {
            self._splittable(g.get_operation_mtf_dimension_names(op))
            for op in g.get_all_operation_names()
        }
        self._tensor_set = {
            t: self._splittable(g.get_tensor_mtf_dimension_names(t))
            for t in g.get_all_tensor_names()
        }
        sets = self._op_sets | set(self._tensor_set.values())
        self._assignments = {s: _generate_assignments(s, self._mesh) for s in sets}

    def _create_variables(self) -> None:
        m = self._model
        self._x = {
            (t, md): m.new_bool_var(_global_var_name(t, md))
            for t in self._dims
            for md in self._mesh
        }
        self._y = {
            (s, _local_var_name(s, a)): m.new_bool_var(_local_var_name(s, a))
            for s, assignments in self._assignments.items()
            for a in assignments
        }
        bound = sum(
            self._graph.get_tensor_size(t)
            for t in self._tensor_set
            if self._graph.is_tensor_on_canonical_device(t)
        )
        self._z = m.new_int_var(0, bound, "z")

    def _add_layout_constraints(self) -> None:
        m, x = self._model, self._x
        for t in self._dims:
            m.add(sum(x[t, md] for md in self._mesh) <= 1)
            for md in self._mesh:
                if not self._layout_validator.is_valid_assignment(t, md):
                    m.add(x[t, md] == 0)
        for s in self._op_sets:
            for md in self._mesh:
                if len(s) > 1:
                    m.add(sum(x[t, md] for t in s) <= 1)
        for s, assignments in self._assignments.items():
            ys = [self._y[s, _local_var_name(s, a)] for a in assignments]
            m.add(sum(ys) == 1)
            for a, y in zip(assignments, ys):
                for t in s:
                    if t in a:
                        m.add_implication(y, x[t, a[t]])
                    else:
                        for md in self._mesh:
                            m.add_implication(x[t, md], ~y)

    def _add_memory_constraints(self) -> None:
        g = self._graph
        bytes_of: dict[str, Any] = {}
        for t, s in self._tensor_set.items():
            if not g.is_tensor_on_canonical_device(t):
                bytes_of[t] = 0
                continue
            bytes_of[t] = sum(
                g.get_tensor_size(t, a, self._mesh) * self._y[s, _local_var_name(s, a)]
                for a in self._assignments[s]
            )
        for live in self._get_memory_contents():
            self._model.add(sum(bytes_of[t] for t in live) <= self._z)

    def _set_objective(self) -> None:
        scale = len(self._dims) + 1
        self._model.minimize(scale * self._z - sum(self._x.values()))

    def _get_memory_contents(self) -> list[frozenset[str]]:
        if self._memory_contents is None:
            order = scheduler.minimize_peak_memory(self._graph, self._scheduler_alg)
            self._memory_contents = self._graph.compute_memory_contents_under_schedule(
                list(order)
            )
        return self._memory_contents

    # -- solving and evaluating ------------------------------------------------
    def solve(self, print_solution: bool = False) -> str:
        """The optimal layout, ``"dim:mesh_dim;..."`` sorted; raises
        :class:`SolverError` if CP-SAT finds no solution."""
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self._max_time_s
        solver.parameters.num_workers = 1  # deterministic
        solver.parameters.random_seed = 0
        status = solver.solve(self._model)
        if status == cp_model.FEASIBLE:
            _log.warning(
                "layout optimizer: time limit %.0f s reached; the layout may not "
                "be optimal",
                self._max_time_s,
            )
        elif status != cp_model.OPTIMAL:
            raise SolverError(
                f"layout optimizer: CP-SAT returned {solver.status_name(status)} "
                f"for {len(self._dims)} dims on mesh {self._mesh}"
            )
        chosen = sorted(
            f"{t}:{md}" for (t, md), v in self._x.items() if solver.value(v)
        )
        if print_solution:
            print(f"peak bytes per device {solver.value(self._z)}; {chosen}")
        return ";".join(chosen)

    def evaluate_layout(self, layout: str) -> float:
        """Peak bytes per device of ``layout`` under the model's schedule
        (pairs naming an unsplittable dim are left out, as Mesh TF does)."""
        split: Assignment = {}
        for dim, mesh_dim in _parse_layout(layout):
            if mesh_dim not in self._mesh:
                raise PlannerError(
                    f"layout {layout!r}: mesh dim {mesh_dim!r} is not one of "
                    f"{sorted(self._mesh)}"
                )
            if dim in self._dims:
                split[dim] = mesh_dim
            else:
                _log.warning("layout optimizer: skipping unsplittable dim %s", dim)
        g = self._graph
        size = {
            t: g.get_tensor_size(t, split, self._mesh)
            if g.is_tensor_on_canonical_device(t)
            else 0
            for t in self._tensor_set
        }
        return float(
            max(
                (sum(size[t] for t in live) for live in self._get_memory_contents()),
                default=0,
            )
        )


__all__ = [
    "LayoutOptimizer",
    "SolverError",
    "_generate_assignments",
    "_global_var_name",
    "_local_var_name",
]
