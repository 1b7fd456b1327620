"""Bad input raises clear errors: an MtfError that is also the fitting builtin,
with a message naming the offending value and what was expected."""

from __future__ import annotations

import re

import numpy as np
import pytest

import mtf_core as mtf


def _mesh() -> tuple[mtf.Graph, mtf.Mesh]:
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "mesh")


def _raises(exc: type[Exception], *fragments: str) -> pytest.RaisesContext:
    """pytest.raises matching every fragment, literally, in order."""
    return pytest.raises(exc, match=".*".join(re.escape(f) for f in fragments))


# -- graph building (no TensorFlow) -----------------------------------------------


def test_einsum_output_dim_in_no_input() -> None:
    _, mesh = _mesh()
    x = mtf.zeros(mesh, "batch:8,hidden:4")
    with _raises(
        mtf.ShapeError, "output dimension out:3 is in no input", "'batch', 'hidden'"
    ):
        mtf.einsum([x], output_shape="batch:8,out:3")


def test_einsum_dim_sizes_must_agree() -> None:
    _, mesh = _mesh()
    x = mtf.zeros(mesh, "batch:8,hidden:4")
    w = mtf.zeros(mesh, "hidden:5,out:3")
    with _raises(mtf.ShapeError, "dimension 'hidden' has size 4", "and 5"):
        mtf.einsum([x, w], output_shape="batch:8,out:3")
    with _raises(mtf.ShapeError, "output dimension batch:2 has size 2", "batch:8"):
        mtf.einsum([x], output_shape="batch:2")


@pytest.mark.parametrize(
    "build",
    [
        lambda a, b: mtf.einsum([a, b], output_shape="batch:8"),
        lambda a, b: a + b,
        lambda a, b: mtf.maximum(a, b),
        lambda a, b: mtf.add_n([a, b]),
        lambda a, b: mtf.where(mtf.greater(a, 0.0), a, b),
    ],
    ids=["einsum", "add", "maximum", "add_n", "where"],
)
def test_mismatched_dtypes_are_rejected(build: object) -> None:
    _, mesh = _mesh()
    a = mtf.zeros(mesh, "batch:8", "float32")
    b = mtf.zeros(mesh, "batch:8", "int32")
    with pytest.raises(mtf.DTypeError) as info:
        build(a, b)  # type: ignore[operator]
    assert isinstance(info.value, TypeError)
    assert "float32" in str(info.value) and "int32" in str(info.value)


def test_where_needs_a_bool_condition() -> None:
    _, mesh = _mesh()
    a = mtf.zeros(mesh, "batch:8")
    with _raises(mtf.DTypeError, "condition", "float32; expected bool"):
        mtf.where(a, a, a)


def test_unknown_dtype_is_rejected() -> None:
    _, mesh = _mesh()
    with _raises(mtf.DTypeError, "'complex64' is not supported"):
        mtf.zeros(mesh, "batch:8", "complex64")


def test_broadcast_incompatible_sizes_are_rejected() -> None:
    _, mesh = _mesh()
    with _raises(mtf.ShapeError, "'batch' has size 8 in one input and 4"):
        mtf.zeros(mesh, "batch:8") + mtf.zeros(mesh, "batch:4")
    # The error names the tensors, as an einsum's does.
    x, y = mtf.zeros(mesh, "batch:8,h:2"), mtf.zeros(mesh, "batch:4")
    with _raises(mtf.ShapeError, f"add: {x.name} [batch:8,h:2] and {y.name} [batch:4]"):
        _ = x + y
    cond = mtf.cast(mtf.zeros(mesh, "batch:2"), "bool")
    with _raises(mtf.ShapeError, f"where: {x.name} [batch:8,h:2] and {cond.name}"):
        mtf.where(cond, x, x)


def test_reductions_and_broadcasts_name_the_missing_dim() -> None:
    _, mesh = _mesh()
    x = mtf.zeros(mesh, "batch:8,hidden:4")
    with _raises(mtf.ShapeError, "[batch:8,hidden:4] has no dimension 'out'"):
        mtf.reduce_sum(x, reduced_dim="out")
    with _raises(mtf.ShapeError, "dimension hidden:4 is missing from [batch:8]"):
        mtf.broadcast(x, "batch:8")
    with _raises(mtf.ShapeError, "must have exactly the dims of [batch:8,hidden:4]"):
        mtf.transpose(x, "hidden:4")


