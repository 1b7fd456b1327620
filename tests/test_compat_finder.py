"""``import mtf_core.compat``: ``mesh_tensorflow`` names resolve to mtf_core."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

import mtf_core


@pytest.fixture()
def compat():
    import mtf_core.compat as compat

    compat.install()
    yield compat
    compat.uninstall()


def test_mesh_tensorflow_names_are_mtf_cores(compat):
    import mesh_tensorflow as mtf

    assert mtf.Shape is mtf_core.Shape
    assert mtf.einsum is mtf_core.einsum
    # Layers are mtf_core's; the dense family is wrapped to name its weights
    # as Mesh TF does (tests/test_compat_layer_names.py).
    assert mtf.layers.layer_norm is mtf_core.layers.layer_norm
    assert mtf.layers.dense.__wrapped__ is mtf_core.layers.dense
    assert mtf.ops is mtf_core
    import mesh_tensorflow.ops_with_redefined_builtins as owrb

    assert owrb is mtf_core


def test_submodule_alias_is_the_module_itself_with_its_own_spec(compat):
    import mesh_tensorflow.layers as layers
    import mesh_tensorflow.utils as utils

    import mtf_core.compat.layers

    assert utils is mtf_core.utils
    # The alias leaves the module's own spec, so it still reloads as itself.
    assert utils.__spec__.name == "mtf_core.utils"
    assert sys.modules["mesh_tensorflow.utils"] is mtf_core.utils
    assert layers is sys.modules["mesh_tensorflow.layers"] is mtf_core.compat.layers
    # Mesh TF's optimizers (its constructors) are a thin layer over mtf_core's.
    import mesh_tensorflow.optimize as opt

    assert issubclass(opt.AdafactorOptimizer, mtf_core.optimize.AdafactorOptimizer)


def test_lowering_modules_alias_the_tf_side(compat):
    from mesh_tensorflow import placement_mesh_impl, test_utils

    from mtf_core.lowering import numpy_converter, placement

    assert placement_mesh_impl is placement
    assert test_utils is numpy_converter
    assert placement_mesh_impl.PlacementMeshImpl is mtf_core.PlacementMeshImpl


def test_unknown_mesh_tf_submodule_is_a_clear_module_not_found(compat):
    with pytest.raises(ModuleNotFoundError, match="tpu_variables.*no counterpart"):
        importlib.import_module("mesh_tensorflow.tpu_variables")


def test_missing_attribute_names_mesh_tensorflow(compat):
    import mesh_tensorflow as mtf

    with pytest.raises(AttributeError, match="no attribute 'no_such_op'"):
        mtf.no_such_op  # noqa: B018


def test_mesh_tf_package_loads_from_path_and_runs_on_mtf_core(compat, tmp_path):
    pkg = tmp_path / "mesh_tensorflow" / "transformer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "toy.py").write_text(
        textwrap.dedent(
            """
            import mesh_tensorflow as mtf

            def shape():
                return mtf.Shape([mtf.Dimension("a", 2)]).dims + [
                    mtf.Dimension("b", 3)]
            """
        )
    )
    compat.add_mesh_tf_path(tmp_path / "mesh_tensorflow")
    from mesh_tensorflow.transformer import toy

    assert toy.__file__.startswith(str(tmp_path))
    dims = toy.shape()
    assert [str(d) for d in dims] == ["a:2", "b:3"]
    assert isinstance(dims[0], mtf_core.Dimension)


def test_add_mesh_tf_path_rejects_a_missing_directory(compat, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        compat.add_mesh_tf_path(tmp_path / "nope")


def test_auto_mtf_mesh_shape_iterator_matches_mesh_tf_contract(compat):
    from mesh_tensorflow.auto_mtf import api

    shapes = list(api._mesh_shape_iterator(512))
    assert len(shapes) == 30 and [2] * 9 in shapes and [16, 8, 4] in shapes
    assert all(sorted(s, reverse=True) == s for s in shapes)
    assert sorted(api._mesh_shape_iterator(512, 2)) == sorted(
        [[512], [256, 2], [128, 4], [64, 8], [32, 16]]
    )
    assert list(api._mesh_shape_iterator(1)) == [[1]]
    # The public functions are the planner's.
    assert api.layout is importlib.import_module("layout_planner.auto_mtf").layout


def test_variable_names_take_the_tf_variable_scope_under_compat(compat):
    import mesh_tensorflow as mtf
    import tensorflow as tf

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    with tf.compat.v1.variable_scope("encoder"):
        with tf.compat.v1.variable_scope("layer_000"):
            w = mtf.get_variable(mesh, "q", "a:2")
    assert w.operation.name == "encoder/layer_000/q"
    compat.uninstall()
    with tf.compat.v1.variable_scope("encoder"):
        v = mtf_core.get_variable(mesh, "k", "a:2")
    assert v.operation.name == "k"  # mtf_core's own programs: names as given


def test_hierarchical_tiling_keeps_the_innermost_level_physically_adjacent(compat):
    from mesh_tensorflow import simd_mesh_impl

    t = simd_mesh_impl.HierarchicalTiling([("dp", None), ("mp", [1, 1, 2])], [4, 2, 2])
    assert str(t.mesh_shape) == "dp:8,mp:2"
    l2p = t.logical_to_physical
    assert sorted(l2p) == list(range(16))
    # mp pairs (pnums 2i, 2i+1) differ only in the last physical axis.
    assert all(l2p[2 * i + 1] - l2p[2 * i] == 1 for i in range(8))
    # A 2x2 model tile on the first two axes: its four cores form a square.
    t = simd_mesh_impl.HierarchicalTiling([("dp", None), ("mp", [2, 2, 1])], [4, 4, 1])
    square = sorted(t.logical_to_physical[:4])
    assert square == [0, 1, 4, 5]
    assert simd_mesh_impl.HierarchicalTiling.spec_to_mesh_shape(
        [("dp", None), ("mp", [2, 8, 1])], 128
    ) == mtf_core.Shape("dp:8,mp:16")
    with pytest.raises(ValueError, match="does not divide the physical size 3"):
        simd_mesh_impl.HierarchicalTiling([("mp", [2, 1, 1])], [3, 1, 1])
