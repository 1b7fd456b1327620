"""The layout integer program in OR-tools CP-SAT, and the solve loop.

OR-tools is imported through :func:`layout_planner.ortools_import.cp_sat_import`
(``RTLD_DEEPBIND``), so that TensorFlow's native libraries, loaded before or
after, cannot break CP-SAT in this process (see that module).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from layout_planner import cp_proto
from layout_planner.errors import SolverError
from layout_planner.ortools_import import cp_sat_import

with cp_sat_import():
    from ortools.sat.python import cp_model
from layout_planner.program import (
    IntegerProgram,
    Objective,
    ProgramResult,
    Solution,
    SolveParams,
    SolveStatus,
)

# Every CP-SAT status, mapped explicitly.
_STATUS = {
    cp_model.OPTIMAL: SolveStatus.OPTIMAL,
    cp_model.FEASIBLE: SolveStatus.FEASIBLE,
    cp_model.INFEASIBLE: SolveStatus.INFEASIBLE,
    cp_model.MODEL_INVALID: SolveStatus.MODEL_INVALID,
    cp_model.UNKNOWN: SolveStatus.UNKNOWN,
}

# CP-SAT settings that are not per request.  These programs are small and
# pure-Boolean: presolve probing, and presolve loops after the first, cost more
# than the whole search; the model breaks its own axis symmetries, so CP-SAT's
# symmetry detection finds nothing worth its time (together about a fifth of a
# 3-axis solve, bench/planner.py).  Likewise the SAT solver's inprocessing
# (probing, transitive reduction between restarts) and merging the at-most-one
# constraints into maximal cliques when the model loads: without them the
# scale search's programs solve in 0.65-0.74 of the time and the planner's in
# 0.75, to the same answers (bench/cpsat_settings.py,
# tests/test_planner_cpsat.py).
TUNING: dict[str, int | float | bool] = {
    "cp_model_probing_level": 0,
    "linearization_level": 2,
    "symmetry_level": 0,
    "max_presolve_iterations": 1,
    "use_sat_inprocessing": False,
    "merge_at_most_one_work_limit": 0.0,
}
# The tie-break solves (the time fixed at its optimum, the answer unique) run
# without the LP relaxation, which costs them more than it saves on the scale
# search's programs; the answers are the same (tests/test_planner_cpsat.py).
_TIEBREAK_LINEARIZATION = 0
# Memory rows: how many of the largest live sets start in the model, and how
# many violated ones a round adds (a deep model has thousands of live sets;
# few ever bind).
_SEED_ROWS = 8
_ROWS_PER_ROUND = 8
# The least time a phase gets, even when the plan's budget is spent, so that a
# tie-break always has a chance to confirm its (usually trivial) optimum.
_MIN_PHASE_S = 0.05


class LayoutModel:
    """CP-SAT model of "which mesh axis splits each dimension name".

    Variables::

        x[d,m] in {0,1}   dim name d is split over mesh axis m (only for axes
                          of size > 1 that divide d, and d splittable)
        z[S,a] in {0,1}   dim set S (the free dims of a cost unit or a tensor)
                          takes local assignment a
        B >= 0            the largest collective result buffer (bytes)
        P >= 0            peak bytes per device (memory objective only)

    Constraints::

        sum_m x[d,m] <= 1                       one axis per dim
        x[d,m] + x[e,m] <= 1                    d, e share a tensor
        x[d,b] <= sum_{e < d} x[e,a]            a, b interchangeable axes, a < b
        sum_a z[S,a] = 1,  z[S,a] = 0 if the lowering rejects a
        x[d,m] = sum_{a : a(d) = m} z[S,a]      for every d in S  (links z to x)
        B >= sum_a buf[S,a] z[S,a]              for every S
        c_L + sum_{S,a} m[L,S,a] z[S,a] + B <= cap      (objective time)
                                            <= P        (objective memory)

    for every non-dominated live set L (``c_L``: bytes no layout splits;
    ``m[L,S,a]``: bytes per device, under a, of L's tensors whose free dims S
    hosts: unsplit bytes over the product of the axis sizes a gives them).

    The dim sets S are the maximal ones: a cost unit or tensor whose free dims
    are a subset of another's is priced in that one's table (fewer, larger
    tables make a tighter linear relaxation than many overlapping ones).

    Objective: ``T = T0 + sum_{S,a} t[S,a] z[S,a]`` (integer picoseconds of
    compute + communication summed over the cost units whose free dims are
    S).  ``time``: minimise T.  ``memory``: minimise P, then T.  Ties: minimise
    ``sum_d W_d code_d`` with ``code_d = sum_m (m + 1) x[d,m]`` (0: not split)
    and ``W_d = (axes + 1)^(rank of d from the end)``, dims in name order, i.e.
    the lexicographically smallest choice vector.

    Symmetry: when swapping mesh axes a < b (same size, same link) maps every
    table entry to an equal one, only the layout whose first dim (in name
    order) on a or b is on a is kept: it is the one the tie-break prefers, so
    nothing the answer could be is cut away (and the top-k are distinct up to
    such swaps).
    """

    def __init__(self, program: IntegerProgram, max_weight: int = 2**60) -> None:
        self.program = program
        # Tie-break weights are powers of (axes + 1); weighted sums stay below
        # this (well inside CP-SAT's int64 arithmetic).
        self.max_weight = max_weight
        self.model = cp_model.CpModel()
        self._create_variables()
        self._add_layout_constraints()
        self._add_memory_constraints()
        self._set_objective()

    # -- phases ------------------------------------------------------------------
    def _create_variables(self) -> None:
        p = self.program
        m = self.model
        self.x = [m.new_bool_var(p.x_labels[i]) for i in range(p.num_x)]
        self._x_of_index = {v.index: i for i, v in enumerate(self.x)}
        self.time_var: cp_model.IntVar | None = None
        self.time_floor_ps = p.time_offset_ps
        self.z = [
            [m.new_bool_var(f"z{s}_{a}") for a in range(len(ds.choices))]
            for s, ds in enumerate(p.dimsets)
        ]
        max_buf = max((max(ds.buffer_bytes, default=0) for ds in p.dimsets), default=0)
        self._max_buffer = max_buf
        self.buffer = m.new_int_var(0, max_buf, "B") if max_buf > 0 else None
        self.peak = None
        if p.objective is Objective.MEMORY:
            self.peak = m.new_int_var(0, self._peak_upper_bound(max_buf), "P")

    def _add_layout_constraints(self) -> None:
        p = self.program
        m = self.model
        for xs in p.dim_x:
            if len(xs) > 1:
                m.add_at_most_one(self.x[i] for i in xs)
        for i, j in p.conflicts:
            m.add_at_most_one(self.x[i], self.x[j])
        x = [v.index for v in self.x]
        for i, js in p.precedence:  # x_i <= sum_j x_j
            cp_proto.add_linear(
                m, [x[i], *(x[j] for j in js)], [1] + [-1] * len(js), hi=0
            )
        buffer = None if self.buffer is None else self.buffer.index
        for s, ds in enumerate(p.dimsets):
            zs = self.z[s]
            m.add_exactly_one(zs)
            z = [v.index for v in zs]
            for a, bad in enumerate(ds.invalid):
                if bad:
                    cp_proto.add_linear(m, [z[a]], [1], 0, 0)
            for pos, d in enumerate(ds.dims):
                for xi in p.dim_x[d]:  # x = the z whose choice puts d there
                    on = [z[a] for a, ch in enumerate(ds.choices) if ch[pos] == xi]
                    cp_proto.add_linear(m, [x[xi], *on], [1] + [-1] * len(on), 0, 0)
            if buffer is not None and any(ds.buffer_bytes):  # B >= its buffer
                cp_proto.add_linear(
                    m, [buffer, *z], [1, *(-b for b in ds.buffer_bytes)], lo=0
                )

    def _add_memory_constraints(self) -> None:
        """Adds the live sets most likely to bind; :meth:`violated_rows` finds
        the others a solution breaks, and :func:`solve_program` adds them."""
        p = self.program
        self.row_added = np.zeros(p.num_rows, dtype=bool)
        self._factors = [np.asarray(f, dtype=np.int64) for _, f in p.tensor_classes]
        self._class_host = np.array([s for s, _ in p.tensor_classes], dtype=np.int64)
        if not p.num_rows:
            return
        largest = p.row_bytes.sum(axis=1) + p.row_constants
        if self.peak is None:
            # Under the capacity, rows start in the model only when memory is
            # tight: when a live set split as far as any layout splits it
            # still needs over half the device.  Otherwise few answers break
            # any row (a deep model on a big device), and each seeded row
            # costs every solve its presolve; the lazy rounds add the rare
            # binding ones.
            most_split = (
                p.row_bytes
                // np.array([f.max() for f in self._factors], dtype=np.int64)
            ).sum(axis=1) + p.row_constants
            largest = np.where(2 * most_split > p.capacity_bytes, largest, -1)
        order = np.argsort(-largest, kind="stable")
        self.add_rows([int(r) for r in order[:_SEED_ROWS] if largest[r] >= 0])

    def add_rows(
        self, rows: Sequence[int], clone: cp_model.CpModel | None = None
    ) -> None:
        """Adds live-set rows to the model (and to ``clone``, a clone of it)."""
        for r in rows:
            if self.row_added[r]:
                continue
            self.row_added[r] = True
            for model in (self.model, clone) if clone is not None else (self.model,):
                terms = self.row_terms(r)
                if self.buffer is not None:
                    terms = terms.plus(self.buffer.index)
                if self.peak is not None:
                    terms.at_most_var(model, self.peak.index)
                else:
                    terms.at_most(model, self.program.capacity_bytes)

    def row_terms(self, r: int) -> Terms:
        p = self.program
        coefs: dict[int, np.ndarray] = {}
        for t, b in enumerate(p.row_bytes[r]):
            if b:
                s = int(self._class_host[t])
                add = int(b) // self._factors[t]
                coefs[s] = coefs[s] + add if s in coefs else add
        idx: list[int] = []
        cs: list[int] = []
        for s in sorted(coefs):
            for a, c in enumerate(coefs[s]):
                if c:
                    idx.append(self.z[s][a].index)
                    cs.append(int(c))
        return Terms(idx, cs, int(p.row_constants[r]))

    def violated_rows(self, values: Sequence[int], limit: int) -> list[int]:
        """Rows not yet in the model that the solution ``values`` breaks
        (live set plus largest buffer over ``limit``), worst first."""
        p = self.program
        if not p.num_rows:
            return []
        picks = [next(a for a, v in enumerate(zs) if values[v.index]) for zs in self.z]
        factors = np.array(
            [f[picks[self._class_host[t]]] for t, f in enumerate(self._factors)],
            dtype=np.int64,
        )
        buffer = max(
            (ds.buffer_bytes[picks[s]] for s, ds in enumerate(p.dimsets)), default=0
        )
        need = (p.row_bytes // factors).sum(axis=1) + p.row_constants + buffer
        over = np.flatnonzero((need > limit) & ~self.row_added)
        over = over[np.argsort(-need[over], kind="stable")]
        return [int(r) for r in over[:_ROWS_PER_ROUND]]

    def broken_rows(self, values: Sequence[int]) -> list[int]:
        """:meth:`violated_rows` over the peak (memory objective) or the
        capacity (time)."""
        limit = (
            values[self.peak.index]
            if self.peak is not None
            else self.program.capacity_bytes
        )
        return self.violated_rows(values, limit)

    def _set_objective(self) -> None:
        if self.peak is not None:
            cp_proto.minimize(self.model, [self.peak.index], [1])
        else:
            self.time_terms().minimize(self.model)

    # -- expressions (as (variable index, coefficient) terms) -------------------
    def time_terms(self) -> Terms:
        idx: list[int] = []
        coefs: list[int] = []
        for s, ds in enumerate(self.program.dimsets):
            for a, t in enumerate(ds.time_ps):
                if t:
                    idx.append(self.z[s][a].index)
                    coefs.append(t)
        return Terms(idx, coefs, self.program.time_offset_ps)

    def tiebreak_chunks(self) -> list[list[int]]:
        """Dims (indices into ``dim_x``) grouped so each chunk's weights fit."""
        dims = [d for d, xs in enumerate(self.program.dim_x) if xs]
        if not dims:
            return []
        base = 1 + max(len(self.program.dim_x[d]) for d in dims)
        per_chunk = 1
        while base ** (per_chunk + 1) < self.max_weight:
            per_chunk += 1
        return [dims[i : i + per_chunk] for i in range(0, len(dims), per_chunk)]

    def tiebreak_terms(self, dims: Sequence[int]) -> Terms:
        base = 1 + max((len(self.program.dim_x[d]) for d in dims), default=0)
        idx: list[int] = []
        coefs: list[int] = []
        for rank, d in enumerate(dims):
            weight = base ** (len(dims) - 1 - rank)
            for k, xi in enumerate(self.program.dim_x[d]):
                idx.append(self.x[xi].index)
                coefs.append(weight * (k + 1))
        return Terms(idx, coefs, 0)

    def secondary_terms(self) -> Terms | None:
        """``T' * W + tiebreak`` as one objective, or None if it could overflow.

        ``T' = T - T_lo`` is an integer variable defined by ``T' = sum_{S,a}
        (t[S,a] - min_a t[S,a]) z[S,a]``: its domain is the spread of the time
        (the sum over sets of max - min), far smaller than the sum of every
        coefficient that CP-SAT would otherwise bound the objective by, so
        the product with ``W`` (just above the largest tie-break value) fits
        in int64 on deep graphs and 3-axis meshes, and each rank takes one
        solve instead of two.
        """
        chunks = self.tiebreak_chunks()
        if len(chunks) > 1:
            return None
        tb = self.tiebreak_terms(chunks[0]) if chunks else Terms([], [], 0)
        weight = self.tiebreak_max(chunks[0] if chunks else []) + 1
        spread = self._time_spread()
        # CP-SAT rejects an objective whose terms could overflow int64
        # (|coefficient| times the variable's bound, summed).
        if (spread + 1) * weight + sum(tb.coefs) >= self.max_weight:
            return None
        t_var = self._time_variable(spread)
        return Terms(
            [t_var.index, *tb.indices],
            [weight, *tb.coefs],
            0,
            weight,
        )

    def tiebreak_max(self, dims: Sequence[int]) -> int:
        """The largest value :meth:`tiebreak_terms` can take (one axis per dim)."""
        terms = self.tiebreak_terms(dims)
        best: dict[int, int] = {}
        owner = {xi: d for d in dims for xi in self.program.dim_x[d]}
        for i, c in zip(terms.indices, terms.coefs):
            d = owner[self._x_of_index[i]]
            best[d] = max(best.get(d, 0), c)
        return sum(best.values())

    def _time_spread(self) -> int:
        """``sum_S (max_a t[S,a] - min_a t[S,a])`` over valid assignments, and
        the floor ``T_lo``, kept in :attr:`time_floor_ps`."""
        floor = self.program.time_offset_ps
        spread = 0
        self._time_min: list[int] = []
        for ds in self.program.dimsets:
            valid = [t for t, bad in zip(ds.time_ps, ds.invalid) if not bad]
            lo = min(valid, default=0)
            self._time_min.append(lo)
            floor += lo
            spread += max(valid, default=0) - lo
        self.time_floor_ps = floor
        return spread

    def _time_variable(self, spread: int) -> cp_model.IntVar:
        """``T' = T - T_lo`` as a variable (see :meth:`secondary_terms`)."""
        m = self.model
        t_var = m.new_int_var(0, spread, "T_shifted")
        idx: list[int] = []
        coefs: list[int] = []
        for s, ds in enumerate(self.program.dimsets):
            lo = self._time_min[s]
            for a, (t, bad) in enumerate(zip(ds.time_ps, ds.invalid)):
                if not bad and t != lo:
                    idx.append(self.z[s][a].index)
                    coefs.append(t - lo)
        Terms(idx, coefs, 0).equal_to_var(m, t_var.index)
        self.time_var = t_var
        return t_var

    def _peak_upper_bound(self, max_buf: int) -> int:
        p = self.program
        if not p.num_rows:
            return max_buf
        return int((p.row_bytes.sum(axis=1) + p.row_constants).max()) + max_buf

    def add_no_good(self, x_values: Sequence[bool]) -> None:
        """Forbids the layout ``x_values`` (so the next solve finds another)."""
        self.model.add_bool_or(
            [v.Not() if val else v for v, val in zip(self.x, x_values)]
        )


