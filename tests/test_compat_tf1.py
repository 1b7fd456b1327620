"""Mesh TF's TF1 graph-mode pieces: master variables and the copies between
masters and slices, ``BalancedVariablePlacer``, ``outside_all_rewrites``."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mtf_core as mtf

pytestmark = pytest.mark.tf


@pytest.fixture(autouse=True)
def _devices(devices):
    """The process's logical CPUs are configured before any TF work."""


def _graph_with_variable(placer=None):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m", placer)
    w = mtf.get_variable(
        mesh, "w", "a:4,b:2", initializer=tf.compat.v1.zeros_initializer()
    )
    return graph, mesh, w


def test_masters_and_slices_copy_both_ways_in_graph_mode():
    with tf.Graph().as_default():
        graph, mesh, w = _graph_with_variable()
        out = w * 2.0
        impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
        lowering = mtf.Lowering(graph, {mesh: impl})
        y = lowering.export_to_tf_tensor(out)
        (master,) = list(lowering.variables.masters)
        # The master is the full variable, named like the mtf variable.
        assert master.shape.as_list() == [4, 2]
        assert master.name.startswith("w")
        to_slices = lowering.copy_masters_to_slices()
        to_masters = lowering.copy_slices_to_masters()
        value = np.arange(8, dtype=np.float32).reshape(4, 2)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(y), np.zeros((4, 2)))
            sess.run(master.assign(value))
            np.testing.assert_array_equal(sess.run(y), np.zeros((4, 2)))
            sess.run(to_slices)
            np.testing.assert_array_equal(sess.run(y), 2 * value)
            sess.run(master.assign(np.zeros((4, 2), np.float32)))
            sess.run(to_masters)
            np.testing.assert_array_equal(sess.run(master), value)


def test_masters_are_made_on_first_use_eagerly():
    graph, mesh, w = _graph_with_variable()
    impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
    lowering = mtf.Lowering(graph, {mesh: impl})
    assert list(lowering.variables.masters) == []
    lowering.copy_slices_to_masters()
    (master,) = list(lowering.variables.masters)
    master.assign(np.ones((4, 2), np.float32))
    lowering.copy_masters_to_slices()
    np.testing.assert_array_equal(lowering.variables.export(w), np.ones((4, 2)))


def test_balanced_variable_placer_fills_the_emptiest_device():
    placer = mtf.utils.BalancedVariablePlacer(
        ["/cpu:0", "/cpu:1", "/cpu:2"], [100, 0, 0]
    )
    with tf.Graph().as_default():
        with tf.compat.v1.device(placer.device_function):
            devices = []
            for i in range(4):
                v = tf.compat.v1.get_variable(f"v{i}", [10, 10])  # 400 bytes
                devices.append(v.device)
    # cpu:1 and cpu:2 start empty; then cpu:0 (100 bytes) beats 400.
    assert [d.lower()[-5:] for d in devices] == ["cpu:1", "cpu:2", "cpu:0", "cpu:1"]


def test_balanced_variable_placer_rejects_mismatched_usage():
    with pytest.raises(ValueError, match="2 devices but 1 initial usages"):
        mtf.utils.BalancedVariablePlacer(["/cpu:0", "/cpu:1"], [5])


def test_masters_go_where_the_mesh_variable_placer_says():
    placer = mtf.utils.BalancedVariablePlacer(["/cpu:0", "/cpu:1"], [1, 0])
    with tf.Graph().as_default():
        graph, mesh, w = _graph_with_variable(placer)
        impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
        lowering = mtf.Lowering(graph, {mesh: impl})
        (master,) = list(lowering.variables.masters)
        assert master.device.lower().endswith("cpu:1")


def test_outside_all_rewrites_drops_control_dependencies():
    with tf.Graph().as_default():
        a = tf.constant(1.0)
        with tf.control_dependencies([a]):
            inside = tf.constant(2.0)
            with mtf.utils.outside_all_rewrites():
                outside = tf.constant(3.0)
        assert inside.op.control_inputs == [a.op]
        assert outside.op.control_inputs == []


