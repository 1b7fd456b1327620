"""Errors the planner raises on purpose (all derive from ``mtf.MtfError``)."""

from __future__ import annotations

from mtf_core.errors import MtfError


class PlannerError(MtfError, ValueError):
    """A planning request is malformed: unknown objective, bad mesh, bad limit."""


class SolverError(MtfError, RuntimeError):
    """The solver failed (the model was invalid, or its worker process died)."""


class PlanVerificationError(MtfError, AssertionError):
    """The independent evaluator disagrees with the solver: a planner bug."""
