"""cp_proto writes the protos OR-tools' Python API writes for the same
constraints and objectives, so a program built either way is solved alike."""

from __future__ import annotations

import pytest

from layout_planner import cp_proto
from layout_planner.cp_proto import INT_MAX, INT_MIN
from layout_planner.ortools_import import cp_sat_import

with cp_sat_import():
    from ortools.sat.python import cp_model


def _models() -> tuple[cp_model.CpModel, list, cp_model.CpModel]:
    """Two models with the same variables: five Booleans and one integer."""
    out = []
    for _ in range(2):
        m = cp_model.CpModel()
        vs = [m.new_bool_var(f"x{i}") for i in range(5)]
        vs.append(m.new_int_var(0, 1000, "T"))
        out.append((m, vs))
    (api, vs), (direct, _) = out
    return api, vs, direct


def _expr(vs: list, indices: list[int], coefs: list[int], offset: int = 0):
    return cp_model.LinearExpr.weighted_sum([vs[i] for i in indices], coefs) + offset


# Indices in order, out of order, repeated, with a zero coefficient.
TERMS = [
    ([0, 2, 4], [3, 5, 7]),
    ([4, 1, 3], [2, -1, 6]),
    ([2, 0, 2, 3], [1, 4, 5, 0]),
]


@pytest.mark.parametrize("indices,coefs", TERMS)
def test_a_bounded_sum_is_written_as_the_api_writes_it(indices, coefs):
    api, vs, direct = _models()
    api.add(_expr(vs, indices, coefs, 3) <= 9)
    api.add(_expr(vs, indices, coefs) >= -2)
    api.add(vs[5] == _expr(vs, indices, coefs, 4))
    api.add(vs[5] >= _expr(vs, indices, coefs, 1)).only_enforce_if(vs[1])
    cp_proto.add_linear(direct, indices, coefs, hi=9 - 3)
    cp_proto.add_linear(direct, indices, coefs, lo=-2)
    cp_proto.add_linear(direct, [5, *indices], [1, *(-c for c in coefs)], 4, 4)
    cp_proto.add_linear(
        direct, [5, *indices], [1, *(-c for c in coefs)], lo=1, enforced_by=1
    )
    assert str(direct.proto) == str(api.proto)
    assert list(direct.proto.constraints[0].linear.domain) == [INT_MIN, 6]
    assert list(direct.proto.constraints[1].linear.domain) == [-2, INT_MAX]


@pytest.mark.parametrize("indices,coefs", TERMS)
def test_an_objective_is_written_as_the_api_writes_it_and_replaces_the_last(
    indices, coefs
):
    api, vs, direct = _models()
    api.minimize(vs[5])
    cp_proto.minimize(direct, [5], [1])
    assert str(direct.proto) == str(api.proto)
    api.minimize(_expr(vs, indices, coefs, 11))
    cp_proto.minimize(direct, indices, coefs, 11)
    assert str(direct.proto) == str(api.proto)
    assert direct.proto.objective.offset == 11


def test_the_same_program_solves_to_the_same_answer():
    api, vs, direct = _models()
    for m, add in ((api, None), (direct, cp_proto)):
        if add is None:
            m.add(_expr(vs, [0, 1, 2], [1, 1, 1]) >= 2)
            m.minimize(_expr(vs, [0, 1, 2, 3], [5, 3, 4, 1], 2))
        else:
            add.add_linear(m, [0, 1, 2], [1, 1, 1], lo=2)
            add.minimize(m, [0, 1, 2, 3], [5, 3, 4, 1], 2)
    answers = []
    for m in (api, direct):
        solver = cp_model.CpSolver()
        assert solver.solve(m) == cp_model.OPTIMAL
        answers.append((solver.objective_value, [solver.value(v) for v in vs[:4]]))
    assert answers[0] == answers[1] == (9.0, [0, 1, 1, 0])


def test_terms_that_are_all_zero_are_written_as_the_api_writes_them():
    api, vs, direct = _models()
    zero = cp_model.LinearExpr.weighted_sum([vs[1], vs[1]], [2, -2]) + 3
    api.add(zero <= 9)
    api.add(zero <= 2).only_enforce_if(vs[0])
    api.minimize(zero)
    cp_proto.add_linear(direct, [1, 1], [2, -2], hi=9 - 3)
    cp_proto.add_linear(direct, [1, 1], [2, -2], hi=2 - 3, enforced_by=0)
    cp_proto.minimize(direct, [1, 1], [2, -2], 3)
    assert str(direct.proto) == str(api.proto)
    assert not direct.proto.constraints[0].linear.vars
