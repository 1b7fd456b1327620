"""The CP-SAT programs planning solves, kept and solved again: what
``bench/cpsat_presolve.py`` and ``bench/cpsat_settings.py`` compare CP-SAT's
settings on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from ortools.sat.python import cp_model

from layout_planner import cpsat


@dataclass(frozen=True)
class Run:
    status: str
    objective: float
    seconds: float


@contextmanager
def captured() -> Iterator[list[tuple[cp_model.CpModel, bool]]]:
    """Every model CP-SAT is given inside the block, as given (hint
    included), and whether it was solved with presolve."""
    models: list[tuple[cp_model.CpModel, bool]] = []
    solve_once = cpsat.SolveLoop._solve_once

    def capture(self, model, phase, workers, hint, *rest):  # type: ignore[no-untyped-def]
        copy = model.clone()
        cpsat.set_hint(copy, hint)
        models.append((copy, self.params.presolve))
        return solve_once(self, model, phase, workers, hint, *rest)

    cpsat.SolveLoop._solve_once = capture  # type: ignore[method-assign]
    try:
        yield models
    finally:
        cpsat.SolveLoop._solve_once = solve_once  # type: ignore[method-assign]


def solved(
    model: cp_model.CpModel,
    presolve: bool,
    settings: Mapping[str, object] | None = None,
) -> Run:
    """``model`` solved with the planner's settings (one worker, seed 0),
    ``presolve`` and ``settings`` on top of them."""
    solver = cpsat.tuned_solver(1, 0, presolve)
    for name, value in (settings or {}).items():
        setattr(solver.parameters, name, value)
    t0 = time.perf_counter()
    code = solver.solve(model)
    seconds = time.perf_counter() - t0
    return Run(solver.status_name(code), solver.objective_value, seconds)


def alternated(
    i: int, one: Callable[[], Run], other: Callable[[], Run]
) -> tuple[Run, Run]:
    """``one()`` and ``other()``, the ``i``-th program's pair: which runs
    first alternates with ``i``, so that neither always finds the cache
    warm."""
    if i % 2:
        b = other()
        return one(), b
    a = one()
    return a, other()


def same_answer(a: Run, b: Run) -> bool:
    """The same status, and at the optimum the same objective: integers
    reported as doubles (up to ~1e17, where a double's step is 32), equal to
    within one unit or a few steps."""
    if a.status != b.status:
        return False
    close = max(1.0, 1e-15 * abs(a.objective))
    return a.status != "OPTIMAL" or abs(a.objective - b.objective) <= close
