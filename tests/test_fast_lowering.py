"""The lowering's fast op path (mtf_core/lowering/fast_tf.py) and its deferred
device placement (placing.py): the same ops, values and devices as the slow
road, with fewer TF ops per step."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import LayoutCase
from test_lowering import _batches, _training_step

import mtf_core as mtf
from mtf_core.lowering.fast_tf import FAST_TF
from mtf_core.lowering.placing import DeferredPlacement

pytestmark = pytest.mark.tf


@pytest.fixture(autouse=True)
def _logical_devices(devices: list[str]) -> None:
    """TF's devices are set up before any test here touches TensorFlow."""


class _Placed(LayoutCase):
    """A layout case that stays on the placement backend (what these tests are
    about) when the SPMD suite swaps ``LayoutCase.impl``."""

    def impl(self, devices: list[str]) -> mtf.PlacementMeshImpl:
        return mtf.PlacementMeshImpl(
            self.mesh_shape, self.rules, devices[: self.n_devices]
        )


PLACED_2D = _Placed("placed_2d", "data:2;model:4", "batch:data;hidden:model")

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0 + 0.5
Y = np.linspace(0.5, 2.0, 12, dtype=np.float32).reshape(3, 4)

FAST_CALLS = [
    ("Mul", lambda t, x, y: t.math.multiply(x, y)),
    ("AddV2", lambda t, x, y: t.math.add(x, y)),
    ("Sub", lambda t, x, y: t.math.subtract(x, y)),
    ("RealDiv", lambda t, x, y: t.math.divide(x, y)),
    ("Maximum", lambda t, x, y: t.math.maximum(x, y)),
    ("Pow", lambda t, x, y: t.math.pow(x, y)),
    ("Greater", lambda t, x, y: t.math.greater(x, y)),
    ("Exp", lambda t, x, y: t.math.exp(x)),
    ("Log", lambda t, x, y: t.math.log(x)),
    ("Neg", lambda t, x, y: t.math.negative(x)),
    ("Relu", lambda t, x, y: t.nn.relu(x - 1.0)),
    ("Sum", lambda t, x, y: t.math.reduce_sum(x, axis=[1])),
    ("Max", lambda t, x, y: t.math.reduce_max(x, axis=[0], keepdims=True)),
    ("AddN", lambda t, x, y: t.add_n([x, y, x])),
    ("Einsum", lambda t, x, y: t.einsum("ab,cb->ac", x, y)),
    ("Reshape", lambda t, x, y: t.reshape(x, [4, 3])),
    ("Transpose", lambda t, x, y: t.transpose(x, [1, 0])),
    ("Identity", lambda t, x, y: t.identity(x)),
]


def _trace(fn, namespace):
    """Runs ``fn(namespace, x, y)`` inside a tf.function; returns the value and
    the op types it created."""
    created: list[str] = []

    @tf.function(autograph=False)
    def run(x, y):
        g = tf.compat.v1.get_default_graph()
        n0 = g.num_operations()
        out = fn(namespace, x, y)
        created.extend(op.type for op in g.get_operations()[n0:])
        return out

    return run(tf.constant(X), tf.constant(Y)).numpy(), created


@pytest.mark.parametrize("op_type,fn", FAST_CALLS, ids=[c[0] for c in FAST_CALLS])
def test_fast_ops_equal_tensorflows_own(op_type: str, fn) -> None:
    fast, fast_ops = _trace(fn, FAST_TF)
    slow, slow_ops = _trace(fn, tf)
    np.testing.assert_array_equal(fast, slow)
    assert op_type in fast_ops and op_type in slow_ops
    # never more ops than TensorFlow's own functions make
    assert len(fast_ops) <= len(slow_ops)


def test_fast_ops_take_tensorflows_road_for_what_they_do_not_handle() -> None:
    # eager, Python scalars, mixed dtypes, three-input einsums: TF's functions
    assert FAST_TF.math.multiply(tf.constant(2.0), 3.0).numpy() == 6.0
    assert FAST_TF.math.multiply(2, 3).numpy() == 6
    three, ops = _trace(lambda t, x, y: t.einsum("ab,ab,ab->a", x, y, x), FAST_TF)
    np.testing.assert_allclose(three, np.einsum("ab,ab,ab->a", X, Y, X), rtol=1e-6)
    assert "Einsum" in ops
    ints, _ = _trace(
        lambda t, x, y: t.math.divide(
            tf.cast(x * 4.0, tf.int32) + 1, tf.cast(y, tf.int32) + 1
        ),
        FAST_TF,
    )
    want = ((X * 4).astype(np.int32) + 1) / (Y.astype(np.int32) + 1)
    np.testing.assert_allclose(ints, want)
    assert FAST_TF.concat is tf.concat


