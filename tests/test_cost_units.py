"""Cost units add up to the evaluator, for every layout (pure Python, no TF)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_cost_graphs import BUILDERS, all_rules, mlp_training

import mtf_core as mtf
from cost_models import (
    CostUnit,
    UnitPricer,
    cost_unit_classes,
    cost_units,
    evaluate,
    get_hardware,
    memory_model,
    unit_cost,
)
from cost_models.units import DEFERRED, OP
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import LayoutError, MtfError
from mtf_core.graph import Operation
from mtf_core.liveness import step_operations

HW = get_hardware("h100-nvlink-ib")


def _valid_layouts(case, mesh_shape: str, limit: int = 400):
    rules = list(all_rules(case.dim_names, mesh_shape))
    if len(rules) > limit:
        rules = random.Random(0).sample(rules, limit)
    mm = memory_model(case.graph, case.outputs)
    for r in rules:
        try:
            cost = evaluate(case.graph, mesh_shape, r, HW, case.outputs, memory=mm)
        except LayoutError:
            continue
        yield r, cost


def _restricted(ctx: LayoutContext, dims: frozenset[str]) -> LayoutContext:
    pairs = [(t, m) for t, m in ctx.rules if t in dims]
    return LayoutContext.make(ctx.mesh_shape, pairs)


def _key(c: CollectiveSpec) -> tuple:
    return (c.kind, c.mesh_axes, c.bytes_per_device, c.reduction)


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("mesh_shape", ["x:2;y:2", "x:4;y:2"])
def test_unit_costs_sum_to_evaluate_for_every_valid_layout(
    name: str, mesh_shape: str
) -> None:
    case = BUILDERS[name]()
    units = cost_units(case.graph, case.outputs)
    # one op unit per op the step runs (an unused value is not priced)
    assert sum(u.kind == OP for u in units) == len(
        step_operations(case.graph, case.outputs)
    )
    checked = 0
    communicating = 0
    # One pricer for every layout: what it remembers never changes an answer.
    pricer = UnitPricer(mtf.convert_to_shape(mesh_shape), HW)
    for rules, cost in _valid_layouts(case, mesh_shape):
        ctx = LayoutContext.make(mesh_shape, rules)
        compute = 0.0
        flops = 0.0
        by_axis: dict[str, float] = {}
        colls: Counter = Counter()
        for u in units:
            uc = unit_cost(u, ctx, HW)
            # Only the layout of the unit's own dims is read.
            assert unit_cost(u, _restricted(ctx, u.dim_names), HW) == uc
            assert pricer.cost(u, _restricted(ctx, u.dim_names)) == uc
            compute += uc.compute_s
            flops += uc.flops_per_device
            for axis, s in uc.comm_s_by_axis:
                by_axis[axis] = by_axis.get(axis, 0.0) + s
            colls.update(_key(c) for c in uc.collectives)
        assert compute == pytest.approx(cost.compute_s, rel=1e-12)
        assert flops == pytest.approx(cost.flops_per_device, rel=1e-12)
        assert sorted(by_axis) == [a for a, _ in cost.comm_s_by_axis]
        for axis, s in cost.comm_s_by_axis:
            assert by_axis[axis] == pytest.approx(s, rel=1e-12)
        assert colls == Counter(_key(c) for c in cost.collectives)
        checked += 1
        communicating += bool(cost.collectives)
    assert checked >= 5
    assert communicating >= 2


def test_sum_of_pending_einsums_and_its_forcing_einsum_form_one_deferred_unit() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    a, w1 = mtf.zeros(m, "b:4,k:4"), mtf.zeros(m, "k:4,h:4")
    c, w2 = mtf.zeros(m, "b:4,j:4"), mtf.zeros(m, "j:4,h:4")
    s = mtf.einsum([a, w1], output_shape="b:4,h:4") + mtf.einsum(
        [c, w2], output_shape="b:4,h:4"
    )
    out = mtf.einsum([s, mtf.zeros(m, "h:4,o:8")], output_shape="b:4,o:8")
    units = cost_units(g, [out])
    (group,) = [u for u in units if u.kind == DEFERRED]
    assert group.exported == (out,)
    assert [op.op_type for op in group.ops] == ["Einsum", "Einsum", "Binary", "Einsum"]
    # the consumer einsum is a producer too (it reduces h), so o is in
    assert group.dim_names == frozenset({"b", "k", "h", "j", "o"})
    hw = get_hardware("cpu-host")
    ctx = LayoutContext.make("x:2", "k:x;j:x")
    assert [c.mesh_axes for c in unit_cost(group, ctx, hw).collectives] == [("x",)]
    ctx = LayoutContext.make("x:2;y:2", "k:x;j:y")
    assert [c.mesh_axes for c in unit_cost(group, ctx, hw).collectives] == [
        ("x",),
        ("y",),
    ]


def test_forcing_consumer_dims_stay_out_of_the_deferred_unit() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    y = mtf.reduce_sum(mtf.zeros(m, "b:4,v:8"), reduced_dim="v")
    z = mtf.exp(mtf.broadcast(y, "b:4,e:2"))  # broadcast forces y
    units = cost_units(g, [z])
    (deferred,) = [u for u in units if u.kind == DEFERRED]
    assert deferred.dim_names == frozenset({"b", "v"})
    assert [op.op_type for op in deferred.ops] == ["Reduce", "Broadcast"]


def test_units_with_equal_signatures_cost_the_same_under_every_layout() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "batch:8,d:4")
    for i in range(3):  # three identical residual layers
        w = mtf.get_variable(m, f"w{i}", "d:4,f:8")
        v = mtf.get_variable(m, f"v{i}", "f:8,d:4")
        h = mtf.relu(mtf.einsum([x, w], output_shape="batch:8,f:8"))
        x = x + mtf.einsum([h, v], output_shape="batch:8,d:4")
    loss = mtf.reduce_sum(x)
    units = cost_units(g, [loss])
    by_sig: dict = {}
    for u in units:
        by_sig.setdefault(u.signature, []).append(u)
    repeated = [us for us in by_sig.values() if len(us) == 3]
    assert len(repeated) >= 5
    for mesh_shape, rules in [("x:2;y:2", "batch:x;f:y"), ("x:4", "d:x"), ("x:2", "")]:
        ctx = LayoutContext.make(mesh_shape, rules)
        for us in repeated:
            costs = {unit_cost(u, ctx, HW) for u in us}
            assert len(costs) == 1


def test_evaluate_rejects_layouts_the_lowering_rejects() -> None:
    case = mlp_training()
    with pytest.raises(LayoutError, match="rows.*hidden|hidden.*rows"):
        evaluate(case.graph, "x:2", "rows:x;hidden:x", HW)
    with pytest.raises(mtf.IndivisibleDimensionError, match="rows"):
        evaluate(case.graph, "x:4", "rows:x", HW)
    with pytest.raises(LayoutError, match="'z'"):
        evaluate(case.graph, "x:2", "batch:z", HW)
    # An einsum whose two reduced dims share an axis, though no tensor has both.
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.einsum([mtf.zeros(m, "a:4"), mtf.zeros(m, "b:4")], output_shape="")
    with pytest.raises(LayoutError, match="Einsum"):
        evaluate(g, "x:2", "a:x;b:x", HW)


class _SecretlyDeferring(Operation):
    op_type = "SecretlyDeferring"

    def __init__(self, x: mtf.Tensor) -> None:
        super().__init__([x])
        self._add_output(x.shape, x.dtype)

    def communication(self, ctx):
        return [CollectiveSpec("allreduce", ("x",), 4, pending=True)]


def test_units_refuse_an_op_that_defers_without_being_known() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    _SecretlyDeferring(mtf.zeros(m, "a:4"))
    (unit,) = [u for u in cost_units(g) if u.ops[0].op_type == "SecretlyDeferring"]
    with pytest.raises(MtfError, match="may_defer"):
        unit_cost(unit, LayoutContext.make("x:2", ""), HW)


def test_cost_unit_is_a_hashable_value() -> None:
    case = mlp_training()
    units = cost_units(case.graph, case.outputs)
    assert len(set(units)) == len(units)
    assert all(isinstance(u, CostUnit) and u.signature is not None for u in units)


class _DeclaredDeferring(_SecretlyDeferring):
    op_type = "DeclaredDeferring"
    may_defer_allreduce = True


def test_an_op_declaring_that_it_defers_gets_a_deferred_unit() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    y = _DeclaredDeferring(mtf.zeros(m, "a:4")).outputs[0]
    mtf.exp(y)
    units = cost_units(g)
    (deferred,) = [u for u in units if u.kind == DEFERRED]
    assert [op.op_type for op in deferred.ops] == ["DeclaredDeferring", "Unary"]
    ctx = LayoutContext.make("x:2", "")
    assert [c.bytes_per_device for c in unit_cost(deferred, ctx, HW).collectives] == [4]
    assert [c.kind for c in evaluate(g, "x:2", "", HW).collectives] == ["allreduce"]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_unit_classes_count_the_units_of_each_signature_and_dim_set(name: str) -> None:
    case = BUILDERS[name]()
    units = cost_units(case.graph, case.outputs)
    classes = cost_unit_classes(case.graph, case.outputs)
    expected: dict = {}
    for u in units:
        expected.setdefault((u.dim_names, u.signature), []).append(u)
    assert [(c.unit, c.count) for c in classes] == [
        (us[0], len(us)) for us in expected.values()
    ]
    assert sum(c.count for c in classes) == len(units)


def test_a_deep_graph_has_as_many_unit_classes_as_a_shallow_one() -> None:
    from mtf_core.models import TransformerConfig, build_lm

    sizes = dict(d_model=8, d_ff=16, heads=2, d_kv=4, vocab=16, batch=2, length=4)
    counts = []
    for layers in (2, 5):
        model = build_lm(TransformerConfig(num_layers=layers, **sizes))
        classes = cost_unit_classes(model.graph, [model.loss])
        counts.append(len(classes))
        units = cost_units(model.graph, [model.loss])
        assert sum(c.count for c in classes) == len(units)
    assert counts[0] == counts[1]


def test_a_residual_stream_keeps_its_deferred_units_per_layer() -> None:
    # ``x + f(x)``: f forces x before the add, so the add cannot keep a sum
    # pending and the layers' deferred units stay apart, however deep the
    # stack (one unit chained through every layer is priced far more slowly).
    sizes = []
    for layers in (2, 6):
        g = mtf.Graph()
        m = mtf.Mesh(g, "m")
        x = mtf.einsum([mtf.zeros(m, "b:4,k:4"), mtf.zeros(m, "k:4,d:4")], "b:4,d:4")
        for i in range(layers):
            w = mtf.get_variable(m, f"w{i}", "d:4,f:4")
            h = mtf.einsum([x, w], output_shape="b:4,f:4")
            x = x + mtf.einsum([h, mtf.get_variable(m, f"v{i}", "f:4,d:4")], "b:4,d:4")
        loss = mtf.reduce_sum(x)
        mtf.gradients([loss], [op.outputs[0] for op in g.trainable_variables])
        deferred = [u for u in cost_units(g, [loss]) if u.kind == DEFERRED]
        assert not any(op.op_type == "Binary" for u in deferred for op in u.ops[:1])
        sizes.append(max(len(u.ops) for u in deferred))
    assert sizes[0] == sizes[1] <= 4


def test_a_pricer_refuses_a_layout_of_another_mesh() -> None:
    case = mlp_training()
    (unit, *_) = cost_units(case.graph, case.outputs)
    pricer = UnitPricer(mtf.convert_to_shape("x:2"), HW)
    with pytest.raises(MtfError, match="x:4"):
        pricer.cost(unit, LayoutContext.make("x:4", ""))


def test_signatures_survive_pickling_with_a_fresh_hash() -> None:
    import pickle

    case = mlp_training()
    units = cost_units(case.graph, case.outputs)
    sig = units[-1].signature
    copy = pickle.loads(pickle.dumps(sig))
    assert copy == sig and hash(copy) == hash(tuple(sig)) == hash(sig)
    assert {sig: 1}[tuple(sig)] == 1  # equal to, and hashed like, a plain tuple
