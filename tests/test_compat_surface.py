"""Mesh TF names and behaviours its programs rely on, called as Mesh TF code
calls them (``import mtf_core.compat; import mesh_tensorflow as mtf``):
``mtf.range``, ``dropout(x, is_training, keep_prob)`` by position,
``layers.rename_length_to_memory_length``, Python int lists importing as
int32, ``convert_to_dimension(5)`` a ``TypeError``, ``mtf.utils.remove_summaries``,
``optimize.product_learning_rate``/``reduce_rms``; and the checks mtf_core
keeps stricter than Mesh TF's still name the value."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from services import require_module

import mtf_core

pytestmark = pytest.mark.tf


@pytest.fixture()
def mtf():
    import mtf_core.compat as compat

    compat.install()
    import mesh_tensorflow

    yield mesh_tensorflow
    compat.uninstall()


def _run(graph, mesh, outputs, mesh_shape="all:2", rules=""):
    n = mtf_core.convert_to_shape(mesh_shape).size
    impl = mtf_core.PlacementMeshImpl(
        mesh_shape, rules, mtf_core.logical_devices(8)[:n]
    )
    lowering = mtf_core.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t).numpy() for t in outputs]


def test_range_is_mtf_range_with_mesh_tf_arguments(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    length = mtf.Dimension("length", 6)
    assert mtf.range is mtf.mtf_range
    ints = mtf.range(mesh, length, dtype=tf.int32)
    floats = mtf.mtf_range(mesh, length, "float32")
    assert ints.dtype == "int32" and floats.dtype == "float32"
    got = _run(graph, mesh, [ints, floats], "all:2", "length:all")
    np.testing.assert_array_equal(got[0], np.arange(6))
    np.testing.assert_array_equal(got[1], np.arange(6, dtype=np.float32))


def test_dropout_takes_is_training_and_keep_prob_by_position(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.ones(mesh, "batch:4,d:64")
    assert mtf.dropout(x, False, 0.5) is x  # Mesh TF: (x, is_training, keep_prob)
    y = mtf.dropout(x, True, 0.25)
    (got,) = _run(graph, mesh, [y], "all:2", "batch:all")
    kept = got[got != 0]
    np.testing.assert_allclose(kept, 4.0)  # 1 / keep_prob
    assert 0.1 < kept.size / got.size < 0.4


def test_rename_length_to_memory_length(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    xv = np.arange(12, dtype=np.float32).reshape(2, 6)
    x = mtf.import_tf_tensor(mesh, xv, "batch:2,length:6")
    y = mtf.layers.rename_length_to_memory_length(x)
    assert y.shape == mtf.Shape("batch:2,memory_length:6")
    z = mtf.layers.rename_length_to_memory_length(x, "batch", "memory_batch")
    assert [d.name for d in z.shape.dims] == ["memory_batch", "length"]
    (got,) = _run(graph, mesh, [y], "all:2", "length:all;memory_length:all")
    np.testing.assert_array_equal(got, xv)


def test_a_python_int_list_imports_as_int32_and_adds_to_int32(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    ids = mtf.import_tf_tensor(mesh, [3, 1, 4, 1], "batch:4")
    assert ids.dtype == "int32"  # as tf.convert_to_tensor makes it
    total = ids + mtf.range(mesh, mtf.Dimension("batch", 4), tf.int32)
    (got,) = _run(graph, mesh, [total], "all:2", "batch:all")
    np.testing.assert_array_equal(got, [3, 2, 6, 4])


def test_convert_to_dimension_of_an_int_is_a_type_error_naming_it(mtf) -> None:
    for convert in (mtf.convert_to_dimension, mtf_core.convert_to_dimension):
        with pytest.raises(TypeError, match="cannot convert 5 to a Dimension"):
            convert(5)
    assert mtf.convert_to_shape(None) is None
    with pytest.raises(mtf_core.ShapeError, match="None"):
        mtf_core.convert_to_shape(None)


def test_stricter_checks_name_the_dims_and_dtypes(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    ids = mtf.zeros(mesh, "length:6", dtype=tf.int32)
    with pytest.raises(mtf.ShapeError, match="length:8 is already a dimension"):
        mtf.one_hot(ids, mtf.Dimension("length", 8))
    wide = mtf.ones(mesh, "length:6", dtype=tf.int64)
    with pytest.raises(mtf.DTypeError, match="is int32, .* is int64; cast one"):
        mtf.add(ids, wide)


def test_remove_summaries_empties_the_mtf_summary_collection(mtf) -> None:
    import mesh_tensorflow.utils as utils

    assert utils.SCALAR_SUMMARIES_COLLECTION_KEY == "mtf_scalar_summaries"
    with tf.Graph().as_default():
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "m")
        mtf.scalar_summary("loss", mtf.ones(mesh, "a:4"))
        impl = mtf.PlacementMeshImpl("all:2", "a:all", ["/cpu:0", "/cpu:0"])
        mtf.Lowering(graph, {mesh: impl})
        key = utils.SCALAR_SUMMARIES_COLLECTION_KEY
        assert [n for n, _ in tf.compat.v1.get_collection(key)] == ["loss"]
        utils.remove_summaries()
        assert tf.compat.v1.get_collection(key) == []


def test_product_learning_rate_and_reduce_rms(mtf) -> None:
    import mesh_tensorflow.optimize as optimize

    def linear_warmup(step, total):
        return min(1.0, step / 10.0)

    rate = optimize.product_learning_rate(
        25, 100, factors=[0.5, linear_warmup], offset=20
    )
    assert rate == pytest.approx(0.5 * 0.5)  # warmup sees step 5 of 80
    step = tf.constant(30.0)  # a TF step, as Mesh TF's Transformer passes it
    got = optimize.product_learning_rate(step, 100, factors=[linear_warmup, 2.0])
    assert float(got) == pytest.approx(2.0)

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    xv = np.array([[3.0, 4.0], [1.0, 7.0]], np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "a:2,b:2")
    rms = optimize.reduce_rms(x, reduced_dim=mtf.Dimension("b", 2))
    (got,) = _run(graph, mesh, [rms], "all:2", "b:all")
    np.testing.assert_allclose(got, np.sqrt((xv**2).mean(1)), rtol=1e-6)


def test_product_learning_rate_is_gin_configurable(mtf) -> None:
    gin = require_module("gin", "compat")
    import mesh_tensorflow.optimize as optimize

    with gin.unlock_config():
        gin.parse_config("optimize.product_learning_rate.factors = [0.1, 3.0]")
    try:
        assert optimize.product_learning_rate(1, 10) == pytest.approx(0.3)
    finally:
        gin.clear_config()


def test_summary_for_clip_activation_gradient_records_mesh_tfs_scalars(mtf) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    tv = np.array([[3.0, 4.0], [0.0, 1.0]], np.float32)
    t = mtf.import_tf_tensor(mesh, tv, "batch:2,d:2")
    mtf.layers.summary_for_clip_activation_gradient(t, "act", batch_dims="batch:2")
    impl = mtf.PlacementMeshImpl("all:2", "batch:all", mtf_core.logical_devices(8)[:2])
    lowering = mtf.Lowering(graph, {mesh: impl})
    got = {k: float(v.numpy()) for k, v in lowering.scalar_summaries.items()}
    rms = np.sqrt((tv**2).mean(1))
    want = {
        "mean/": tv.mean(),
        "max/": tv.max(),
        "rms_mean/act": rms.mean(),
        "rms_max/act": rms.max(),
        "rms_var/act": rms.var(),
    }
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key


def test_top_level_mesh_impl_answers_layout_questions_and_refuses_to_lower(
    mtf,
) -> None:
    impl = mtf.MeshImpl("x:2;y:4", layout_rules="batch:x;hidden:y")
    shape = mtf.Shape("batch:4,hidden:8,d:3")
    assert impl.size == 8 and impl.shape == mtf.Shape("x:2;y:4")
    assert impl.tensor_layout(shape) == mtf.TensorLayout([0, 1, None])
    assert impl.slice_shape(shape) == [2, 2, 3]
    assert impl.tensor_dimension_to_mesh_axis(mtf.Dimension("hidden", 8)) == 1
    with pytest.raises(NotImplementedError, match="use PlacementMeshImpl or SimdMesh"):
        impl.allreduce(None, [0], "SUM")


def test_selu_squared_relu_and_mesh_tfs_spellings(mtf) -> None:
    assert (mtf.mtf_pow, mtf.mtf_abs, mtf.mtf_slice) == (mtf.pow, mtf.abs, mtf.slice)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    xv = np.array([[-2.0, -0.5, 0.0, 1.5]], np.float32)
    x = mtf.import_tf_tensor(mesh, xv, "batch:1,d:4")
    # Mesh TF's Transformer names activations by their mtf function name
    gated = mtf.layers.dense_product(
        x, "d", mtf.Dimension("h", 3), ["squared_relu", "linear"], name="glu"
    )
    outs = [mtf.selu(x), mtf.squared_relu(x), gated]
    got = _run(graph, mesh, outs, "all:2", "d:all")
    np.testing.assert_allclose(got[0], tf.nn.selu(xv).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.maximum(xv, 0) ** 2)
    assert got[2].shape == (1, 3)
