"""Mesh TF's op-construction API under ``mesh_tensorflow``: ``mtf.Operation``'s
splittability helpers, ``PoolOperation`` (+ its gradient) and
``ImportLaidOutTensorOperation``, lowered for real."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import mtf_core
from mtf_core.compat.operation import (
    ImportLaidOutTensorOperation,
    Operation,
    import_laid_out_tensor,
)
from mtf_core.compat.pool import PoolOperation
from mtf_core.errors import ArgumentError, LoweringError, ShapeError

pytestmark = pytest.mark.tf

LAYOUTS = [("all:1", ""), ("all:4", "batch:all"), ("r:2;c:2", "batch:r;in:c")]


@pytest.fixture(autouse=True)
def _devices(devices: list[str]) -> None:
    """The process's logical CPUs are configured before any TF work."""


def _mesh() -> tuple[mtf_core.Graph, mtf_core.Mesh]:
    graph = mtf_core.Graph()
    return graph, mtf_core.Mesh(graph, "m")


def _lower(graph: Any, mesh: Any, layout: tuple[str, str]) -> Any:
    shape, rules = layout
    n = mtf_core.convert_to_shape(shape).size
    impl = mtf_core.PlacementMeshImpl(shape, rules, mtf_core.logical_devices(8)[:n])
    return mtf_core.Lowering(graph, {mesh: impl})


# -- mtf.Operation ---------------------------------------------------------------
def test_operation_splittability_helpers() -> None:
    _, mesh = _mesh()
    x = mtf_core.zeros(mesh, "a:5,b:10")
    op = Operation([x], name="operation")
    assert op._initialize_all_dimensions_as_splittable() == (
        frozenset({"a", "b"}),
        frozenset(),
    )
    assert op._initialize_splittable_and_unsplittable_dims("unsplittable") == (
        frozenset(),
        frozenset({"a", "b"}),
    )
    assert op._initialize_splittable_and_unsplittable_dims("unsplittable", ["b"]) == (
        frozenset({"b"}),
        frozenset({"a"}),
    )
    with pytest.raises(ArgumentError, match="'invalid'; expected 'splittable'"):
        op._initialize_splittable_and_unsplittable_dims("invalid")


def test_every_mtf_core_op_is_an_mtf_operation() -> None:
    _, mesh = _mesh()
    x = mtf_core.zeros(mesh, "a:5,b:10")
    y = mtf_core.reduce_sum(x, reduced_dim=mtf_core.Dimension("b", 10))
    assert isinstance(y.operation, Operation)
    assert issubclass(PoolOperation, Operation)
    assert issubclass(mtf_core.Einsum, Operation)
    assert not isinstance(x, Operation)
    assert not issubclass(int, Operation)


class _RowSoftmax(Operation):
    """A Mesh TF-style op: states its splittability with the helpers and
    lowers slice by slice (softmax over "b" needs "b" whole)."""

    def __init__(self, x: mtf_core.Tensor) -> None:
        super().__init__([x], name="row_softmax")
        self._add_output(x.shape, x.dtype)
        self._splittable_dims, self._unsplittable_dims = (
            self._initialize_splittable_and_unsplittable_dims("splittable", ["b"])
        )

    def lower(self, lowering: Any) -> None:
        x = lowering.tensors[self.inputs[0]]
        y = lowering.mesh_impl(self).slicewise(tf.nn.softmax, x)
        lowering.set_tensor_lowering(self.outputs[0], y)


def test_a_mesh_tf_style_subclass_declares_and_lowers() -> None:
    graph, mesh = _mesh()
    x_np = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    x = mtf_core.import_tf_tensor(mesh, tf.constant(x_np), "a:8,b:4")
    op = _RowSoftmax(x)
    assert op.splittable_dims == frozenset({"a"})
    assert op.unsplittable_dims == frozenset({"b"})
    assert op._unsplittable == frozenset({"b"})  # what the planner reads
    lowering = _lower(graph, mesh, ("all:4", "a:all"))
    got = lowering.export_to_tf_tensor(op.outputs[0]).numpy()
    e = np.exp(x_np)
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-6)


# -- PoolOperation ------------------------------------------------------------------
def _np_pool(x: np.ndarray, k: tuple[int, ...], kind: str) -> np.ndarray:
    """Non-overlapping pooling of the dims between the first and the last."""
    shape = [x.shape[0]]
    for size, w in zip(x.shape[1:-1], k):
        shape += [size // w, w]
    blocks = x.reshape(*shape, x.shape[-1])
    axes = tuple(2 + 2 * i for i in range(len(k)))
    return blocks.max(axis=axes) if kind == "MAX" else blocks.mean(axis=axes)


def _image() -> np.ndarray:
    # distinct values, so each max window has one maximum
    rng = np.random.RandomState(0)
    return rng.permutation(4 * 6 * 4 * 2).astype(np.float32).reshape(4, 6, 4, 2)


def test_pool_operation_shape_and_splittability() -> None:
    _, mesh = _mesh()
    image = mtf_core.zeros(mesh, "batch:100,grid_h:10,grid_w:10,in:10")
    op = PoolOperation(image, [2, 2], [2, 2], "AVG_2D")
    assert op.splittable_dims == frozenset({"batch", "in"})
    assert op.unsplittable_dims == frozenset({"grid_h", "grid_w"})
    assert str(op.outputs[0].shape) == "batch:100,grid_h:5,grid_w:5,in:10"
    overlapping = PoolOperation(image, [3, 3], [2, 2], "MAX_2D")
    assert overlapping.outputs[0].shape.to_integer_list() == [100, 4, 4, 10]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["MAX", "AVG"])
