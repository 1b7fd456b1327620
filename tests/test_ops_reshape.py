"""reshape / rename_dimension / replace_dimensions: values and gradients under
every layout, and the collectives each layout pair implies."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import LayoutCase, check_op, collective_specs, lower

import mtf_core as mtf
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.ops.reshape import Reshape, plan_reshape

pytestmark = pytest.mark.tf

CASES = {
    # name: (input shape, output shape)
    "split_hidden_into_heads": ("batch:8,hidden:8", "batch:8,heads:4,d:2"),
    "merge_batch_and_hidden": ("batch:4,hidden:8", "flat:32"),
    "merge_into_hidden": ("batch:8,a:2,b:4", "batch:8,hidden:8"),
    "same_names_other_positions": ("batch:8,hidden:8", "hidden:8,batch:8"),
    "regroup_everything": ("batch:4,hidden:8,c:2", "x:2,batch:4,hidden:8"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reshape_and_its_gradient_do_not_depend_on_layout(
    devices: list[str], case: str
) -> None:
    src, dst = CASES[case]
    sizes = mtf.convert_to_shape(dst).to_integer_list()
    check_op(
        devices, [src], lambda x: mtf.reshape(x, dst), lambda x: tf.reshape(x, sizes)
    )


def _reshape_under(
    devices: list[str], src: str, dst: str, mesh_shape: str, rules: str
) -> tuple[np.ndarray, list[tuple], list[tuple]]:
    """Lowers ``reshape(x, dst)``; returns its value, the recorded collectives and
    the op's predicted ones."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    shape = mtf.convert_to_shape(src)
    value = np.arange(shape.size, dtype=np.float32).reshape(shape.to_integer_list())
    x = mtf.import_tf_tensor(mesh, value, shape)
    y = mtf.reshape(x, dst)
    case = LayoutCase("custom", mesh_shape, rules)
    (got,), lowering = lower(graph, mesh, case, devices, [y])
    predicted = collective_specs(y.operation.communication(case.impl(devices).ctx))
    np.testing.assert_array_equal(
        got, value.reshape(mtf.convert_to_shape(dst).to_integer_list())
    )
    return got, collective_specs(lowering.counters.collectives), predicted


def test_reshape_merging_a_split_inner_dim_alltoalls_once(devices: list[str]) -> None:
    # [a:4, b:8] -> [c:32] with b and c on model: the axis moves from b to a
    # (a starts where c does), then the local reshape is exact.
    _, recorded, predicted = _reshape_under(
        devices, "a:4,b:8", "c:32", "model:4", "b:model;c:model"
    )
    # each device holds [4, 2] float32 = 32 bytes going into the alltoall
    assert recorded == predicted == [("alltoall", ("model",), 32)]


def test_reshape_merging_a_split_outer_dim_communicates_nothing(
    devices: list[str],
) -> None:
    _, recorded, predicted = _reshape_under(
        devices, "a:8,b:4", "c:32", "model:4", "a:model;c:model"
    )
    assert recorded == predicted == []


def test_reshape_into_a_replicated_output_allconcats(devices: list[str]) -> None:
    _, recorded, predicted = _reshape_under(
        devices, "a:4,b:8", "c:32", "model:4", "b:model"
    )
    assert recorded == predicted == [("allconcat", ("model",), 32)]


def test_reshape_splitting_a_split_dim_into_heads_communicates_nothing(
    devices: list[str],
) -> None:
    # d_model on model -> heads on model: heads is the outer part of d_model
    _, recorded, predicted = _reshape_under(
        devices,
        "batch:2,d_model:16",
        "batch:2,heads:4,d_head:4",
        "data:2;model:4",
        "batch:data;d_model:model;heads:model",
    )
    assert recorded == predicted == []