@dataclass(frozen=True)
class Terms:
    """A linear expression by variable index, so it can be written into any
    model with those variables (a clone too), straight into its proto
    (:mod:`layout_planner.cp_proto`)."""

    indices: list[int]
    coefs: list[int]
    offset: int
    weight: int = 1  # for T * W + tiebreak: W

    def minimize(self, model: cp_model.CpModel) -> None:
        cp_proto.minimize(model, self.indices, self.coefs, self.offset)

    def at_most(
        self, model: cp_model.CpModel, bound: int, enforced_by: int | None = None
    ) -> None:
        """Adds ``these terms <= bound`` (where the Boolean variable
        ``enforced_by`` is true, if given)."""
        hi = bound - self.offset
        cp_proto.add_linear(
            model, self.indices, self.coefs, hi=hi, enforced_by=enforced_by
        )

    def at_most_var(
        self, model: cp_model.CpModel, index: int, enforced_by: int | None = None
    ) -> None:
        """Adds ``var[index] >= these terms`` (where ``enforced_by`` is
        true, if given)."""
        indices, coefs = [index, *self.indices], [1, *(-c for c in self.coefs)]
        cp_proto.add_linear(
            model, indices, coefs, lo=self.offset, enforced_by=enforced_by
        )

    def equal_to_var(self, model: cp_model.CpModel, index: int) -> None:
        """Adds ``var[index] == these terms``."""
        indices, coefs = [index, *self.indices], [1, *(-c for c in self.coefs)]
        cp_proto.add_linear(model, indices, coefs, self.offset, self.offset)

    def plus(self, index: int) -> Terms:
        """These terms plus variable ``index``."""
        return Terms([*self.indices, index], [*self.coefs, 1], self.offset, self.weight)

    def value(self, values: Sequence[int]) -> int:
        return self.offset + sum(
            c * values[i] for i, c in zip(self.indices, self.coefs)
        )


