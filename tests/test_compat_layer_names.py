"""Mesh TF programs' dense layers name their weights as Mesh TF 0.1.21 does
(``tf.variable_scope`` per call), so unnamed layers no longer share weights;
mtf_core's own layers keep their names."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import mtf_core

# What Mesh TF 0.1.21 itself names the weights of the program in
# _mesh_tf_program (run beside it on TensorFlow 2.21, graph mode): each
# unnamed dense opens a scope for its kernel and another for its bias.
MESH_TF_NAMES = [
    "dense/kernel", "dense_1/bias", "dense_2/kernel", "dense_3/bias",
    "proj/kernel", "proj/bias",
    "outer/dense_relu_dense/wi/kernel", "outer/dense_relu_dense/wo/kernel",
    "outer/wi_0/kernel", "outer/wi_0/bias", "outer/wi_1/kernel", "outer/wi_1/bias",
]  # fmt: skip


@pytest.fixture
def mtf():
    import tensorflow  # noqa: F401  (Mesh TF programs have it loaded)

    import mtf_core.compat as compat

    compat.install()
    import mesh_tensorflow

    yield mesh_tensorflow
    compat.uninstall()


def _mesh_tf_program(mtf):
    import tensorflow.compat.v1 as tf

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.zeros(mesh, mtf.Shape([mtf.Dimension("b", 2), mtf.Dimension("d", 4)]))
    h = mtf.Dimension("h", 3)
    d = x.shape.dims[-1]
    y = mtf.layers.dense(x, h, reduced_dims=[d])
    z = mtf.layers.dense(x, h, reduced_dims=[d])
    mtf.layers.dense(x, h, reduced_dims=[d], name="proj")
    with tf.variable_scope("outer"):
        mtf.layers.dense_relu_dense(x, mtf.Dimension("f", 5), is_training=False)
        mtf.layers.dense_product(
            x, [d], h, activation_functions=["relu", "linear"], name="wi"
        )
    return graph, y, z


def test_dense_layers_name_their_weights_as_mesh_tf_does(mtf):
    import tensorflow as tf

    with tf.Graph().as_default():  # TF's scope counts start afresh
        graph, y, z = _mesh_tf_program(mtf)
    assert [v.name for v in graph.all_variables] == MESH_TF_NAMES


def test_two_unnamed_dense_layers_have_their_own_weights(mtf):
    import tensorflow as tf

    from mtf_core.ops.variables import as_variable

    with tf.Graph().as_default():
        graph, y, z = _mesh_tf_program(mtf)
    ky, kz = (t.operation.inputs[0].operation.inputs[1] for t in (y, z))
    assert as_variable(ky).name == "dense/kernel"
    assert as_variable(kz).name == "dense_2/kernel"
    # Before, both read one "dense_kernel"; a third of another shape failed.
    with tf.Graph().as_default():
        g = mtf.Graph()
        m = mtf.Mesh(g, "m")
        x = mtf.zeros(m, "b:2,d:4")
        mtf.layers.dense(x, mtf.Dimension("h", 3), reduced_dims=x.shape.dims[-1:])
        mtf.layers.dense(x, mtf.Dimension("h", 7), reduced_dims=x.shape.dims[-1:])
    assert [v.shape.to_integer_list() for v in g.all_variables] == [
        [4, 3], [3], [4, 7], [7],
    ]  # fmt: skip


def test_mtf_cores_own_layers_keep_their_names_beside_mesh_tf(mtf):
    """The same process, TensorFlow loaded and the compatibility layer
    installed: mtf_core's layers name weights ``{layer}_{part}`` and two
    calls of one name share them (the model builders and recomputed blocks
    find weights again by name)."""
    import tensorflow as tf

    with tf.Graph().as_default():
        g = mtf_core.Graph()
        m = mtf_core.Mesh(g, "m")
        x = mtf_core.zeros(m, "b:2,d:4")
        for _ in range(2):
            mtf_core.layers.dense(x, "h:3")
        mtf_core.layers.dense_relu_dense(x, "f:5")
    assert [v.name for v in g.all_variables] == [
        "dense_kernel", "dense_bias",
        "dense_relu_dense_wi_kernel", "dense_relu_dense_wo_kernel",
    ]  # fmt: skip


def test_a_dense_layer_without_bias_opens_its_second_scope_too(mtf):
    """Mesh TF opens the bias's scope around the einsum with a bias or
    without, so an unnamed layer without one still takes two scope names
    (names from Mesh TF 0.1.21 on the same program)."""
    import tensorflow as tf

    with tf.Graph().as_default():
        g = mtf.Graph()
        m = mtf.Mesh(g, "m")
        x = mtf.zeros(m, "b:2,d:4")
        d, o = x.shape.dims[-1], mtf.Dimension("o", 3)
        y = mtf.layers.dense(x, o, reduced_dims=[d], use_bias=False)
        mtf.layers.dense(y, d, reduced_dims=[o])
    assert [v.name for v in g.all_variables] == [
        "dense/kernel", "dense_2/kernel", "dense_3/bias",
    ]  # fmt: skip


_BEFORE_TF = """
import sys
import mtf_core.compat
import mesh_tensorflow as mtf
assert "tensorflow" not in sys.modules
g = mtf.Graph(); m = mtf.Mesh(g, "m")
x = mtf.zeros(m, "b:2,d:4")
mtf.layers.dense(x, mtf.Dimension("h", 3), reduced_dims=x.shape.dims[-1:], name="proj")
mtf.layers.dense(x, mtf.Dimension("h", 3), reduced_dims=x.shape.dims[-1:])
print(",".join(v.name for v in g.all_variables))
"""


def test_a_program_that_has_not_imported_tensorflow_gets_mesh_tf_names_too():
    """The first dense call loads TensorFlow (as its default initializers
    do), so its weights are named like every later one's."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    got = subprocess.run(
        [sys.executable, "-c", _BEFORE_TF],
        capture_output=True, text=True, cwd=root, timeout=300,
        env={**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["proj/kernel,proj/bias,dense/kernel,dense_1/bias"]
