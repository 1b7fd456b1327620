"""The mtf language and its lowering, probed as a careless user porting a Mesh
TF program would: bad input gets an error naming the value and what was
expected, not a traceback from deep inside (AttributeError, OverflowError, a
TensorFlow error) nor a silently wrong result (a bool taken as a size, a value
of another shape sliced as if it fit, 2**40 wrapped round in an int32)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core.errors import (
    ArgumentError,
    DTypeError,
    GraphError,
    GraphTypeError,
    LayoutError,
    LoweringError,
    SerializationError,
    ShapeError,
    ShapeTypeError,
)
from mtf_core.train.checkpoint import load_checkpoint, save_checkpoint

A, B, C = mtf.Dimension("a", 4), mtf.Dimension("b", 6), mtf.Dimension("c", 8)
#: Wrong arguments, typed Any: the calls below are the careless ones.
NONE: Any = None
THREE: Any = 3
MESH_NAME: Any = "m"


def _mesh() -> mtf.Mesh:
    return mtf.Mesh(mtf.Graph(), "m")


# -- dimensions, shapes, layout rules (no TensorFlow) ---------------------------------
@pytest.mark.parametrize(
    "size, shown",
    [(np.bool_(True), "np.True_"), (np.array(True), "array"), (float("inf"), "inf")],
)
def test_dimension_refuses_a_numpy_bool_or_infinite_size(
    size: object, shown: str
) -> None:
    with pytest.raises(
        ShapeError, match=rf"dimension 'a' has size {shown}.*expected an integer"
    ):
        mtf.Dimension("a", size)  # type: ignore[arg-type]


def test_shape_minus_none_is_the_shape_as_in_mesh_tf() -> None:
    s = mtf.Shape("a:2,b:3")
    assert s - None == s


@pytest.mark.parametrize(
    "other, message",
    [
        (mtf.Dimension("z", 3), "has no dimension named 'z'"),
        (mtf.Dimension("a", 5), "has a:2, not a:5, to subtract"),
        (5, "cannot subtract 5 from shape"),
    ],
)
def test_shape_minus_a_dimension_it_lacks_is_an_error(
    other: object, message: str
) -> None:
    with pytest.raises(ShapeError, match=message):
        mtf.Shape("a:2,b:3") - other


def test_shape_minus_a_name_removes_that_dimension_not_its_letters() -> None:
    s = mtf.Shape("ab:2,a:3,b:4")
    assert s - "ab" == mtf.Shape("a:3,b:4")
    assert s - ["a", "b"] == mtf.Shape("ab:2")


def test_shape_index_of_a_non_dimension_names_it() -> None:
    with pytest.raises(ShapeTypeError, match="cannot convert 5 to a Dimension"):
        mtf.Shape("a:2").index(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rules, message",
    [
        ("batch:rows:cols", "layout rule 'batch:rows:cols' is malformed"),
        (
            [("batch", 5)],
            r"layout rule \('batch', 5\) names 5, which is not a dimension",
        ),
        ({"batch": "ro ws"}, "names 'ro ws', which is not a dimension name"),
    ],
)
def test_layout_rules_refuse_names_no_dimension_can_have(
    rules: object, message: str
) -> None:
    with pytest.raises(LayoutError, match=message):
        mtf.convert_to_layout_rules(rules)


# -- building graphs --------------------------------------------------------------
@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: mtf.reduce_sum(NONE), "reduce: None is not an mtf.Tensor"),
        (
            lambda x: mtf.reduce_mean(cast(Any, [x])),
            r"reduce: \[Tensor.*\] is not an mtf.Tensor",
        ),
        (lambda x: mtf.einsum([x, THREE], [A]), "einsum: input 3 is not an mtf.Tensor"),
        (lambda x: mtf.einsum(NONE, [A]), "einsum: xs is None"),
        (lambda x: mtf.matmul(x, NONE), "einsum: input None is not"),
        (lambda x: mtf.slice(NONE, 0, 1, "a"), "slice: None is not an mtf.Tensor"),
        (lambda x: mtf.concat([NONE, x], "a"), "input None is not an mtf.Tensor"),
        (lambda x: mtf.cast(THREE, "float32"), "cast: 3 is not an mtf.Tensor"),
        (lambda x: mtf.one_hot(NONE, C), "one_hot: indices None is not"),
        (
            lambda x: mtf.transpose(cast(Any, np.zeros(3)), [A]),
            r"transpose: array\(\[0",
        ),
        (
            lambda x: mtf.rename_dimension(NONE, "a", "z"),
            "rename_dimension: None is not",
        ),
        (lambda x: mtf.dropout(NONE, keep_prob=0.5), "dropout: None is not"),
        (lambda x: mtf.zeros_like(NONE), "zeros_like: None is not"),
        (lambda x: mtf.add_n(NONE), "add_n: xs is None"),
    ],
)
def test_an_op_given_a_non_tensor_names_it(
    call: Callable[[mtf.Tensor], object], message: str
) -> None:
    x = mtf.zeros(_mesh(), [A, B])
    with pytest.raises(GraphTypeError, match=message):
        call(x)


@pytest.mark.parametrize(
    "make",
    [
        lambda: mtf.zeros(MESH_NAME, [A]),
        lambda: mtf.placeholder(MESH_NAME, [A]),
        lambda: mtf.get_variable(MESH_NAME, "w", [A]),
    ],
)
def test_a_mesh_that_is_a_string_is_named(make: Callable[[], object]) -> None:
    with pytest.raises(GraphTypeError, match="mesh 'm' is not an mtf.Mesh"):
        make()


def test_an_op_name_that_is_not_a_string_is_named() -> None:
    with pytest.raises(GraphError, match="name 5 is not a string"):
        mtf.range(_mesh(), A, mtf.int32, name=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [None, ""])
def test_get_variable_needs_a_name(name: object) -> None:
    # None made a variable called 'variable', and a second None the same one.
    with pytest.raises(
        GraphError, match=f"get_variable: name {name!r} is not a non-empty"
    ):
        mtf.get_variable(_mesh(), name, [A])  # type: ignore[arg-type]


def test_reduce_over_a_dimension_of_another_size_is_an_error() -> None:
    # reduce_sum(x [a:4,b:6], reduced_dim=a:5) summed over a:4.
    x = mtf.zeros(_mesh(), [A, B])
    with pytest.raises(ShapeError, match=r"reduce: dimension a:5 does not match a:4"):
        mtf.reduce_sum(x, reduced_dim=mtf.Dimension("a", 5))


@pytest.mark.parametrize("value", ["x", None, "1"])
def test_one_hot_values_must_be_numbers(value: object) -> None:
    i = mtf.zeros(_mesh(), [A], dtype=mtf.int32)
    with pytest.raises(
        ArgumentError, match=f"one_hot: on_value is {value!r}; expected a number"
    ):
        mtf.one_hot(i, C, on_value=value)  # type: ignore[arg-type]


def test_dropout_names_the_rate_it_was_given() -> None:
    x = mtf.zeros(_mesh(), [A])
    with pytest.raises(ArgumentError, match=r"dropout: rate 1.0 must be in \[0, 1\)"):
        mtf.dropout(x, rate=1.0)


@pytest.mark.parametrize(
    "value, dtype, message",
    [
        ("hello", "float32", "value 'hello' is not a number"),
        (None, "float32", "value None is not a number"),
        (2**40, "int32", r"value 1099511627776 does not fit int32"),
        (2**70, "int64", rf"value {2**70} does not fit int64"),
        (-1, "uint8", r"value -1 does not fit uint8"),
        (0.5, "int32", "value 0.5 has a fraction"),
        ([0.5, 1.0, 2.0, 3.0], "int32", r"value \[0.5, 1.0, 2.0, 3.0\] has a fraction"),
    ],
)
def test_a_constant_must_hold_numbers_its_dtype_can(
    value: object, dtype: str, message: str
) -> None:
    # TF wrapped 2**40 round to 0 and truncated [0.5, ...] to [0, ...];
    # a string or None failed only when lowered.
    with pytest.raises(DTypeError, match=message):
        mtf.constant(_mesh(), value, [A], dtype=dtype)


@pytest.mark.parametrize("other", ["s", None, object()])
def test_arithmetic_with_a_non_number_is_an_error(other: object) -> None:
    x = mtf.zeros(_mesh(), [A])
    with pytest.raises(DTypeError, match="is not a number"):
        x + other


def test_integer_divide_is_refused_not_a_float64_called_int32() -> None:
    i = mtf.zeros(_mesh(), [A], dtype=mtf.int32)
    with pytest.raises(
        DTypeError, match="divide: .* have dtype int32; expected a floating"
    ):
        i / 2


def test_gradients_name_a_missing_or_foreign_argument() -> None:
    m = _mesh()
    w = mtf.get_variable(m, "w", [A])
    loss = mtf.reduce_sum(w)
    with pytest.raises(GraphError, match="gradients: xs is None; expected a list"):
        mtf.gradients([loss], None)  # type: ignore[arg-type]
    other = mtf.zeros(_mesh(), [A])
    with pytest.raises(
        GraphError, match=r"gradients: zeros:0 belongs to another graph"
    ):
        mtf.gradients([loss], [other])


# -- lowering (8 logical CPUs) -----------------------------------------------------
def _impl(devices: list[str], layout: str = "a:x") -> mtf.PlacementMeshImpl:
    return mtf.PlacementMeshImpl("x:2", layout, devices[:2])


@pytest.mark.parametrize(
    "fed",
    [np.ones((3, 6)), np.ones((6, 4)), np.ones(24), 1.0],
    ids=["short", "transposed", "flat", "scalar"],
)
@pytest.mark.parametrize("layout", ["", "a:x"])
def test_a_fed_value_of_another_shape_is_refused(
    devices: list[str], fed: object, layout: str
) -> None:
    # Replicated, a (3, 6) value made a [a:4, b:6] tensor of 3 rows.
    m = _mesh()
    ph = mtf.placeholder(m, [A, B])
    y = mtf.reduce_sum(ph, reduced_dim=B)
    with pytest.raises(
        ShapeError,
        match=r"fed for placeholder placeholder:0 has shape \[.*\]; expected \[a:4,b:6\]",
    ):
        mtf.Lowering(
            m.graph, {m: _impl(devices, layout)}, feeds={ph: fed}
        ).export_to_tf_tensor(y)


def test_feeds_name_a_tensor_that_is_not_a_placeholder(devices: list[str]) -> None:
    m = _mesh()
    x = mtf.zeros(m, [A])
    with pytest.raises(
        LoweringError, match=r"feeds key Tensor\[zeros:0.* is not a placeholder"
    ):
        mtf.Lowering(m.graph, {m: _impl(devices)}, feeds={x: np.ones(4)})


@pytest.mark.parametrize("layout", ["", "a:x"])
def test_an_initializer_value_of_another_shape_is_refused(
    devices: list[str], layout: str
) -> None:
    # Replicated, a [a:4] variable held 7 numbers.
    m = _mesh()
    mtf.get_variable(m, "w", [A], initializer=lambda shape, dtype: np.arange(7.0))
    with pytest.raises(
        ShapeError,
        match=r"initializer's value for variable w has shape \[7\]; expected \[a:4\]",
    ):
        mtf.Lowering(m.graph, {m: _impl(devices, layout)})


def test_lowering_names_bad_arguments(devices: list[str]) -> None:
    m = _mesh()
    y = mtf.zeros(m, [A])
    g = m.graph
    with pytest.raises(LoweringError, match="graph None is not an mtf.Graph"):
        mtf.Lowering(None, {m: _impl(devices)})
    with pytest.raises(LoweringError, match=r"mesh_to_impl is \[.*\]; expected a dict"):
        mtf.Lowering(g, [_impl(devices)])
    with pytest.raises(
        LoweringError, match=r"mesh_to_impl\['m'\] is 'impl'; expected a MeshImpl"
    ):
        mtf.Lowering(g, {m: "impl"})
    with pytest.raises(LoweringError, match="target None is not a tensor or operation"):
        mtf.Lowering(g, {m: _impl(devices)}, targets=[None])
    with pytest.raises(LoweringError, match="seed is 'x'; expected an integer"):
        mtf.Lowering(g, {m: _impl(devices)}, seed="x")
    with pytest.raises(LoweringError, match="devices is 'ab'; expected a list"):
        mtf.PlacementMeshImpl("x:2", "", "ab")
    lowering = mtf.Lowering(g, {m: _impl(devices)})
    other = mtf.zeros(mtf.Mesh(mtf.Graph(), "m2"), [A])
    with pytest.raises(
        LoweringError, match="zeros:0 is on mesh 'm2', which this lowering has no"
    ):
        lowering.export_to_tf_tensor(other)
    with pytest.raises(LoweringError, match="None is not an mtf.Tensor"):
        lowering.export_to_tf_tensor(None)
    assert lowering.export_to_tf_tensor(y).numpy().tolist() == [0.0] * 4


def test_an_op_whose_construction_fails_leaves_nothing_in_the_graph(
    devices: list[str],
) -> None:
    # Each of these ops was added to the graph before it checked the rest of
    # its arguments: the graph then held an op without outputs, which the
    # whole graph's lowering and its JSON could not take.
    m = _mesh()
    g = m.graph
    x = mtf.placeholder(m, [A, B])
    w = mtf.get_variable(m, "w", [B, C])
    four = mtf.zeros(m, mtf.Shape([mtf.Dimension("a", 2)]))
    before = list(g.operations)
    failing = [
        lambda: mtf.einsum(x, w, output_shape=[A, mtf.Dimension("c", 5)]),
        lambda: x + four,
        lambda: mtf.constant(m, 2.5, [A], "int32"),
        lambda: mtf.get_variable(m, "v", [A], initializer="zeros"),
    ]
    for call in failing:
        with pytest.raises(mtf.MtfError):
            call()
        assert g.operations == before
        assert [op.graph_index for op in g.operations] == list(range(len(before)))
        assert g.all_variables == [w.operation] == g.trainable_variables
    y = mtf.reduce_sum(mtf.einsum(x, w, output_shape=[A, C]), reduced_dim=C)
    lowering = mtf.Lowering(g, {m: _impl(devices)}, feeds={x: np.ones((4, 6))})
    assert lowering.export_to_tf_tensor(y).shape == (4,)
    again = mtf.graph_from_json(mtf.graph_to_json(g))
    assert [op.op_type for op in again.graph.operations] == [
        op.op_type for op in g.operations
    ]


def _ids_graph() -> tuple[mtf.Mesh, mtf.Tensor, mtf.Tensor]:
    m = _mesh()
    ids = mtf.placeholder(m, [A], dtype="int32")
    return m, ids, mtf.reduce_sum(mtf.cast(ids, "float32"))


@pytest.mark.parametrize(
    ("fed", "problem"),
    [
        (np.full(4, 0.7), "has a fraction or is not finite; a int32 holds"),
        (np.full(4, 2**40), r"does not fit int32 \(\[-2147483648, 2147483647\]\)"),
    ],
    ids=["fraction", "too-large"],
)
def test_an_integer_placeholder_takes_only_numbers_it_holds(
    devices: list[str], fed: np.ndarray, problem: str
) -> None:
    # A cast made 0.7 a 0 and 2**40 a 0, eagerly and in compiled steps.
    m, ids, total = _ids_graph()
    with pytest.raises(DTypeError, match=rf"placeholder placeholder:0 {problem}"):
        mtf.Lowering(m.graph, {m: _impl(devices)}, feeds={ids: fed})
    for impl in (_impl(devices), mtf.SimdMeshImpl("x:2", "a:x", devices[:2])):
        step = mtf.compile_function(m.graph, {m: impl}, inputs=[ids], outputs=[total])
        with pytest.raises(DTypeError, match=rf"input placeholder:0 {problem}"):
            step(fed)
        # Whole numbers of another dtype that fit (numpy's int64) are taken.
        assert step(np.arange(4, dtype=np.int64))[0] == 6.0
        assert step(np.arange(4.0))[0] == 6.0


def test_both_compiled_backends_name_an_input_of_another_shape(
    devices: list[str],
) -> None:
    m = _mesh()
    x = mtf.placeholder(m, [A, B])
    y = mtf.reduce_sum(x)
    for impl in (_impl(devices), mtf.SimdMeshImpl("x:2", "a:x", devices[:2])):
        step = mtf.compile_function(m.graph, {m: impl}, inputs=[x], outputs=[y])
        with pytest.raises(
            LoweringError,
            match=r"input placeholder:0 has shape \[4, 4\]; expected \[a:4,b:6\]",
        ):
            step(np.ones((4, 4), np.float32))
        assert step(np.ones((4, 6), np.float32))[0] == 24.0


# -- checkpoints ---------------------------------------------------------------------
@pytest.mark.parametrize("step", [-1, 1.5, True])
def test_a_checkpoint_step_must_be_a_whole_number(tmp_path: Path, step: object) -> None:
    # -1 wrote ckpt--00001 as the latest, and every later save failed pruning.
    with pytest.raises(
        SerializationError, match=f"checkpoint step is {step!r}; expected"
    ):
        save_checkpoint(tmp_path, step, {"w": np.zeros(3)})  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    save_checkpoint(tmp_path, 2, {"w": np.zeros(3)})
    assert load_checkpoint(tmp_path).step == 2


def test_a_checkpoint_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "ckpt"
    f.write_text("x")
    with pytest.raises(
        SerializationError, match="checkpoint directory .*ckpt' is a file"
    ):
        save_checkpoint(f, 1, {"w": np.zeros(3)})