def test_rename_dimension_to_a_name_on_another_axis_regathers_and_resplits(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    value = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = mtf.import_tf_tensor(mesh, value, "batch:8,hidden:8")
    y = mtf.rename_dimension(x, "hidden", "other")
    assert str(y.shape) == "batch:8,other:8"
    case = LayoutCase("rename", "data:2;model:4", "hidden:model;other:data")
    (got,), lowering = lower(graph, mesh, case, devices, [y])
    np.testing.assert_array_equal(got, value)
    # gather hidden over model ([8, 2] float32 per device), then slice other
    assert collective_specs(lowering.counters.collectives) == [
        ("allconcat", ("model",), 64)
    ]
    assert collective_specs(y.operation.communication(case.impl(devices).ctx)) == [
        ("allconcat", ("model",), 64)
    ]


# Every layout of both sides on a 2x2 mesh: values exact, prediction == record.
EXHAUSTIVE = [
    ("a:4,b:6", "c:24"),
    ("a:4,b:6", "c:8,d:3"),
    ("a:2,b:4,c:6", "d:8,c:6"),
    ("a:4,b:6", "b:6,a:4"),
]


@pytest.mark.parametrize("src,dst", EXHAUSTIVE)
def test_reshape_is_exact_and_predicted_under_every_layout_pair(
    devices: list[str], src: str, dst: str
) -> None:
    names = sorted(
        set(mtf.convert_to_shape(src).dimension_names)
        | set(mtf.convert_to_shape(dst).dimension_names)
    )
    tried = 0
    for axes in itertools.product(["r", "c", None], repeat=len(names)):
        rules = ";".join(f"{n}:{a}" for n, a in zip(names, axes) if a)
        try:
            LayoutContext.make("r:2;c:2", rules).tensor_layout(src)
            LayoutContext.make("r:2;c:2", rules).tensor_layout(dst)
        except mtf.LayoutError:
            continue
        _, recorded, predicted = _reshape_under(devices, src, dst, "r:2;c:2", rules)
        assert recorded == predicted, rules
        tried += 1
    assert tried >= 7


def test_reshape_plan_needs_no_tensorflow_and_keeps_compatible_splits() -> None:
    ctx = LayoutContext.make("model:4", "b:model;c:model")
    plan = plan_reshape(
        ctx, mtf.convert_to_shape("a:4,b:8"), mtf.convert_to_shape("c:32")
    )
    assert plan.in_work.tensor_axis_to_mesh_axis == (0, None)
    assert plan.out_work.tensor_axis_to_mesh_axis == (0,)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    y = mtf.reshape(mtf.zeros(mesh, "a:4,b:8"), "c:32")
    assert y.operation.communication(ctx) == [
        CollectiveSpec("alltoall", ("model",), 32)
    ]
    assert y.operation.flops() == 0
    assert y.operation.unsplittable_dims() == frozenset()
    assert y.operation.attrs() == {"new_shape": "c:32"}


def test_replace_dimensions_on_shapes_and_tensors() -> None:
    shape = mtf.convert_to_shape("batch:2,d:12,e:3")
    new = mtf.replace_dimensions(shape, mtf.Dimension("d", 12), ["h:4", "k:3"])
    assert str(new) == "batch:2,h:4,k:3,e:3"
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, shape)
    y = mtf.replace_dimensions(x, ["d:12", "e:3"], mtf.Dimension("f", 36))
    assert str(y.shape) == "batch:2,f:36"
    assert isinstance(y.operation, Reshape)
    assert mtf.reshape(x, "batch:2,d:12,e:3") is x


def test_reshape_rejects_bad_input() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "batch:4,hidden:6")
    with pytest.raises(mtf.ShapeError, match="24 elements.*has 25"):
        mtf.reshape(x, "batch:5,hidden:5")
    with pytest.raises(ValueError, match="no dimension 'nope'"):
        mtf.rename_dimension(x, "nope", "other")
    with pytest.raises(mtf.ShapeError, match="already has a dimension 'batch'"):
        mtf.rename_dimension(x, "hidden", "batch")
    with pytest.raises(mtf.ShapeError, match="not a run of consecutive"):
        mtf.replace_dimensions(x.shape, ["hidden:6", "batch:4"], ["f:24"])
    with pytest.raises(mtf.ShapeError, match="not a run of consecutive"):
        mtf.replace_dimensions(x, ["hidden:5"], ["f:5"])
