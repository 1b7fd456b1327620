"""Linear constraints and objectives written straight into a CP-SAT model's
proto, in the form OR-tools' Python API writes them.

The API builds an expression object per term and walks it to write the
proto: for programs of a few thousand literals that walk costs more than
the solve.  These helpers write the same proto from (variable index,
coefficient) lists: variables in index order, duplicates merged, zero
coefficients dropped, the constant moved into the domain
(``tests/test_cp_proto.py`` compares them with the API's protos).
"""

from __future__ import annotations

from collections.abc import Sequence

from layout_planner.ortools_import import cp_sat_import

with cp_sat_import():
    from ortools.sat.python import cp_model

INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def canonical(
    indices: Sequence[int], coefs: Sequence[int]
) -> tuple[Sequence[int], Sequence[int]]:
    """``sum coefs[k] * var[indices[k]]`` with each variable once, in index
    order, and no zero coefficient."""
    if all(c for c in coefs) and all(a < b for a, b in zip(indices, indices[1:])):
        return indices, coefs  # the usual case: already so
    merged: dict[int, int] = {}
    for i, c in zip(indices, coefs):
        merged[i] = merged.get(i, 0) + c
    order = sorted(i for i, c in merged.items() if c)
    return order, [merged[i] for i in order]


def add_linear(
    model: cp_model.CpModel,
    indices: Sequence[int],
    coefs: Sequence[int],
    lo: int = INT_MIN,
    hi: int = INT_MAX,
    enforced_by: int | None = None,
) -> None:
    """Adds ``lo <= sum coefs[k] * var[indices[k]] <= hi``, if given only
    where the Boolean variable ``enforced_by`` is true (terms that are all
    zero leave a constraint without variables, as the API writes it)."""
    idx, cs = canonical(indices, coefs)
    constraint = model.proto.constraints.add()
    if enforced_by is not None:
        constraint.enforcement_literal.append(enforced_by)
    linear = constraint.linear
    linear.vars.extend(idx)
    linear.coeffs.extend(cs)
    linear.domain.extend((max(lo, INT_MIN), min(hi, INT_MAX)))


def minimize(
    model: cp_model.CpModel,
    indices: Sequence[int],
    coefs: Sequence[int],
    offset: int = 0,
) -> None:
    """Replaces the objective with ``sum coefs[k] * var[indices[k]] + offset``,
    minimized."""
    idx, cs = canonical(indices, coefs)
    model.clear_objective()  # type: ignore[no-untyped-call]
    objective = model.proto.objective
    objective.vars.extend(idx)
    objective.coeffs.extend(cs)
    objective.offset = offset
    objective.scaling_factor = 1