@dataclass
class _Run:
    """One solve's outcome."""

    status: SolveStatus
    objective: float
    bound: float
    values: list[int]
    wall_s: float


class LazyRows(Protocol):
    """A model whose memory rows are added when an answer breaks them (what
    :class:`SolveLoop` needs): :class:`LayoutModel`, and the joint model of
    :mod:`layout_planner.recompute_cpsat`."""

    model: cp_model.CpModel

    def broken_rows(self, values: Sequence[int]) -> list[int]:
        """Rows not in the model yet that ``values`` breaks, worst first."""
        ...

    def add_rows(
        self, rows: Sequence[int], clone: cp_model.CpModel | None = None
    ) -> None:
        """Adds ``rows`` to the model (and to ``clone``, a clone of it)."""
        ...


def tuned_solver(workers: int, seed: int, presolve: bool = True) -> cp_model.CpSolver:
    """A CP-SAT solver with the planner's settings (:data:`TUNING`)."""
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = workers
    prm.random_seed = seed
    prm.log_search_progress = False
    for name, value in TUNING.items():
        setattr(prm, name, value)
    prm.cp_model_presolve = presolve
    return solver


def set_hint(model: cp_model.CpModel, hint: Sequence[int] | None) -> None:
    """Replaces ``model``'s hint with ``hint`` (a value per variable, in
    proto order), or clears it.  Written into the proto at once: ``add_hint``
    per variable took 19 ms for 3,000 of them."""
    model.clear_hints()  # type: ignore[no-untyped-call]
    if hint is not None:
        given = model.proto.solution_hint
        given.vars.extend(range(len(hint)))
        given.values.extend(int(v) for v in hint)