def test_assign_of_the_wrong_shape_is_rejected() -> None:
    _, mesh = _mesh()
    w = mtf.get_variable(mesh, "w", "hidden:4,out:2")
    with _raises(
        mtf.ShapeError, "has shape [out:2,hidden:4]", "w has shape [hidden:4,out:2]"
    ):
        mtf.assign(w, mtf.zeros(mesh, "out:2,hidden:4"))
    with _raises(mtf.GraphError, "is not an mtf variable"):
        mtf.assign(mtf.zeros(mesh, "hidden:4,out:2"), w)


def test_assign_with_an_unknown_mode_is_rejected_before_building_an_op() -> None:
    from mtf_core.ops.variables import Assign, as_variable

    graph, mesh = _mesh()
    w = mtf.get_variable(mesh, "w", "hidden:4")
    n_ops = len(graph.operations)
    with _raises(
        mtf.ArgumentError,
        "mode 'assign_mul' is unknown",
        "['assign', 'assign_add', 'assign_sub']",
    ):
        Assign(as_variable(w), mtf.zeros(mesh, "hidden:4"), "assign_mul")
    assert len(graph.operations) == n_ops + 1  # the zeros, no Assign


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (
            lambda x: _reduce_op(x, "PROD"),
            ("unknown reduction 'PROD'", "'LOGICAL_AND', 'LOGICAL_OR', 'MAX'"),
        ),
        (
            lambda x: _binary_op(x, "atan2"),
            ("unknown binary op 'atan2'", "'add', 'divide'"),
        ),
        (
            lambda x: _unary_op(x, "erf"),
            ("unknown unary op 'erf'", "'abs', 'ceil'"),
        ),
        (
            lambda x: mtf.dropout(x, keep_prob=0.5, rate=0.5),
            ("exactly one of keep_prob and rate", "keep_prob=0.5, rate=0.5"),
        ),
        (
            lambda x: mtf.random_normal(x.mesh, "a:2", stddev=-1.0),
            ("stddev -1.0 must be >= 0",),
        ),
    ],
    ids=["reduction", "binary", "unary", "dropout", "stddev"],
)
def test_op_arguments_outside_what_the_op_accepts_raise_argument_errors(
    build: object, fragments: tuple[str, ...]
) -> None:
    _, mesh = _mesh()
    x = mtf.zeros(mesh, "batch:8,hidden:4")
    with _raises(mtf.ArgumentError, *fragments) as info:
        build(x)  # type: ignore[operator]
    assert isinstance(info.value, ValueError)


def _reduce_op(x: mtf.Tensor, reduction: str) -> object:
    from mtf_core.ops.reduce import Reduce

    return Reduce(x, mtf.convert_to_shape("batch:8"), reduction)


def _binary_op(x: mtf.Tensor, fn: str) -> object:
    from mtf_core.ops.elementwise import BinaryOp

    return BinaryOp(fn, x, x)


def _unary_op(x: mtf.Tensor, fn: str) -> object:
    from mtf_core.ops.unary import UnaryOp

    return UnaryOp(fn, x)


def test_tensors_of_different_shapes_cannot_be_stacked() -> None:
    # (add_n broadcasts by dim names, as Mesh TF's does: tests/test_compat_slicewise)
    _, mesh = _mesh()
    a = mtf.zeros(mesh, "batch:8,hidden:4", name="a")
    b = mtf.zeros(mesh, "hidden:4,batch:8", name="b")
    for fn, what in ((lambda xs: mtf.stack(xs, "n"), "stack"),):
        with _raises(
            mtf.ShapeError,
            f"{what}: b:0 has shape [hidden:4,batch:8] but a:0 has [batch:8,hidden:4]",
            "must have one shape",
        ):
            fn([a, b])


def test_variable_initializer_must_be_callable() -> None:
    _, mesh = _mesh()
    with _raises(mtf.GraphError, "initializer 0.5 is not callable"):
        mtf.get_variable(mesh, "w", "hidden:4", initializer=0.5)