def _tf1_training_graph():
    """w <- w - 0.1 * dL/dw for L = sum((w - 3)^2), and its lowering."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    w = mtf.get_variable(mesh, "w", "a:4", initializer=tf.compat.v1.zeros_initializer())
    loss = mtf.reduce_sum(mtf.square(w - 3.0))
    (dw,) = mtf.gradients([loss], [w])
    update = mtf.assign(w, w - dw * 0.1)
    mtf.scalar_summary("loss", loss)
    impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_update = tf.group(lowering.lowered_operation(update))
    return lowering, w, tf_loss, tf_update


def test_tf1_loop_saves_masters_and_restores_into_slices(tmp_path):
    # First run: three steps, a checkpoint of the masters.
    with tf.Graph().as_default():
        lowering, w, tf_loss, tf_update = _tf1_training_graph()
        assert "loss" in lowering.scalar_summaries
        assert tf.compat.v1.get_collection("mtf_scalar_summaries")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        step = tf.group(tf_update, global_step.assign_add(1))
        saver = tf.compat.v1.train.Saver(list(lowering.variables.masters))
        listener = mtf.MtfCheckpointSaverListener(lowering)
        hooks = [
            mtf.MtfRestoreHook(lowering),
            tf.compat.v1.train.CheckpointSaverHook(
                str(tmp_path), save_steps=3, saver=saver, listeners=[listener]
            ),
        ]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            losses = [sess.run([tf_loss, step])[0] for _ in range(3)]
        # L = 4 (w-3)^2 per element sum; w: 0 -> 0.6 -> 1.08 -> 1.464
        np.testing.assert_allclose(losses, [36.0, 23.04, 14.7456], rtol=1e-5)
    # Second run, a fresh graph: restoring the masters restores the slices.
    with tf.Graph().as_default():
        lowering, w, tf_loss, tf_update = _tf1_training_graph()
        saver = tf.compat.v1.train.Saver(list(lowering.variables.masters))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.restore(sess, tf.train.latest_checkpoint(str(tmp_path)))
            sess.run(lowering.copy_masters_to_slices())
            # w after 3 steps is 1.464 in every element: (3-1.464)^2*4
            np.testing.assert_allclose(sess.run(tf_loss), 4 * 1.536**2, rtol=1e-5)


def test_compile_function_in_graph_mode_returns_tensors_for_a_session():
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "m")
        x = mtf.placeholder(mesh, "a:4")
        w = mtf.get_variable(
            mesh, "w", "a:4", initializer=tf.compat.v1.ones_initializer()
        )
        y = mtf.reduce_sum(x * w)
        update = mtf.assign(w, w * 2.0)
        impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
        step = mtf.compile_function(graph, {mesh: impl}, [x], [y], [update])
        outs = step(np.ones(4, np.float32))
        assert all(isinstance(o, tf.Tensor) for o in outs)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            # Each run reads w, then doubles it.
            assert [float(sess.run(outs)[0]) for _ in range(3)] == [4.0, 8.0, 16.0]


def test_a_balanced_placer_makes_masters_in_get_variable_and_lowering_reuses_them():
    placer = mtf.utils.BalancedVariablePlacer(["/cpu:0", "/cpu:1"], [100, 0])
    with tf.Graph().as_default() as g:
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "m", placer)
        for i in range(3):
            mtf.get_variable(mesh, f"w{i}", "a:4,b:5")  # 80 bytes each
        devices = [g.get_operation_by_name(f"w{i}").device for i in range(3)]
        # cpu:1 starts empty; then 80 < 100 keeps it there; then cpu:0.
        assert [d[-5:] for d in devices] == ["cpu:1", "cpu:1", "cpu:0"]
        impl = mtf.PlacementMeshImpl("all:1", "", ["/cpu:0"])
        lowering = mtf.Lowering(graph, {mesh: impl})
        masters = list(lowering.variables.masters)
        assert [m.name for m in masters] == ["w0:0", "w1:0", "w2:0"]


def test_a_reshape_that_splits_anew_lowers_under_tf1_behaviour():
    # Under disable_v2_behavior a static dim is a TF1 Dimension: the
    # allsplit's slice size was one, which tf.slice refused.
    import subprocess
    import sys

    code = """