class SolveLoop:
    """Runs the phases of :func:`solve_program` against one deadline."""

    def __init__(self, lm: LazyRows, params: SolveParams) -> None:
        self.lm = lm
        self.params = params
        self.deadline = time.monotonic() + params.time_limit_s
        self.num_solves = 0
        self.rows_added = 0
        self.phases: list[tuple[str, str, float]] = []

    def solve(
        self,
        model: cp_model.CpModel,
        phase: str,
        workers: int,
        hint: Sequence[int] | None,
        linearization: int | None = None,
    ) -> _Run:
        """Solves ``model`` (the base model or a clone of it); while the answer
        breaks a live set not yet in the model, adds it (to both) and solves
        again: the answer satisfies every live set.  ``linearization``:
        CP-SAT's ``linearization_level`` for this phase, if not
        :data:`TUNING`'s."""
        while True:
            run = self._solve_once(model, phase, workers, hint, linearization)
            if not run.status.has_solution:
                return run
            lm = self.lm
            rows = lm.broken_rows(run.values)
            if not rows:
                return run
            self.rows_added += len(rows)
            lm.add_rows(rows, clone=None if model is lm.model else model)
            # The old answer breaks the new rows, but the new one is most
            # often near it: as a hint it takes CP-SAT there first.
            hint = run.values

    def _solve_once(
        self,
        model: cp_model.CpModel,
        phase: str,
        workers: int,
        hint: Sequence[int] | None,
        linearization: int | None = None,
    ) -> _Run:
        solver = tuned_solver(workers, self.params.seed, self.params.presolve)
        prm = solver.parameters
        if linearization is not None:
            prm.linearization_level = linearization
        prm.max_time_in_seconds = max(self.deadline - time.monotonic(), _MIN_PHASE_S)
        set_hint(model, hint)
        code = solver.solve(model)
        if prm.cp_model_presolve and _presolve_in_doubt(code, model):
            prm.cp_model_presolve = False
            left = self.deadline - time.monotonic()
            prm.max_time_in_seconds = max(left, _MIN_PHASE_S)
            code = solver.solve(model)
        status = _STATUS.get(code)
        if status is None:  # pragma: no cover - a status CP-SAT may add later
            raise SolverError(f"CP-SAT returned an unmapped status {code!r}")
        self.num_solves += 1
        wall = solver.wall_time
        self.phases.append((phase, status.value, wall))
        if status is SolveStatus.MODEL_INVALID:
            raise SolverError(
                f"CP-SAT says the layout model is invalid in phase {phase!r}: "
                f"{model.validate()[:500]}"
            )
        if not status.has_solution:
            return _Run(status, float("nan"), float("nan"), [], wall)
        return _Run(
            status,
            solver.objective_value,
            solver.best_objective_bound,
            list(solver.response_proto.solution),
            wall,
        )


