"""The scale search's unit pricer: a table entry's units looked up at once,
under keys shared by the pricers of every mesh of a search."""

from __future__ import annotations

import pytest
from pricing_cases import HW, small_model

from cost_models.units import UnitPricer
from layout_planner.problem import LayoutProblem
from layout_planner.scale_stages import SharedUnitCosts, SignaturePricer
from mtf_core.shapes import convert_to_shape


@pytest.fixture(scope="module")
def analysis():
    return small_model()


#: A table's dims: the ffn's elementwise ops and its activation.
DIMS = ("batch", "d_ff", "length")


def _entry(analysis, mesh, split):
    """The units of ``analysis`` whose free dims are ``DIMS`` (one table's),
    ``split`` ({dim: axis name}) as (dim, axis index) pairs in name order,
    and a context of ``mesh`` under it."""
    model, a = analysis
    problem = LayoutProblem(model.graph, mesh, HW, [model.loss], analysis=a)
    units = tuple(
        c.unit for c in a.unit_classes if problem.free(c.unit.dim_names) == DIMS
    )
    axes = [d.name for d in mesh]
    pairs = tuple((n, axes.index(split[n])) for n in sorted(split))
    return units, pairs, problem.context(dict(pairs))


@pytest.fixture
def priced_calls(monkeypatch):
    """How many units UnitPricer.cost prices (the pricers' misses)."""
    calls = []
    plain = UnitPricer.cost

    def counting(self, unit, ctx, split=None):
        calls.append(unit)
        return plain(self, unit, ctx, split)

    monkeypatch.setattr(UnitPricer, "cost", counting)
    return calls


def test_an_entrys_units_cost_what_a_plain_pricer_says_one_by_one(analysis):
    mesh = convert_to_shape("dp:2,tp:2")
    units, pairs, ctx = _entry(analysis, mesh, {"batch": "dp", "d_ff": "tp"})
    assert len(units) >= 4  # a table of several signatures
    got = SignaturePricer(mesh, HW).costs(units, ctx, pairs)
    plain = UnitPricer(mesh, HW)
    assert got == [plain.cost(u, ctx) for u in units]
    assert all(g.compute_s > 0 for g in got)


def test_meshes_that_agree_on_the_splitting_axes_share_each_price(
    analysis, priced_calls
):
    shared = SharedUnitCosts()
    small = convert_to_shape("dp:2,tp:2")
    large = convert_to_shape("dp:4,tp:2")
    # d_ff over tp alone: the two meshes' tp axes are equal (size 2, NVLink).
    units, pairs, ctx = _entry(analysis, small, {"d_ff": "tp"})
    units_l, pairs_l, ctx_l = _entry(analysis, large, {"d_ff": "tp"})
    units_b, pairs_b, ctx_b = _entry(analysis, large, {"batch": "dp", "d_ff": "tp"})
    assert pairs_l == pairs

    def priced(units, ctx, pairs, mesh):
        before = len(priced_calls)
        got = SignaturePricer(mesh, HW, shared).costs(units, ctx, pairs)
        return got, len(priced_calls) - before

    first, n = priced(units, ctx, pairs, small)
    assert n == len({(u.signature, u.dim_names) for u in units}) >= 4
    second, n = priced(units_l, ctx_l, pairs_l, large)
    assert second == first and n == 0  # nothing priced again
    # batch over dp too: dp's size differs, so each is priced on each mesh.
    units_s, pairs_s, ctx_s = _entry(analysis, small, {"batch": "dp", "d_ff": "tp"})
    assert pairs_s == pairs_b
    distinct = len({(u.signature, u.dim_names) for u in units_b})
    _, n = priced(units_s, ctx_s, pairs_s, small)
    assert n == distinct
    third, n = priced(units_b, ctx_b, pairs_b, large)
    assert n == distinct
    plain = UnitPricer(large, HW)
    assert third == [plain.cost(u, ctx_b) for u in units_b]


def test_units_of_one_signature_and_dims_get_one_id(analysis):
    _, a = analysis
    shared = SharedUnitCosts()
    by_class = {}
    for c in a.unit_classes:
        by_class.setdefault((c.unit.signature, c.unit.dim_names), []).append(c.unit)
    ids = {key: {shared.unit_id(u) for u in us} for key, us in by_class.items()}
    assert all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == len(by_class)
    assert shared.axes_id((("d_ff", "tp"),)) == shared.axes_id((("d_ff", "tp"),))
    assert shared.axes_id((("d_ff", "tp"),)) != shared.axes_id((("d_ff", "dp"),))
