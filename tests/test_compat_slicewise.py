"""``mtf.slicewise`` (a TF function per slice), its generic gradient,
``mtf.depend`` and ``mtf.Print``: values equal to one device, no collectives."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mtf_core as mtf

pytestmark = pytest.mark.tf

LAYOUTS = [("all:1", ""), ("all:4", "a:all"), ("r:2;c:2", "a:r;b:c")]


@pytest.fixture(autouse=True)
def _devices(devices):
    """The process's logical CPUs are configured before any TF work."""


def _run(layout, build):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x_np = np.linspace(-1.0, 1.0, 8 * 4, dtype=np.float32).reshape(8, 4)
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), "a:8,b:4")
    outs = build(x)
    shape, rules = layout
    n = mtf.convert_to_shape(shape).size
    impl = mtf.PlacementMeshImpl(shape, rules, mtf.logical_devices(8)[:n])
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = [lowering.export_to_tf_tensor(t).numpy() for t in outs]
    return x_np, values, lowering.counters


@pytest.mark.parametrize("layout", LAYOUTS)
def test_slicewise_and_its_tf_gradient_match_one_device(layout):
    def build(x):
        y = mtf.slicewise(tf.sin, [x], name="sin")
        loss = mtf.reduce_sum(y * y)
        (dx,) = mtf.gradients([loss], [x])
        return [y, dx]

    x_np, (y, dx), counters = _run(layout, build)
    np.testing.assert_allclose(y, np.sin(x_np), rtol=1e-6)
    np.testing.assert_allclose(dx, 2 * np.sin(x_np) * np.cos(x_np), rtol=1e-5)
    # Only the loss's sum communicates; the slicewise op and its gradient none.
    assert all(
        c.op_type not in ("Slicewise", "GenericGrad") for c in counters.collectives
    )


def test_slicewise_grad_function_and_splittable_dims():
    def build(x):
        op = mtf.SlicewiseOperation(
            tf.exp, [x], [x.shape], [x.dtype], splittable_dims=["a"],
            grad_function=lambda op, dy: [dy * op.outputs[0]],
        )  # fmt: skip
        assert op.splittable_dims == frozenset(["a"])
        assert op.unsplittable_dims == frozenset(["b"])
        (dx,) = mtf.gradients([mtf.reduce_sum(op.outputs[0])], [x])
        return [dx]

    x_np, (dx,), _ = _run(("all:4", "a:all"), build)
    np.testing.assert_allclose(dx, np.exp(x_np), rtol=1e-6)


def test_slicewise_several_outputs():
    def build(x):
        lo, hi = mtf.slicewise(
            lambda t: (tf.minimum(t, 0.0), tf.maximum(t, 0.0)), [x],
            output_shape=[x.shape, x.shape], output_dtype=[x.dtype, x.dtype],
        )  # fmt: skip
        return [lo, hi]

    x_np, (lo, hi), _ = _run(("all:4", "a:all"), build)
    np.testing.assert_array_equal(lo, np.minimum(x_np, 0))
    np.testing.assert_array_equal(hi, np.maximum(x_np, 0))


def test_depend_orders_its_output_after_the_assignment():
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "m")
        w = mtf.get_variable(mesh, "w", "a:4", initializer=tf.zeros_initializer())
        update = mtf.assign(w, mtf.ones(mesh, "a:4"))
        after = mtf.depend(w * 2.0, [update])
        impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
        lowering = mtf.Lowering(graph, {mesh: impl})
        assigns = {op.name for op in lowering.lowered_operations[update]}
        slices = lowering.lowered_operation(after).slices
        assert len(slices) == 2
        for s in slices:
            assert {c.name for c in s.op.control_inputs} == assigns


def test_print_passes_its_input_through(capfd):
    def build(x):
        return [mtf.Print(x, [mtf.reduce_sum(x)], "total: ")]

    x_np, (y,), _ = _run(("all:4", "a:all"), build)
    np.testing.assert_array_equal(y, x_np)
    assert "total: " in capfd.readouterr().err


def test_add_n_of_nothing_is_zero_and_broadcasts_by_dim_names():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    assert mtf.add_n([]) == 0
    a = mtf.import_tf_tensor(mesh, tf.constant([1.0, 2.0]), "a:2")
    ab = mtf.import_tf_tensor(mesh, tf.ones([2, 3]), "a:2,b:3")
    total = mtf.add_n([a, ab, a])
    assert total.shape == mtf.Shape("a:2,b:3")
    impl = mtf.PlacementMeshImpl("all:2", "a:all", mtf.logical_devices(8)[:2])
    value = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(total).numpy()
    np.testing.assert_array_equal(value, [[3.0] * 3, [5.0] * 3])


def test_print_and_scalar_summary_round_trip_and_slicewise_is_refused():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, "a:4")
    mtf.scalar_summary("total", mtf.Print(x, [x], "x: ", summarize=2))
    loaded = mtf.graph_from_json(mtf.graph_to_json(graph))
    ops = {op.op_type: op for op in loaded.graph.operations}
    assert ops["Print"].message == "x: " and ops["Print"].summarize == 2
    assert ops["ScalarSummary"].summary_name == "total"
    mtf.slicewise(tf.exp, [x])
    with pytest.raises(mtf.SerializationError, match="Python TensorFlow function"):
        mtf.graph_from_json(mtf.graph_to_json(graph))