def test_imported_value_must_match_its_shape() -> None:
    _, mesh = _mesh()
    with _raises(
        mtf.GraphError, "value of shape [3, 4] does not match shape [a:4,b:3]"
    ):
        mtf.import_tf_tensor(mesh, np.zeros((3, 4)), "a:4,b:3")


def test_tensors_of_different_graphs_do_not_mix() -> None:
    _, m1 = _mesh()
    _, m2 = _mesh()
    with pytest.raises(mtf.GraphError, match="different meshes"):
        mtf.zeros(m1, "a:2") + mtf.zeros(m2, "a:2")


def test_fractional_scalar_with_an_integer_tensor_is_rejected() -> None:
    _, mesh = _mesh()
    n = mtf.zeros(mesh, "batch:8", "int32", name="counts")
    assert (n * 2.0).dtype == "int32"  # a whole number converts exactly
    with _raises(
        mtf.DTypeError, "scalar 0.5 cannot combine with counts:0 of dtype int32"
    ):
        n * 0.5


def test_two_python_scalars_are_not_an_mtf_op() -> None:
    with _raises(mtf.ShapeError, "add needs at least one mtf.Tensor, got 1 and 2"):
        mtf.add(1, 2)


# -- layouts and lowering ------------------------------------------------------------


@pytest.mark.tf
def test_indivisible_layout_names_tensor_dim_sizes_and_axis(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:6,hidden:8", name="images")
    y = x * 2.0
    impl = mtf.PlacementMeshImpl("data:4", "batch:data", devices[:4])
    with pytest.raises(mtf.IndivisibleDimensionError) as info:
        mtf.Lowering(graph, {mesh: impl}, feeds={x: np.zeros((6, 8))})
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        "tensor images:0: dimension 'batch' of size 6 is not divisible by mesh "
        "dimension 'data' of size 4"
    )
    del y