def test_deferred_placement_places_every_op_made_inside(devices: list[str]) -> None:
    placement = DeferredPlacement()

    @tf.function(autograph=False)
    def run(x):
        with placement.on(devices[3]):
            y = tf.math.exp(x) * 2.0
        with placement.on(devices[5]):
            z = tf.reduce_sum(y)
        placement.flush()
        return y, z

    concrete = run.get_concrete_function(tf.TensorSpec([2], tf.float32))
    by_type = {op.type: op.device for op in concrete.graph.get_operations()}
    assert by_type["Exp"].endswith("CPU:3") and by_type["Mul"].endswith("CPU:3")
    assert by_type["Sum"].endswith("CPU:5")
    # eagerly it is tf.device
    with placement.on(devices[2]):
        assert tf.constant(1.0).device.endswith("CPU:2")


def test_a_compiled_step_places_each_op_on_a_mesh_device(devices: list[str]) -> None:
    fn, _ = _training_step(PLACED_2D, devices)
    fn.trace()
    ops = fn.concrete.graph.get_operations()
    placed = Counter(op.device.rsplit(":", 1)[-1] for op in ops if op.device)
    assert sorted(placed) == [str(i) for i in range(PLACED_2D.n_devices)]
    unplaced = Counter(op.type for op in ops if not op.device)
    # only the function's own plumbing (arguments, step counter, outputs)
    assert sum(unplaced.values()) <= 12, unplaced
    assert not {"Einsum", "Mul", "AddN", "AssignVariableOp"} & set(unplaced)
    assert unplaced["ReadVariableOp"] <= 1  # the step counter's