def _presolve_in_doubt(code: Any, model: cp_model.CpModel) -> bool:
    """Whether CP-SAT's answer ``code`` (with presolve) is to be checked by a
    solve without presolve:
    * INFEASIBLE: with these settings (probing off) its presolve has called
      feasible programs infeasible (bench/cpsat_presolve.py;
      tests/test_planner_cpsat.py);
    * MODEL_INVALID of a model that validates: its presolve can rewrite an
      objective that fits in 64 bits into one that may overflow ("Possible
      integer overflow in objective", seen on 4-axis meshes of a 2-layer LM).
    """
    if code == cp_model.INFEASIBLE:
        return True
    return bool(code == cp_model.MODEL_INVALID and not model.validate())


def solve_program(
    program: IntegerProgram,
    params: SolveParams,
    on_best: Callable[[Solution], None] | None = None,
) -> ProgramResult:
    """Solves ``program`` for up to ``params.top_k`` distinct layouts, best first.

    ``on_best`` is called with the best layout as soon as it is known, before
    the other ranks are solved (CP-SAT releases the GIL while it searches, so
    a thread started there runs beside it).

    For each rank: (memory objective) minimise the peak P; then, at that P,
    minimise time and the tie-break together as ``T * W + tiebreak`` (``W``
    exceeds any tie-break value, so this is lexicographic), or one after the
    other when that product would not fit in int64.  The optimum of that
    objective is unique, so the answer does not depend on the worker count.
    Then forbid that layout and go again.
    """
    t0 = time.monotonic()
    lm = LayoutModel(program, params.max_objective_weight)
    run = SolveLoop(lm, params)
    secondary = lm.secondary_terms()
    if lm.peak is None and secondary is not None:
        secondary.minimize(lm.model)
    solutions: list[Solution] = []
    first_status = SolveStatus.UNKNOWN
    complete = True
    for rank in range(max(params.top_k, 1)):
        if rank and time.monotonic() >= run.deadline:
            complete = False
            break
        sol = _solve_one(lm, run, rank, secondary, program.x_hint if not rank else None)
        if rank == 0:
            first_status = sol.status if isinstance(sol, Solution) else sol
        if not isinstance(sol, Solution):
            if rank and sol is not SolveStatus.INFEASIBLE:
                complete = False
            break
        solutions.append(sol)
        if rank == 0 and on_best is not None:
            on_best(sol)
        if program.num_x == 0:
            break
        lm.add_no_good(sol.x)
        if lm.time_var is not None and lm.peak is None:
            # No later rank is faster: a bound that spares CP-SAT the proof.
            lm.model.add(lm.time_var >= sol.time_ps - lm.time_floor_ps)
    proto = lm.model.proto
    return ProgramResult(
        status=first_status,
        solutions=tuple(solutions),
        wall_time_s=time.monotonic() - t0,
        num_solves=run.num_solves,
        num_variables=len(proto.variables),
        num_constraints=len(proto.constraints),
        top_k_complete=complete,
        phases=tuple(run.phases),
        memory_rows_added=int(lm.row_added.sum()),
    )


