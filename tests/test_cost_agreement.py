"""The cost model and the lowering agree: for every op family, the MLP training
step and random graphs, under several layouts on up to 8 logical CPU devices,
``evaluate()`` predicts exactly the collectives (kind, mesh axes, bytes per
device, in order) and the flops per device that a real Lowering records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cost_graphs import BUILDERS, Case

import mtf_core as mtf
from cost_models import evaluate
from mtf_core.liveness import step_targets
from mtf_core.shapes import convert_to_shape

pytestmark = pytest.mark.tf


def lowered(case: Case, mesh_shape: str, rules: str, devices: list[str]):
    n = convert_to_shape(mesh_shape).size
    impl = mtf.PlacementMeshImpl(mesh_shape, rules, devices[:n])
    # what a step exporting the outputs lowers (and evaluate prices)
    targets = step_targets(case.graph, case.outputs)
    lowering = mtf.Lowering(case.graph, {case.mesh: impl}, targets=targets)
    values = [lowering.export_to_tf_tensor(t).numpy() for t in case.outputs]
    return lowering.counters, values


def assert_agrees(case: Case, mesh_shape: str, rules: str, devices: list[str]):
    counters, values = lowered(case, mesh_shape, rules, devices)
    cost = evaluate(case.graph, mesh_shape, rules, "cpu-host", case.outputs)
    recorded = [(c.kind, c.mesh_axes, c.bytes_per_device) for c in counters.collectives]
    predicted = [(c.kind, c.mesh_axes, c.bytes_per_device) for c in cost.collectives]
    assert predicted == recorded, f"{rules} on {mesh_shape}"
    assert [c.reduction or "SUM" for c in counters.collectives] == [
        c.reduction for c in cost.collectives
    ]
    assert cost.flops_per_device == pytest.approx(
        counters.get("flops_per_device", 0.0), rel=1e-12
    )
    return cost, values


@pytest.mark.parametrize(
    "family",
    [
        "einsum",
        "lazy_sums",
        "residual",
        "custom_gradient",
        "reductions",
        "elementwise",
        "reshape",
    ],
)
def test_predicted_collectives_equal_lowered_ones_for_core_op_families(
    family: str, devices: list[str]
) -> None:
    case = BUILDERS[family]()
    for mesh_shape, rules in case.layouts:
        assert_agrees(case, mesh_shape, rules, devices)


@pytest.mark.parametrize("family", ["slicing", "indexing", "random", "conv"])
def test_predicted_collectives_equal_lowered_ones_for_newer_op_families(
    family: str, devices: list[str]
) -> None:
    case = BUILDERS[family]()
    for mesh_shape, rules in case.layouts:
        assert_agrees(case, mesh_shape, rules, devices)


@pytest.mark.parametrize("optimizer", ["mlp_sgd", "mlp_adam"])
def test_mlp_training_step_collectives_match_the_lowering(
    optimizer: str, devices: list[str]
) -> None:
    case = BUILDERS[optimizer]()
    reference = None
    kinds = set()
    for mesh_shape, rules in case.layouts:
        cost, values = assert_agrees(case, mesh_shape, rules, devices)
        kinds.update(c.mesh_axes for c in cost.collectives)
        if reference is None:
            reference = values
        np.testing.assert_allclose(values[0], reference[0], rtol=1e-5)
    # The layouts really communicate, over both axes of the 2-D meshes.
    assert {("x",), ("y",)} <= kinds


def test_lazy_sum_of_two_einsums_reduces_once(devices: list[str]) -> None:
    case = BUILDERS["lazy_sums"]()
    cost, _ = assert_agrees(case, "x:2", "k:x;j:x", devices)
    # p1, p2, p3 pend over x; p1 + p2 and the add_n stay pending; p1 + p3
    # (shapes differ) forces p1 and p3; exp of the identity forces the add_n
    # once (the second read finds it reduced); the export forces the last one.
    allreduces = [c for c in cost.collectives if c.kind == "allreduce"]
    assert len(allreduces) == 4
    assert all(c.mesh_axes == ("x",) for c in allreduces)
    assert {c.bytes_per_device for c in allreduces} == {4 * 4 * 4}


def test_unexported_pending_output_is_never_reduced(devices: list[str]) -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    a = mtf.ones(m, "b:4,k:4")
    y = mtf.einsum([a, a], output_shape="b:4")
    counters, _ = lowered(Case(g, m, []), "x:2", "k:x", devices)
    assert counters.collectives == []
    assert evaluate(g, "x:2", "k:x", "cpu-host").collectives == ()
    cost = evaluate(g, "x:2", "k:x", "cpu-host", outputs=[y])
    assert [(c.kind, c.bytes_per_device) for c in cost.collectives] == [
        ("allreduce", 4 * 4)
    ]


# -- random graphs -------------------------------------------------------------

DIMS = {"a": 4, "b": 8, "c": 4, "d": 8}


@st.composite
def random_graph_case(draw: st.DrawFn) -> tuple[Case, str, str]:
    """A few einsums, sums, add_ns, identities and reductions over 4 dims."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    rng = np.random.RandomState(draw(st.integers(0, 1000)))
    pool: list[mtf.Tensor] = []
    for _ in range(3):
        names = sorted(
            draw(st.sets(st.sampled_from(sorted(DIMS)), min_size=1, max_size=3))
        )
        shape = ",".join(f"{n}:{DIMS[n]}" for n in names)
        s = convert_to_shape(shape)
        pool.append(
            mtf.constant(m, rng.randn(*s.to_integer_list()).astype("float32"), s)
        )
    for _ in range(draw(st.integers(3, 8))):
        kind = draw(
            st.sampled_from(["einsum", "add", "add_n", "identity", "reduce", "unary"])
        )
        x = draw(st.sampled_from(pool))
        y = draw(st.sampled_from(pool))
        if kind == "einsum" and (x.shape.ndims or y.shape.ndims):
            dims = {d.name: d for d in x.shape.dims + y.shape.dims}
            keep = draw(st.sets(st.sampled_from(sorted(dims)), max_size=2))
            pool.append(
                mtf.einsum([x, y], output_shape=[dims[n] for n in sorted(keep)])
            )
        elif kind == "add" and x.shape == y.shape:
            pool.append(x + y)
        elif kind == "add_n":
            same = [t for t in pool if t.shape == x.shape]
            pool.append(mtf.add_n(same[-3:]) if len(same) > 1 else mtf.exp(x))
        elif kind == "identity":
            pool.append(mtf.identity(x))
        elif kind == "reduce" and x.shape.ndims:
            red = draw(st.sampled_from(x.shape.dimension_names))
            fn = draw(st.sampled_from([mtf.reduce_sum, mtf.reduce_max]))
            pool.append(fn(x, reduced_dim=red))
        else:
            pool.append(mtf.tanh(x))
    outputs = draw(st.lists(st.sampled_from(pool[3:]), max_size=3, unique=True))
    mesh_shape = draw(st.sampled_from(["x:2", "x:2;y:2", "x:2;y:4", "x:1;y:4"]))
    # Mostly one dim per mesh axis (valid layouts); sometimes a second one,
    # which is legal only if no op has both.
    rules = []
    for axis in [d.name for d in convert_to_shape(mesh_shape)]:
        dims = draw(st.lists(st.sampled_from(sorted(DIMS)), max_size=2, unique=True))
        rules += [f"{n}:{axis}" for n in dims[: 1 + draw(st.integers(0, 4)) // 4]]
    names = [r.split(":")[0] for r in rules]
    if len(set(names)) != len(names):  # one dim on two axes: not a layout
        rules = rules[:1]
    return Case(g, m, outputs), mesh_shape, ";".join(rules)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(random_graph_case())
def test_random_graphs_predict_the_lowered_collectives(
    devices: list[str], drawn: tuple[Case, str, str]
) -> None:
    case, mesh_shape, rules = drawn
    try:
        cost = evaluate(case.graph, mesh_shape, rules, "cpu-host", case.outputs)
    except mtf.LayoutError:
        with pytest.raises(mtf.LayoutError):
            lowered(case, mesh_shape, rules, devices)
        return
    counters, _ = lowered(case, mesh_shape, rules, devices)
    assert [(c.kind, c.mesh_axes, c.bytes_per_device) for c in cost.collectives] == [
        (c.kind, c.mesh_axes, c.bytes_per_device) for c in counters.collectives
    ]