def test_pool_operation_values_and_gradient(layout: tuple[str, str], kind: str) -> None:
    graph, mesh = _mesh()
    x_np = _image()
    x = mtf_core.import_tf_tensor(
        mesh, tf.constant(x_np), "batch:4,grid_h:6,grid_w:4,in:2"
    )
    y = PoolOperation(x, [3, 2], [3, 2], f"{kind}_2D").outputs[0]
    weights = np.arange(1, 2 * 2 * 4 * 2 + 1, dtype=np.float32).reshape(4, 2, 2, 2)
    w = mtf_core.import_tf_tensor(mesh, tf.constant(weights), y.shape)
    (dx,) = mtf_core.gradients([mtf_core.reduce_sum(y * w)], [x])
    lowering = _lower(graph, mesh, layout)
    want = _np_pool(x_np, (3, 2), kind)
    np.testing.assert_allclose(lowering.export_to_tf_tensor(y).numpy(), want)
    # d(sum(y * w))/dx: each window's weight, spread evenly (AVG) or on its max
    spread = np.repeat(np.repeat(weights, 3, axis=1), 2, axis=2)
    if kind == "AVG":
        want_dx = spread / 6
    else:
        up = np.repeat(np.repeat(want, 3, axis=1), 2, axis=2)
        want_dx = spread * (x_np == up)
    # rtol: TF's average-pool gradient rounds the division by the window
    # differently with oneDNN on and off (one float32 ulp on AMD EPYC hosts).
    np.testing.assert_allclose(
        lowering.export_to_tf_tensor(dx).numpy(), want_dx, rtol=1e-6
    )
    # the pool and its gradient never communicate (the loss's sum does)
    ops = {c.op_type for c in lowering.counters.collectives}
    assert not ops & {"Pool", "PoolBackProp"}


def test_pool_3d_matches_mtf_cores_own_pooling() -> None:
    graph, mesh = _mesh()
    rng = np.random.RandomState(1)
    x_np = rng.randn(2, 4, 4, 6, 3).astype(np.float32)
    x = mtf_core.import_tf_tensor(mesh, tf.constant(x_np), "batch:2,d:4,h:4,w:6,c:3")
    pooled = PoolOperation(x, [2, 2, 3], [2, 2, 3], "AVG_3D").outputs[0]
    ours = mtf_core.layers.avg_pool3d(x, [2, 2, 3])
    lowering = _lower(graph, mesh, ("all:2", "batch:all"))
    got = lowering.export_to_tf_tensor(pooled).numpy()
    np.testing.assert_allclose(got, _np_pool(x_np, (2, 2, 3), "AVG"), rtol=1e-6)
    np.testing.assert_allclose(
        got, lowering.export_to_tf_tensor(ours).numpy(), rtol=1e-5
    )


def test_pool_operation_rejects_bad_arguments() -> None:
    _, mesh = _mesh()
    image = mtf_core.zeros(mesh, "batch:2,h:4,w:4,c:3")
    with pytest.raises(ArgumentError, match="'SUM_2D'; expected one of"):
        PoolOperation(image, [2, 2], [2, 2], "SUM_2D")
    with pytest.raises(ArgumentError, match=r"ksize \[2, 2\] .* MAX_3D expects 3"):
        PoolOperation(image, [2, 2], [2, 2], "MAX_3D")
    with pytest.raises(ShapeError, match="window 5 is larger than h:4"):
        PoolOperation(image, [5, 2], [5, 2], "MAX_2D")


# -- ImportLaidOutTensorOperation -----------------------------------------------------
class _MeshTfLaidOut:
    """Mesh TF's LaidOutTensor: one tf.Tensor per processor."""

    def __init__(self, tensor_list: list[Any]) -> None:
        self.tensor_list = tensor_list


def test_import_laid_out_tensor_uses_the_given_slices() -> None:
    graph, mesh = _mesh()
    full = np.arange(32, dtype=np.float32).reshape(8, 4)
    # layout a:all on 4 devices: device p holds rows 2p, 2p+1
    slices = [tf.constant(full[2 * p : 2 * p + 2]) for p in range(4)]
    x = import_laid_out_tensor(mesh, _MeshTfLaidOut(slices), "a:8,b:4")
    op = x.operation
    assert isinstance(op, ImportLaidOutTensorOperation)
    assert op.splittable_dims == frozenset()
    assert op.unsplittable_dims == frozenset({"a", "b"})
    assert x.dtype == "float32"
    y = x * 2.0
    lowering = _lower(graph, mesh, ("all:4", "a:all"))
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(), full * 2)


