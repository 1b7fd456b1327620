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
