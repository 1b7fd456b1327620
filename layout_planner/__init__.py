"""The automatic layout planner: a CP-SAT integer program over dimension names.

Entry points (also ``mtf.auto_layout`` and ``mtf.auto_mtf``):

* :func:`auto_layout` -> :class:`LayoutPlan`, its parameters as one
  :class:`PlanOptions`;
* :mod:`layout_planner.auto_mtf`: Mesh TensorFlow's ``layout`` and
  ``layout_and_mesh_shape``;
* :class:`DimensionGraph`, :class:`LayoutProblem`: the pieces, for tools.

Modules load on first use, so the CP-SAT worker process (which imports this
package) starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "auto_layout": ("layout_planner.planner", "auto_layout"),
    "PlanOptions": ("layout_planner.options", "PlanOptions"),
    "DEFAULT_TIME_LIMIT_S": ("layout_planner.options", "DEFAULT_TIME_LIMIT_S"),
    "LayoutPlan": ("layout_planner.plan", "LayoutPlan"),
    "PlanCost": ("layout_planner.plan", "PlanCost"),
    "Candidate": ("layout_planner.plan", "Candidate"),
    "Baseline": ("layout_planner.plan", "Baseline"),
    "DimChoice": ("layout_planner.plan", "DimChoice"),
    "SolverStats": ("layout_planner.plan", "SolverStats"),
    "SolveStatus": ("layout_planner.program", "SolveStatus"),
    "Objective": ("layout_planner.program", "Objective"),
    "DimensionGraph": ("layout_planner.dim_graph", "DimensionGraph"),
    "LayoutProblem": ("layout_planner.problem", "LayoutProblem"),
    "search_mesh_shape": ("layout_planner.mesh_search", "search_mesh_shape"),
    "PlannerError": ("layout_planner.errors", "PlannerError"),
    "SolverError": ("layout_planner.errors", "SolverError"),
    "PlanVerificationError": ("layout_planner.errors", "PlanVerificationError"),
    "auto_mtf": ("layout_planner.auto_mtf", None),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'layout_planner' has no attribute {name!r}")
