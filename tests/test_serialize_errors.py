"""Serialization errors: every malformed document raises SerializationError
(a ValueError) whose message names the offending field, and limits hold."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serialize_cases import slicing_doc, small_doc

import mtf_core as mtf
from mtf_core.errors import MtfError, SerializationError
from mtf_core.serialization import Limits
from mtf_core.serialization.schema import NO_LIMITS


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _causal_bias_doc(shape: list[dict[str, Any]], dtype: str = "float32") -> dict:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.layers.attention_bias_causal(m, mtf.Dimension("q", 3), mtf.Dimension("k", 3))
    doc = mtf.graph_to_dict(g)
    doc["operations"][0]["outputs"][0].update(shape=shape, dtype=dtype)
    return doc


@pytest.mark.parametrize(
    "shape, dtype, message",
    [
        ([{"name": "q", "size": 3}], "float32", r"shape: .* \[length, memory_length\]"),
        ([{"name": "q", "size": 3}, {"name": "k", "size": 3}], "bfloat16", "bfloat16"),
    ],
)
def test_a_causal_bias_of_another_rank_or_dtype_is_refused(shape, dtype, message):
    with pytest.raises(SerializationError, match=message) as e:
        mtf.graph_from_dict(_causal_bias_doc(shape, dtype))
    assert str(e.value).startswith("operations[0]")


def _delete(path: tuple[Any, ...]) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


SHAPE_0 = ("operations", 0, "outputs", 0, "shape")
BAD_DOCUMENTS: dict[str, tuple[Callable[[dict], None], str]] = {
    "unknown version": (_set(("version",), 2), r"^version: 2 is not supported"),
    "version not an int": (_set(("version",), "1"), r"^version: expected an integer"),
    "wrong format": (_set(("format",), "onnx"), r"^format: expected 'mtf-graph'"),
    "typo in a top-level field": (
        _set(("operation",), []),
        r"^graph: unknown field\(s\) \['operation'\]",
    ),
    "unknown op_type": (
        _set(("operations", 1, "op_type"), "Frobnicate"),
        r"^operations\[1\]\.op_type: unknown op_type 'Frobnicate'",
    ),
    "dangling input": (
        _set(("operations", 1, "inputs", 0), "nope:0"),
        r"^operations\[1\]\.inputs\[0\]: tensor 'nope:0' is dangling",
    ),
    "input from a later op": (
        _set(("operations", 1, "inputs", 0), "reduce_sum:0"),
        r"^operations\[1\]\.inputs\[0\]: .* not earlier; .*topological order",
    ),
    "input index past the outputs": (
        _set(("operations", 1, "inputs", 0), "x:1"),
        r"^operations\[1\]\.inputs\[0\]: tensor 'x:1' is dangling; .* 1 output",
    ),
    "malformed tensor reference": (
        _set(("operations", 1, "inputs", 0), "x"),
        r"^operations\[1\]\.inputs\[0\]: tensor reference 'x' is malformed",
    ),
    "dangling output": (
        _set(("outputs", 0), "ghost:0"),
        r"^outputs\[0\]: tensor 'ghost:0' is dangling",
    ),
    "zero size": (
        _set((*SHAPE_0, 1, "size"), 0),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.size: dimension 'hidden' has "
        r"size 0; expected a size >= 1",
    ),
    "negative size": (
        _set((*SHAPE_0, 0, "size"), -4),
        r"^operations\[0\]\.outputs\[0\]\.shape\[0\]\.size: .* size -4",
    ),
    "fractional size": (
        _set((*SHAPE_0, 0, "size"), 4.5),
        r"^operations\[0\]\.outputs\[0\]\.shape\[0\]\.size: expected an integer, got "
        r"number 4\.5",
    ),
    "boolean size": (
        _set((*SHAPE_0, 0, "size"), True),
        r"\.shape\[0\]\.size: expected an integer, got boolean",
    ),
    "duplicate dim names": (
        _set((*SHAPE_0, 1, "name"), "batch"),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.name: dimension name 'batch' "
        r"appears twice",
    ),
    "invalid dim name": (
        _set((*SHAPE_0, 1, "name"), "9 lives"),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.name: dimension name '9 lives' "
        r"is invalid",
    ),
    "shape as a string": (
        _set(SHAPE_0, "batch:4,hidden:8"),
        r"^operations\[0\]\.outputs\[0\]\.shape: expected an array, got string",
    ),
    "declared shape differs from the op's": (
        _set(("operations", 1, "outputs", 0, "shape", 1, "size"), 9),
        r"^operations\[1\]\.outputs\[0\]\.shape: declared \[batch:4,hidden:9\] but "
        r"Unary 'relu' computes \[batch:4,hidden:8\]",
    ),
    "declared dtype differs from the op's": (
        _set(("operations", 1, "outputs", 0, "dtype"), "int32"),
        r"^operations\[1\]\.outputs\[0\]\.dtype: declared int32 but Unary 'relu' "
        r"computes float32",
    ),
    "unknown dtype": (
        _set(("operations", 0, "outputs", 0, "dtype"), "float128"),
        r"^operations\[0\]\.outputs\[0\]\.dtype: dtype 'float128' is not supported",
    ),
    "wrong output count": (
        _set(("operations", 1, "outputs"), []),
        r"^operations\[1\]\.outputs: 0 output\(s\) declared but Unary 'relu' computes 1",
    ),
    "output name disagrees": (
        _set(("operations", 1, "outputs", 0, "name"), "relu:7"),
        r"^operations\[1\]\.outputs\[0\]\.name: expected 'relu:0'",
    ),
    "reduction keeps a dim the input lacks": (
        _set(("operations", 2, "outputs", 0, "shape", 0, "name"), "rows"),
        r"^operations\[2\] \(Reduce 'reduce_sum'\): reduce: output dimension rows:4",
    ),
    "duplicate op names": (
        _set(("operations", 2, "name"), "x"),
        r"^operations\[2\]\.name: operation name 'x' is also used by operations\[0\]",
    ),
    "unknown mesh": (
        _set(("operations", 1, "mesh"), "mars"),
        r"^operations\[1\]\.mesh: no mesh named 'mars'",
    ),
    "missing outputs field": (
        _delete(("operations", 1, "outputs")),
        r"^operations\[1\]: missing required field 'outputs'",
    ),
    "unknown op field": (
        _set(("operations", 1, "colour"), "red"),
        r"^operations\[1\]: unknown field\(s\) \['colour'\]",
    ),
    "attr of the wrong type": (
        _set(("operations", 1, "attrs", "fn"), 3),
        r"^operations\[1\]\.attrs\.fn: expected a non-empty string, got number 3",
    ),
    "unknown unary fn": (
        _set(("operations", 1, "attrs", "fn"), "frobnicate"),
        r"^operations\[1\]\.attrs\.fn: 'frobnicate' is not one of \[",
    ),
    "wrong input count": (
        _set(("operations", 1, "inputs"), ["x:0", "x:0"]),
        r"^operations\[1\]\.inputs: Unary takes 1 input\(s\), got 2",
    ),
    "assign to a non-variable": (
        _set(("operations", 5, "inputs", 0), "x:0"),
        r"^operations\[5\]\.inputs\[0\]: x:0 is not a variable's value tensor",
    ),
    "variables summary disagrees": (
        _set(("variables", 0, "trainable"), False),
        r"^variables\[0\]\.trainable: declared False but variable 'w' has True",
    ),
    "variables summary names a non-variable": (
        _set(("variables", 0, "name"), "x"),
        r"^variables\[0\]\.name: no Variable operation is named 'x'",
    ),
    "variables summary misses one": (
        _set(("variables",), []),
        r"^variables: Variable operation\(s\) \['w'\] are not listed",
    ),
    "duplicate mesh names": (
        _set(("meshes",), [{"name": "m"}, {"name": "m"}]),
        r"^meshes\[1\]\.name: mesh name 'm' is used twice",
    ),
    "metadata not an object": (
        _set(("metadata",), [1]),
        r"^metadata: expected an object, got array",
    ),
}


BAD_SLICING_DOCUMENTS: dict[str, tuple[int, str, Any, str]] = {
    # case: (operation index, attr, new value, message)
    "split sizes do not sum": (
        2,
        "sizes",
        [3, 4],
        r"^operations\[2\]\.attrs\.sizes: \[3, 4\] sum to 7, but dimension hidden:8",
    ),
    "split size zero": (
        2,
        "sizes",
        [0, 8],
        r"^operations\[2\]\.attrs\.sizes\[0\]: 0 is less than the minimum 1",
    ),
    "slice past the end": (
        3,
        "begin",
        3,
        r"^operations\[3\]\.attrs: begin 3 and size 2 do not select .* batch:4",
    ),
    "shift over an unknown dim": (
        4,
        "dim",
        "nope",
        r"^operations\[4\]\.attrs\.dim: x:0 \[batch:4,hidden:8\] has no dimension "
        r"'nope'",
    ),
    "one_hot dim without a size": (
        5,
        "output_dim",
        "classes",
        r"^operations\[5\]\.attrs\.output_dim: 'classes' is not a dimension; "
        r"expected 'name:size'",
    ),
    "random params not a pair": (
        6,
        "params",
        [0.0],
        r"^operations\[6\]\.attrs\.params: expected two numbers",
    ),
    "random seed not an integer": (
        6,
        "seed",
        "abc",
        r"^operations\[6\]\.attrs\.seed: expected an integer, got string",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SLICING_DOCUMENTS))
def test_bad_attrs_of_shape_and_indexing_ops_name_the_attr(case: str) -> None:
    i, key, value, message = BAD_SLICING_DOCUMENTS[case]
    doc = slicing_doc()
    mtf.graph_from_dict(copy.deepcopy(doc))
    assert key in doc["operations"][i]["attrs"]
    doc["operations"][i]["attrs"][key] = value
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_dict(doc)


@pytest.mark.parametrize("case", sorted(BAD_DOCUMENTS))
def test_bad_document_raises_serialization_error_naming_the_field(case: str) -> None:
    edit, message = BAD_DOCUMENTS[case]
    doc = small_doc()
    mtf.graph_from_dict(copy.deepcopy(doc))  # the unedited one is fine
    edit(doc)
    with pytest.raises(SerializationError, match=message) as info:
        mtf.graph_from_dict(doc)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MtfError)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            out += _paths(v, (*prefix, k))
    return out


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 2**70)
    | st.floats(allow_nan=False)
    | st.sampled_from(["", "x", "x:0", "a:2", "NaN", "float32", "relu", "hidden"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "size", "a"]), inner, max_size=2)
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_corrupted_document_is_accepted_or_refused_with_serialization_error(
    data: st.DataObject,
) -> None:
    """What the REST API relies on: bad documents never raise anything else."""
    doc = data.draw(st.sampled_from([small_doc, slicing_doc]))()
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = data.draw(JSON_VALUES)
    try:
        mtf.graph_from_dict(doc)
    except SerializationError:
        pass


def test_small_doc_has_the_layout_the_bad_documents_assume() -> None:
    doc = small_doc()
    assert [op["name"] for op in doc["operations"]] == [
        "x",
        "relu",
        "reduce_sum",
        "w",
        "reduce_sum_1",
        "assign_w",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", r"^graph JSON is not valid JSON: .* line 1 column 2"),
        ("", r"^graph JSON is not valid JSON: Expecting value"),
        ('{"format": NaN}', r"^graph JSON contains NaN, which is not JSON"),
        (b"\xff\xfe{}", r"^graph JSON is not UTF-8"),
        ("[1, 2]", r"^graph: expected an object, got array"),
        ('"mtf-graph"', r"^graph: expected an object, got string"),
        ("{}", r"^graph: missing required field 'format'"),
        ("[" * 100_000 + "]" * 100_000, r"^graph JSON is nested too deeply"),
    ],
)
def test_non_json_input_raises_serialization_error(
    text: str | bytes, message: str
) -> None:
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_json(text)


def test_graph_from_json_refuses_non_text() -> None:
    with pytest.raises(SerializationError, match="must be str or bytes, got dict"):
        mtf.graph_from_json({"format": "mtf-graph"})  # type: ignore[arg-type]


def test_derived_fields_are_checked_only_when_asked() -> None:
    doc = small_doc()
    doc["operations"][1]["flops"] = 1.0
    doc["operations"][2]["splittable_dims"] = ["batch"]
    mtf.graph_from_dict(copy.deepcopy(doc))  # recomputed, not trusted
    with pytest.raises(
        SerializationError,
        match=r"^operations\[1\]\.flops: declared 1\.0 but Unary 'relu' computes 32\.0",
    ):
        mtf.graph_from_dict(doc, check_derived=True)
    doc["operations"][1]["flops"] = 32.0
    with pytest.raises(
        SerializationError,
        match=r"^operations\[2\]\.splittable_dims: declared \['batch'\] but Reduce "
        r"'reduce_sum' has \['batch', 'hidden'\]",
    ):
        mtf.graph_from_dict(doc, check_derived=True)


def test_hand_written_minimal_document_is_accepted() -> None:
    """Derived fields, names of outputs, attrs and summaries are optional."""
    doc = {
        "format": "mtf-graph",
        "version": 1,
        "meshes": [{"name": "m"}],
        "operations": [
            {
                "name": "x",
                "op_type": "ImportTensor",
                "mesh": "m",
                "outputs": [
                    {
                        "shape": [{"name": "b", "size": 2}, {"name": "h", "size": 3}],
                        "dtype": "float32",
                    }
                ],
            },
            {
                "name": "sum",
                "op_type": "Reduce",
                "mesh": "m",
                "inputs": ["x:0"],
                "outputs": [{"shape": [{"name": "b", "size": 2}], "dtype": "float32"}],
            },
        ],
        "outputs": ["sum:0"],
    }
    loaded = mtf.graph_from_dict(doc)
    (out,) = loaded.outputs
    assert out.operation.reduction == "SUM" and out.operation.flops() == 6.0


@pytest.mark.parametrize(
    "limits, message",
    [
        (
            Limits(max_operations=5),
            r"^operations: count 6 is over the limit max_operations=5$",
        ),
        (
            Limits(max_rank=1),
            r"^operations\[0\]\.outputs\[0\]\.shape: rank 2 is over the limit max_rank=1$",
        ),
        (
            Limits(max_dim_size=7),
            r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.size: size 8 is over the limit",
        ),
        (
            Limits(max_distinct_dims=1),
            r"^operations\[0\]\.outputs\[0\]\.shape: count of distinct dimension names in the graph 2 is over",
        ),
    ],
)
def test_limits_are_enforced_with_the_field_named(limits: Limits, message: str) -> None:
    doc = small_doc()
    mtf.graph_from_dict(copy.deepcopy(doc), limits=NO_LIMITS)
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_dict(doc, limits=limits)


def test_json_length_and_constant_size_limits() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.constant(m, np.arange(12.0).reshape(3, 4), "a:3,b:4")
    text = mtf.graph_to_json(g)
    mtf.graph_from_json(text, limits=Limits(max_constant_elements=12))
    with pytest.raises(
        SerializationError,
        match=r"attrs\.value: element count 12 is over the limit max_constant_elements=11",
    ):
        mtf.graph_from_json(text, limits=Limits(max_constant_elements=11))
    with pytest.raises(
        SerializationError,
        match=r"^graph JSON: length \d+ is over the limit max_json_bytes=100",
    ):
        mtf.graph_from_json(text, limits=Limits(max_json_bytes=100))


def test_limits_reject_nonsense_bounds() -> None:
    with pytest.raises(SerializationError, match=r"Limits\.max_rank is 0"):
        Limits(max_rank=0)


def _conv_doc() -> dict[str, Any]:
    from serialize_cases import build_conv

    b = build_conv()
    return mtf.graph_to_dict(b.graph, outputs=b.outputs)


def _op_index(doc: dict[str, Any], op_type: str) -> int:
    return next(i for i, op in enumerate(doc["operations"]) if op["op_type"] == op_type)


def test_conv_gradient_with_a_shape_that_does_not_fit_dy_is_refused() -> None:
    doc = _conv_doc()
    i = _op_index(doc, "Conv2dBackpropInput")
    h = doc["operations"][i]["outputs"][0]["shape"][1]
    assert h["name"] == "h"
    h["size"] += 2
    with pytest.raises(
        SerializationError,
        match=rf"^operations\[{i}\]\.inputs\[0\]: .* is not the convolution output",
    ):
        mtf.graph_from_dict(doc)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("strides", [1], r"attrs\.strides: \[1\] is not \[stride_h, stride_w\]"),
        ("strides", [0, 1], r"attrs\.strides\[0\]: 0 is less than the minimum 1"),
        (
            "padding",
            "FULL",
            r"attrs\.padding: 'FULL' is not one of \['SAME', 'VALID'\]",
        ),
    ],
)
def test_conv_geometry_attrs_are_checked(key: str, value: Any, message: str) -> None:
    doc = _conv_doc()
    i = _op_index(doc, "Conv2d")
    doc["operations"][i]["attrs"][key] = value
    with pytest.raises(SerializationError, match=rf"^operations\[{i}\]\.{message}"):
        mtf.graph_from_dict(doc)