@pytest.mark.tf
def test_indivisible_layout_fails_the_same_way_when_compiling(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:6")
    impl = mtf.PlacementMeshImpl("data:4", "batch:data", devices[:4])
    fn = mtf.compile_function(graph, {mesh: impl}, inputs=[x], outputs=[x * 2.0])
    with _raises(
        mtf.IndivisibleDimensionError, "'batch' of size 6", "'data' of size 4"
    ):
        fn(np.zeros(6, np.float32))


@pytest.mark.tf
def test_two_dims_of_one_tensor_on_one_mesh_dim_fail_at_lowering(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    mtf.zeros(mesh, "batch:8,hidden:8")
    impl = mtf.PlacementMeshImpl("m:2", "batch:m;hidden:m", devices[:2])
    with _raises(mtf.LayoutError, "split both 'batch' and 'hidden'", "'m' of size 2"):
        mtf.Lowering(graph, {mesh: impl})


@pytest.mark.tf
def test_device_list_must_match_the_mesh(devices: list[str]) -> None:
    with pytest.raises(mtf.LoweringError) as info:
        mtf.PlacementMeshImpl("rows:2;cols:2", "batch:rows", devices[:3])
    assert isinstance(info.value, ValueError)
    assert "mesh [rows:2,cols:2] has 4 processors but 3 devices were given" in str(
        info.value
    )
    with _raises(mtf.LoweringError, "device 7 is not a device name"):
        mtf.PlacementMeshImpl("rows:2", "", ["/cpu:0", 7])


@pytest.mark.tf
def test_layout_rule_naming_a_missing_mesh_dim_is_rejected(
    devices: list[str],
) -> None:
    with _raises(
        mtf.LayoutError,
        "layout rule hidden:model names mesh dimension 'model'",
        "mesh [rows:2,cols:2] does not have",
    ):
        mtf.PlacementMeshImpl("rows:2;cols:2", "batch:rows;hidden:model", devices[:4])


@pytest.mark.tf
def test_unfed_placeholder_is_named(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8", name="tokens")
    with _raises(mtf.LoweringError, "placeholder tokens [batch:8] was not fed"):
        mtf.Lowering(graph, {mesh: mtf.PlacementMeshImpl("m:1", "", devices[:1])})
    del x


@pytest.mark.tf
def test_a_mesh_without_an_implementation_is_named(devices: list[str]) -> None:
    graph, mesh = _mesh()
    other = mtf.Mesh(graph, "other")
    mtf.zeros(other, "a:2")
    impl = mtf.PlacementMeshImpl("m:1", "", devices[:1])
    with _raises(
        mtf.LoweringError, "is on mesh 'other', which has no mesh implementation"
    ):
        mtf.Lowering(graph, {mesh: impl})


@pytest.mark.tf
def test_compiled_function_checks_its_inputs(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8")
    c = mtf.zeros(mesh, "batch:8")
    impl = mtf.PlacementMeshImpl("m:1", "", devices[:1])
    with _raises(mtf.LoweringError, "is not a placeholder"):
        mtf.compile_function(graph, {mesh: impl}, inputs=[c], outputs=[c])
    fn = mtf.compile_function(graph, {mesh: impl}, inputs=[x], outputs=[x + c])
    with _raises(mtf.LoweringError, "takes 1 inputs", "got 2"):
        fn(np.zeros(8), np.zeros(8))


@pytest.mark.tf
def test_compile_function_names_an_argument_of_the_wrong_kind(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8")
    y = x * 2.0
    impl = mtf.PlacementMeshImpl("m:1", "", devices[:1])
    other = mtf.Mesh(mtf.Graph(), "mesh")
    cases = [
        (dict(inputs=["junk"]), "inputs[0] is 'junk'; expected an mtf.Tensor"),
        (dict(inputs=[x, None]), "inputs[1] is None; expected an mtf.Tensor"),
        (dict(outputs=[y, 3]), "outputs[1] is 3; expected an mtf.Tensor"),
        (dict(updates=["u"]), "updates[0] is 'u'; expected an mtf.Operation"),
        (dict(outputs=y), "outputs Tensor[", "expected a list"),
        (dict(outputs=[mtf.zeros(other, "a:2")]), "outputs[0] is", "of this graph"),
    ]
    for kwargs, *fragments in cases:
        with _raises(mtf.GraphError, *fragments) as info:
            mtf.compile_function(graph, {mesh: impl}, **kwargs)
        assert isinstance(info.value, TypeError)
    with _raises(mtf.GraphError, "mesh_to_impl['mesh'] is 'impl'"):
        mtf.compile_function(graph, {mesh: "impl"}, outputs=[y])
    with _raises(mtf.GraphError, "mesh_to_impl key 'mesh' is not an mtf.Mesh"):
        mtf.compile_function(graph, {"mesh": impl}, outputs=[y])
    with _raises(mtf.GraphError, "mesh_to_impl {}: expected a dict"):
        mtf.compile_function(graph, {}, outputs=[y])
    with _raises(mtf.GraphError, "graph None is not an mtf.Graph"):
        mtf.compile_function(None, {mesh: impl}, outputs=[y])
    # What it was given before still compiles and runs.
    fn = mtf.compile_function(graph, {mesh: impl}, inputs=[x], outputs=[y])
    np.testing.assert_allclose(fn(np.ones(8, np.float32))[0], np.full(8, 2.0))


def test_a_mesh_needs_a_name() -> None:
    graph = mtf.Graph()
    for bad in (5, None, ""):
        with _raises(mtf.GraphError, f"mesh name {bad!r}: expected a non-empty"):
            mtf.Mesh(graph, bad)
    assert graph.meshes == []  # nothing half-made was kept
    assert mtf.Mesh(graph, "m").name == "m"


def test_every_error_class_is_an_mtf_error_and_a_builtin() -> None:
    for cls, builtin in [
        (mtf.ShapeError, ValueError),
        (mtf.LayoutError, ValueError),
        (mtf.IndivisibleDimensionError, ValueError),
        (mtf.DTypeError, TypeError),
        (mtf.GraphError, ValueError),
        (mtf.LoweringError, ValueError),
        (mtf.SerializationError, ValueError),
        (mtf.ArgumentError, ValueError),
        (mtf.ConfigError, ValueError),
    ]:
        assert issubclass(cls, mtf.MtfError) and issubclass(cls, builtin)