def test_a_scalar_used_by_many_ops_is_one_const_per_device(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.import_tf_tensor(mesh, np.ones((4, 4), np.float32), "a:4,b:4")
    outs = [x * 0.25 for _ in range(6)] + [x * 0.5]
    impl = mtf.PlacementMeshImpl("x:4", "a:x", devices[:4])

    @tf.function(autograph=False)
    def run():
        lowering = mtf.Lowering(graph, {mesh: impl})
        return [lowering.export_to_tf_tensor(t) for t in outs]

    concrete = run.get_concrete_function()
    consts = [
        op
        for op in concrete.graph.get_operations()
        if op.type == "Const"
        and op.outputs[0].shape.rank == 0
        and op.outputs[0].dtype == tf.float32
    ]
    assert len(consts) == 2 * 4  # 0.25 and 0.5, once on each device
    values = [v.numpy() for v in run()]
    for v in values[:6]:
        np.testing.assert_array_equal(v, np.full((4, 4), 0.25, np.float32))
    np.testing.assert_array_equal(values[6], np.full((4, 4), 0.5, np.float32))


def test_a_step_reads_variables_before_it_assigns_them(devices: list[str]) -> None:
    # The assigned value does not depend on the variable, so only the order the
    # lowering adds keeps the output from seeing the new value.
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    v = mtf.get_variable(mesh, "v", "a:4,b:2", initializer=tf.ones)
    x = mtf.placeholder(mesh, "a:4,b:2", "float32", name="x")
    out = mtf.reduce_sum(v * 2.0)
    update = mtf.assign(v, x)
    impl = mtf.PlacementMeshImpl("x:2;y:2", "a:x;b:y", devices[:4])
    step = mtf.compile_function(
        graph, {mesh: impl}, inputs=[x], outputs=[out], updates=[update]
    )
    threes = np.full((4, 2), 3.0, np.float32)
    for want in (16.0, 48.0, 48.0):
        (got,) = step(threes)
        assert got == want
    np.testing.assert_array_equal(step.variables.export(v.operation), threes)


def test_a_step_without_outputs_still_applies_its_updates(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    v = mtf.get_variable(mesh, "v", "a:4", initializer=tf.zeros)
    update = mtf.assign_add(v, mtf.ones(mesh, "a:4"))
    impl = mtf.PlacementMeshImpl("x:4", "a:x", devices[:4])
    step = mtf.compile_function(graph, {mesh: impl}, updates=[update])
    assert step() == [] and step() == []
    np.testing.assert_array_equal(step.variables.export(v.operation), [2.0] * 4)
    with pytest.raises(mtf.LoweringError, match="takes 0 inputs"):
        step(np.zeros(4))


def test_shape_constants_are_shared_by_the_ops_of_one_device(
    devices: list[str],
) -> None:
    placement = DeferredPlacement()

    @tf.function(autograph=False)
    def run(x):
        outs = []
        for dev in (devices[0], devices[0], devices[1]):
            with placement.on(dev):
                outs.append(FAST_TF.reshape(x, [4, 3]))
                outs.append(FAST_TF.math.reduce_sum(x, axis=[1]))
        placement.flush()
        return outs

    concrete = run.get_concrete_function(tf.TensorSpec([3, 4], tf.float32))
    consts = [op for op in concrete.graph.get_operations() if op.type == "Const"]
    by_device = Counter(op.device.rsplit(":", 1)[-1] for op in consts)
    assert by_device == {"0": 2, "1": 2}  # [4, 3] and [1] on each device
    values = [v.numpy() for v in run(tf.constant(X.reshape(3, 4)))]
    np.testing.assert_array_equal(values[0], X.reshape(4, 3))
    np.testing.assert_array_equal(values[5], X.reshape(3, 4).sum(axis=1))


def test_placement_merges_with_an_enclosing_device_scope(devices: list[str]) -> None:
    placement = DeferredPlacement()

    @tf.function(autograph=False)
    def run(x):
        with tf.device("/job:localhost/replica:0/task:0"):
            with placement.on("/device:CPU:1"):
                y = tf.math.exp(x)
        with tf.device(devices[4]):
            with placement.on(""):  # no device: the outer scope's stays
                z = tf.math.log(x)
            with placement.on(devices[2]):
                with placement.on(devices[6]):  # the inner one wins
                    w = tf.math.sqrt(x)
                v = tf.math.square(x)
        placement.flush()
        return y, z, w, v

    g = run.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph
    dev = {op.type: op.device for op in g.get_operations()}
    assert dev["Exp"] == "/job:localhost/replica:0/task:0/device:CPU:1"
    assert dev["Log"].endswith("CPU:4")
    assert dev["Sqrt"].endswith("CPU:6")
    assert dev["Square"].endswith("CPU:2")


def test_ops_made_by_forcing_a_pending_sum_after_lowering_are_placed(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.import_tf_tensor(mesh, np.ones((4, 8), np.float32), "a:4,k:8")
    w = mtf.import_tf_tensor(mesh, np.ones((8, 2), np.float32), "k:8,h:2")
    y = mtf.einsum([x, w], output_shape="a:4,h:2")  # pending over x
    impl = mtf.PlacementMeshImpl("x:4", "k:x", devices[:4])
    made = []

    @tf.function(autograph=False)
    def run():
        lowering = mtf.Lowering(graph, {mesh: impl})
        g = tf.compat.v1.get_default_graph()
        n0 = g.num_operations()
        laid = lowering.tensors[y]  # forces the allreduce now
        made.extend(g.get_operations()[n0:])
        return laid.slices

    run.get_concrete_function()
    assert [op.type for op in made] == ["AddN"]
    assert made[0].device.endswith("CPU:0")


def test_several_updates_of_one_variable_apply_in_order(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    v = mtf.get_variable(mesh, "v", "a:4", initializer=tf.zeros)
    x = mtf.placeholder(mesh, "a:4", "float32", name="x")
    updates = [mtf.assign(v, x), mtf.assign_add(v, x), mtf.assign_sub(v, x * 3.0)]
    impl = mtf.PlacementMeshImpl("x:2", "a:x", devices[:2])
    step = mtf.compile_function(graph, {mesh: impl}, inputs=[x], updates=updates)
    for _ in range(5):
        step(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(
            step.variables.export(v.operation), -np.arange(4, dtype=np.float32)
        )


def test_an_assignment_of_a_dtype_without_a_fast_road_is_still_an_op(
    devices: list[str],
) -> None:
    from mtf_core.lowering.fast_tf import assign_variable

    flag = tf.Variable(False)

    @tf.function(autograph=False)
    def run():
        op = assign_variable(flag, tf.constant(True))
        assert isinstance(op, tf.Operation)
        return tf.constant(0)

    run()
    assert bool(flag.numpy())


def test_graph_optimization_is_off_on_cpu_meshes_and_changes_no_value(
    devices: list[str],
) -> None:
    from tensorflow.python.eager import context

    losses = {}
    for optimize in (None, True):
        fn, _ = _training_step(PLACED_2D, devices)
        if optimize is not None:
            fn.graph_optimization = optimize
        before = context.context().function_call_options.config_proto_serialized
        losses[optimize] = [fn(*b)[0] for b in _batches(2)]
        # the caller's options are left as they were
        assert context.context().function_call_options.config_proto_serialized == before
        assert fn.graph_optimization is (optimize is True)
    np.testing.assert_allclose(losses[None], losses[True], rtol=1e-6)
