"""Compute-only op units priced table-wide give the general path's prices,
to the last bit, and leave the general path what they cannot vouch for."""

from __future__ import annotations

import pytest
from pricing_cases import HW, small_model

import mtf_core as mtf
from cost_models.entry_compute import compute_only
from cost_models.units import OP, UnitPricer, cost_units
from layout_planner.problem import LayoutProblem
from mtf_core.comm import LayoutContext
from mtf_core.errors import LayoutError
from mtf_core.shapes import convert_to_shape

MESHES = ["dp:2,tp:2", "dp:4,tp:2", "x:2,y:2,z:2"]


class GeneralPricer(UnitPricer):
    """Prices every unit the general way, entry by entry."""

    def table_compute(self, unit, dims, assignments):
        return None


class HolesPricer(UnitPricer):
    """Cannot vouch for every third entry of any table."""

    def table_compute(self, unit, dims, assignments):
        got = super().table_compute(unit, dims, assignments)
        return (
            None if got is None else [None if k % 3 else s for k, s in enumerate(got)]
        )


@pytest.fixture(scope="module")
def model():
    return small_model()


@pytest.mark.parametrize("mesh", MESHES)
def test_table_wide_compute_is_the_general_paths_to_the_last_bit(model, mesh):
    m, a = model
    shape = convert_to_shape(mesh)
    problem = LayoutProblem(m.graph, shape, HW, [m.loss], analysis=a)
    pricer = UnitPricer(shape, HW)
    fast = checked = 0
    for table in problem.tables:
        for cls in a.unit_classes:
            unit = cls.unit
            if problem.free(unit.dim_names) != table.dims:
                continue
            got = pricer.table_compute(unit, table.dims, table.assignments)
            if got is None:
                assert unit.kind != OP or not compute_only(unit.ops[0])
                continue
            fast += 1
            for asg, seconds in zip(table.assignments, got):
                ctx = problem.context(dict(zip(table.dims, asg)))
                try:
                    want = pricer.cost(unit, ctx)
                except LayoutError:
                    assert seconds is None  # the general path decides
                    continue
                if seconds is None:
                    continue
                assert seconds == want.compute_s  # exactly
                assert want.comm_s_by_axis == () and want.collectives == ()
                assert want.once_s == (seconds if unit.once and unit.once[0] else 0.0)
                checked += 1
    assert fast >= 20 and checked >= 200


@pytest.mark.parametrize("mesh", MESHES)
def test_tables_are_the_same_priced_either_way(model, mesh):
    m, a = model
    shape = convert_to_shape(mesh)
    fast = LayoutProblem(m.graph, shape, HW, [m.loss], analysis=a)
    for pricer in (GeneralPricer(shape, HW), HolesPricer(shape, HW)):
        other = LayoutProblem(m.graph, shape, HW, [m.loss], analysis=a, pricer=pricer)
        assert [t.dims for t in fast.tables] == [t.dims for t in other.tables]
        for f, g in zip(fast.tables, other.tables):
            assert f.time_s == g.time_s  # the same floats, summed in one order
            assert f.compute_s == g.compute_s
            assert f.once_s == g.once_s
            assert f.comm_s == g.comm_s
            assert f.buffer_bytes == g.buffer_bytes
            assert f.invalid == g.invalid
            assert f.ordered == g.ordered
        assert fast.stats.num_unit_pricings == other.stats.num_unit_pricings
    assert any(s for t in fast.tables for s in t.once_s)  # the update's ops


def test_what_the_arithmetic_cannot_vouch_for_is_left_to_the_general_path():
    g = mtf.Graph()
    mesh = mtf.Mesh(g, "m")
    x = mtf.placeholder(mesh, "b:4,d:6")
    y = x * x
    shape = convert_to_shape("p:4,q:2")
    pricer = UnitPricer(shape, HW)
    unit = next(u for u in cost_units(g, [y]) if u.ops == (y.operation,))
    # b and d on one axis, then d (6) over p (4): the general path raises.
    bad = {(0, 0): "b:p;d:p", (None, 0): "d:p"}
    good = {(None, None): "", (0, 1): "b:p;d:q", (1, None): "b:q"}
    got = pricer.table_compute(unit, ("b", "d"), [*bad, *good])
    assert got is not None and got[:2] == [None, None]
    for rules in bad.values():
        with pytest.raises(LayoutError):
            pricer.cost(unit, LayoutContext.make(shape, rules))
    for seconds, rules in zip(got[2:], good.values()):
        assert seconds == pricer.cost(unit, LayoutContext.make(shape, rules)).compute_s


def test_ops_that_issue_collectives_are_left_to_the_general_path(model):
    m, _ = model
    kinds: dict[str, set[bool]] = {}
    for op in m.graph.operations:
        name = type(op).__name__
        if name == "Reduce":  # a sum stays pending; a max is allreduced at once
            name = f"Reduce {op.reduction}"
        kinds.setdefault(name, set()).add(compute_only(op))
    for name in ("Einsum", "BinaryOp", "UnaryOp", "CastOp", "Variable", "Assign"):
        assert kinds[name] == {True}, name
    assert kinds["Reduce SUM"] == {True}
    for name in ("Reduce MAX", "Reshape", "StoredRead", "ReduceScatter", "Gather"):
        assert kinds[name] == {False}, name