def test_import_and_pool_on_the_spmd_backend() -> None:
    graph, mesh = _mesh()
    full = np.arange(32, dtype=np.float32).reshape(8, 4)
    slices = [tf.constant(full[2 * p : 2 * p + 2]) for p in range(4)]
    x2 = import_laid_out_tensor(mesh, slices, "a:8,b:4") * 2.0
    img_np = _image()
    img = mtf_core.import_tf_tensor(mesh, tf.constant(img_np), "a:4,h:6,w:4,c:2")
    pooled = PoolOperation(img, [3, 2], [3, 2], "MAX_2D").outputs[0]
    impl = mtf_core.SimdMeshImpl("all:4", "a:all", mtf_core.logical_devices(4))
    lowering = mtf_core.Lowering(graph, {mesh: impl})
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(x2).numpy(), full * 2)
    got = lowering.export_to_tf_tensor(pooled).numpy()
    np.testing.assert_array_equal(got, _np_pool(img_np, (3, 2), "MAX"))


def test_import_laid_out_tensor_checks_slices_against_the_layout() -> None:
    graph, mesh = _mesh()
    slices = [tf.zeros([2, 4]) for _ in range(4)]
    x = import_laid_out_tensor(mesh, _MeshTfLaidOut(slices), "a:8,b:4")
    with pytest.raises(LoweringError, match=r"slice has shape \[2, 4\].* of \[8, 4\]"):
        _lower(graph, mesh, ("all:4", "")).export_to_tf_tensor(x)
    graph, mesh = _mesh()
    x = import_laid_out_tensor(mesh, slices[:3], "a:8,b:4")
    with pytest.raises(ArgumentError, match="3 slices for a mesh of 4 processors"):
        _lower(graph, mesh, ("all:4", "a:all")).export_to_tf_tensor(x)


def test_mesh_tensorflow_names(compat_installed: None) -> None:
    import mesh_tensorflow as mtf

    assert mtf.Operation is Operation
    assert mtf.PoolOperation is PoolOperation
    assert mtf.ImportLaidOutTensorOperation is ImportLaidOutTensorOperation
    assert mtf.import_laid_out_tensor is import_laid_out_tensor


@pytest.fixture()
def compat_installed() -> Any:
    import mtf_core.compat as compat

    compat.install()
    yield
    compat.uninstall()


def test_max_pool_gradient_goes_to_one_tied_maximum() -> None:
    graph, mesh = _mesh()
    x = mtf_core.ones(mesh, "batch:2,h:4,w:4,c:1")  # every window ties
    y = PoolOperation(x, [2, 2], [2, 2], "MAX_2D").outputs[0]
    (dx,) = mtf_core.gradients([mtf_core.reduce_sum(y)], [x])
    got = _lower(graph, mesh, ("all:2", "batch:all")).export_to_tf_tensor(dx).numpy()
    # one 1 per window (TF's MaxPoolGrad); Mesh TF's rule would give all 32
    assert got.sum() == 2 * 2 * 2
    assert sorted(np.unique(got)) == [0.0, 1.0]


def test_pooling_and_its_gradient_round_trip_through_the_graph_format() -> None:
    from mtf_core.serialization import graph_from_dict, graph_to_dict

    graph = mtf_core.Graph()
    mesh = mtf_core.Mesh(graph, "m")
    x = mtf_core.zeros(mesh, "batch:2,h:6,w:4,c:3")
    y = PoolOperation(x, [3, 2], [3, 2], "MAX_2D").outputs[0]
    (dx,) = mtf_core.gradients([mtf_core.reduce_sum(y)], [x])
    doc = graph_to_dict(graph, outputs=[dx])
    again = graph_from_dict(doc).graph
    kinds = [(op.op_type, op.attrs()) for op in again.operations]
    assert (
        "Pool",
        {"ksize": [3, 2], "strides": [3, 2], "pool_fn_string": "MAX_2D"},
    ) in kinds
    assert [k for k, _ in kinds].count("PoolBackProp") == 1
    assert graph_to_dict(again, outputs=[again.operations[-1].outputs[0]]) == doc


def test_an_imported_laid_out_tensor_is_refused_by_name_in_a_document() -> None:
    from mtf_core.errors import SerializationError
    from mtf_core.serialization import graph_from_dict, graph_to_dict

    graph = mtf_core.Graph()
    mesh = mtf_core.Mesh(graph, "m")
    slices = [tf.zeros([1, 4]) for _ in range(8)]
    x = import_laid_out_tensor(mesh, _MeshTfLaidOut(slices), "a:8,b:4", name="fed")
    doc = graph_to_dict(graph, outputs=[x])
    with pytest.raises(SerializationError, match="ImportLaidOutTensor 'fed' cannot"):
        graph_from_dict(doc)