def _solve_one(
    lm: LayoutModel,
    run: SolveLoop,
    rank: int,
    secondary: Terms | None,
    x_hint: Sequence[bool] | None = None,
) -> Solution | SolveStatus:
    workers = max(run.params.num_workers, 1)
    time_terms = lm.time_terms()
    # The x variables come first in the model: a hint of them alone.
    hint = None if x_hint is None else [int(v) for v in x_hint]
    first = run.solve(lm.model, f"rank{rank}:primary", workers, hint)
    if not first.status.has_solution:
        return first.status
    status = first.status
    values = first.values
    peak: int | None = None
    model = lm.model
    if lm.peak is not None:
        peak = round(first.objective)
        model = lm.model.clone()
        model.add(model.get_int_var_from_proto_index(lm.peak.index) <= peak)
        if secondary is not None:
            secondary.minimize(model)
            second = run.solve(model, f"rank{rank}:time", workers, values)
            if second.status.has_solution:
                values = second.values
                status = _worse(status, second.status)
            else:
                status = SolveStatus.FEASIBLE
    if secondary is None:  # time first, then the tie-break dims chunk by chunk
        status, values = _lexicographic(
            lm, run, rank, model, time_terms, status, values
        )
    time_ps = time_terms.value(values)
    if lm.peak is None and secondary is not None:
        bound = float(first.bound // secondary.weight + lm.time_floor_ps)
    else:
        bound = first.bound
    return Solution(
        x=tuple(bool(values[v.index]) for v in lm.x),
        time_ps=time_ps,
        peak_bytes=peak,
        status=status,
        best_bound=bound,
        objective=float(peak if peak is not None else time_ps),
    )


def _lexicographic(
    lm: LayoutModel,
    run: SolveLoop,
    rank: int,
    model: cp_model.CpModel,
    time_terms: Terms,
    status: SolveStatus,
    values: list[int],
) -> tuple[SolveStatus, list[int]]:
    """Time, then each tie-break chunk, each fixed before the next."""
    model = model.clone()
    workers = max(run.params.num_workers, 1)
    if lm.peak is not None:
        time_terms.minimize(model)
        res = run.solve(model, f"rank{rank}:time", workers, values)
        if not res.status.has_solution:
            return SolveStatus.FEASIBLE, values
        values = res.values
        status = _worse(status, res.status)
    # "<=" rather than "==": the same set (nothing beats the optimum), but
    # CP-SAT proves it from one side; an equality on a sum of picosecond
    # coefficients took seconds to satisfy on programs with many ties.
    time_terms.at_most(model, time_terms.value(values))
    for chunk in lm.tiebreak_chunks():
        terms = lm.tiebreak_terms(chunk)
        terms.minimize(model)
        res = run.solve(
            model, f"rank{rank}:tiebreak", workers, values, _TIEBREAK_LINEARIZATION
        )
        if not res.status.has_solution:
            return SolveStatus.FEASIBLE, values  # as good, only less canonical
        values = res.values
        status = _worse(status, res.status)
        terms.at_most(model, terms.value(values))
    return status, values


def _worse(a: SolveStatus, b: SolveStatus) -> SolveStatus:
    return a if b is SolveStatus.OPTIMAL else SolveStatus.FEASIBLE