import numpy as np, tensorflow as tf
tf.compat.v1.disable_v2_behavior()
import mtf_core as mtf
graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
a, b, c = mtf.Dimension("a", 4), mtf.Dimension("b", 2), mtf.Dimension("c", 4)
x = mtf.import_tf_tensor(mesh, tf.reshape(tf.range(8.0), [4, 2]), [a, b])
y = mtf.reshape(x, [c, b])
impl = mtf.PlacementMeshImpl("all:2", "c:all", [""] * 2)
out = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)
with tf.compat.v1.Session() as s:
    print(s.run(out).ravel().tolist())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str([float(i) for i in range(8)])


def test_a_placers_master_is_named_by_its_variable_scope_once():
    import subprocess
    import sys

    code = """
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import mtf_core.compat
import mesh_tensorflow as mtf
for placer in (mtf.utils.BalancedVariablePlacer(["/cpu:0", "/cpu:0"]), None):
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "m", placer)
        with tf.compat.v1.variable_scope("encoder"):
            mtf.get_variable(mesh, "w", [mtf.Dimension("d", 4)])
        impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "", [""])
        lowering = mtf.Lowering(graph, {mesh: impl})
        print([m.name for m in lowering.variables.masters])
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # With a placer (made in get_variable) and without (made by the lowering).
    assert done.stdout.strip().splitlines()[-2:] == ["['encoder/w:0']"] * 2


def test_a_lowering_writes_its_variables_and_counters_to_a_log_file(devices, tmp_path):
    # Mesh TF's transformer/utils.py passes log_file= to its lowering.
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    w = mtf.get_variable(mesh, "w", "a:4,b:2")
    mtf.get_variable(mesh, "steps", "c:3", trainable=False)
    y = mtf.reduce_sum(w * 2.0)
    impl = mtf.PlacementMeshImpl("all:2", "a:all", devices[:2])
    log = tmp_path / "lowering.log"
    mtf.Lowering(graph, {mesh: impl}, log_file=str(log)).export_to_tf_tensor(y)
    text = log.read_text()
    assert "Variable    w " in text and "size 8 " in text and "slice_size 4 " in text
    assert "Variable    steps" not in text  # not trainable: counted, not listed
    assert "Trainable Variables count: 1 Total size: 8 Total slice_size: 4" in text
    assert "All Variables count: 2 Total size: 11 Total slice_size: 7" in text
    assert text.split("Counters:\n", 1)[1].strip()
    with pytest.raises(mtf.LoweringError, match="log_file '.*' cannot be written"):
        mtf.Lowering(graph, {mesh: impl}, log_file=str(tmp_path / "no" / "x.log"))


def test_shape_cumprod_and_laid_out_size_are_mesh_tfs(devices):
    shape = mtf.convert_to_shape("a:4,b:2,c:3")
    assert shape.cumprod == [1, 4, 8]  # Mesh TF: _cumprod(sizes)[:-1]
    assert [shape.cumprod_to_tensor_axis(p) for p in (1, 4, 8, 5)] == [0, 1, 2, None]
    assert mtf.convert_to_shape("a:1,b:1").cumprod_to_tensor_axis(1) == 1  # the last
    assert mtf.Shape([]).cumprod == []
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, "a:4,b:2")
    impl = mtf.PlacementMeshImpl("all:2", "a:all", devices[:2])
    lowering = mtf.Lowering(graph, {mesh: impl})
    # Split over both devices: 8 elements in all; replicated: 8 on each.
    assert lowering.laid_out_size(x) == impl.laid_out_size(x.shape) == 8
    assert impl.laid_out_size(mtf.convert_to_shape("b:2,c:3")) == 12
