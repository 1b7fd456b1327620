"""Dimension, Shape and their string forms (pure logic, no TensorFlow)."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf


@pytest.mark.parametrize(
    "text",
    [
        "a:10,b:5",
        "a:10;b:5",
        "a:10.b:5",
        "a:10 b:5",
        " a:10 ,  b:5 ",
        "a:10;\tb:5",
        "a : 10 ; b :5",
    ],
)
def test_shape_string_accepts_every_separator(text: str) -> None:
    shape = mtf.convert_to_shape(text)
    assert shape.dims == (mtf.Dimension("a", 10), mtf.Dimension("b", 5))
    assert str(shape) == "a:10,b:5"


def test_mesh_shape_string_parses_in_order() -> None:
    mesh = mtf.convert_to_shape("x:2;y:4")
    assert mesh.dimension_names == ["x", "y"]
    assert mesh.to_integer_list() == [2, 4]
    assert mesh.size == 8


def test_shape_string_round_trips_through_str() -> None:
    shape = mtf.convert_to_shape("batch:32,d_model:1024,heads:8")
    assert mtf.convert_to_shape(str(shape)) == shape
    assert repr(shape) == "Shape('batch:32,d_model:1024,heads:8')"


def test_empty_string_is_a_scalar_shape() -> None:
    assert mtf.convert_to_shape("").dims == ()
    assert mtf.convert_to_shape("").size == 1


def test_convert_to_shape_accepts_dimensions_pairs_and_strings_alike() -> None:
    want = mtf.Shape([mtf.Dimension("batch", 4), mtf.Dimension("hidden", 8)])
    assert mtf.convert_to_shape([("batch", 4), "hidden:8"]) == want
    assert mtf.convert_to_shape([mtf.Dimension("batch", 4), ("hidden", 8)]) == want
    assert mtf.convert_to_shape(want) is want
    assert mtf.convert_to_shape(mtf.Dimension("batch", 4)).dimension_names == ["batch"]


def test_convert_to_dimension_forms() -> None:
    d = mtf.Dimension("rows", 28)
    assert mtf.convert_to_dimension("rows:28") == d
    assert mtf.convert_to_dimension(" rows : 28 ") == d
    assert mtf.convert_to_dimension(("rows", 28)) == d
    assert mtf.convert_to_dimension(d) is d
    assert mtf.convert_to_dimension(None) is None
    assert str(d) == "rows:28"


def test_numpy_integer_sizes_become_python_ints() -> None:
    d = mtf.Dimension("a", np.int64(3))
    assert d.size == 3 and type(d.size) is int
    assert d == mtf.Dimension("a", 3)


def test_dimensions_and_shapes_are_hashable_values() -> None:
    a = mtf.convert_to_shape("a:2,b:3")
    b = mtf.Shape([("a", 2), ("b", 3)])
    assert a == b and hash(a) == hash(b)
    assert len({a, b, mtf.convert_to_shape("b:3,a:2")}) == 2
    assert {mtf.Dimension("a", 2): 1}[mtf.convert_to_dimension("a:2")] == 1
    with pytest.raises(AttributeError):
        a.dims = ()  # type: ignore[misc]


def test_shape_arithmetic_and_queries() -> None:
    s = mtf.convert_to_shape("a:2,b:3,c:4")
    assert s - ["b"] == mtf.convert_to_shape("a:2,c:4")
    assert s - mtf.Dimension("a", 2) == mtf.convert_to_shape("b:3,c:4")
    assert s + "d:5" == mtf.convert_to_shape("a:2,b:3,c:4,d:5")
    assert s[1:] == mtf.convert_to_shape("b:3,c:4")
    assert s[2] == mtf.Dimension("c", 4)
    assert "b" in s and mtf.Dimension("b", 3) in s and mtf.Dimension("b", 4) not in s
    assert s.size == 24 and s.ndims == 3 and len(s) == 3
    assert s.get_dim_by_name("c").size == 4
    assert s.index("c") == 2
    assert s.rename_dimension("b", "bb").dimension_names == ["a", "bb", "c"]
    assert s.resize_dimension("b", 7).to_integer_list() == [2, 7, 4]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a", "'a' has no size"),
        ("a:x", "has size 'x'"),
        ("a:\u0661\u0662", "has size '\u0661\u0662'; expected an integer written in"),
        ("a:2_0", "has size '2_0'"),
        ("a:+2", "has size '+2'"),
        ("x:2.5;y:4", "dimension 'x:2.5' has size '2.5'; expected an integer"),
        ("x : 1.0", "dimension 'x:1.0' has size '1.0'"),
        ("a:", "has size ''"),
        ("a:0", "size 0"),
        ("a:-1", "size -1"),
        ("1a:2", "'1a' is invalid"),
        ("a:2,a:3", "repeats dimension name(s) ['a']"),
    ],
)
def test_malformed_shape_strings_raise_shape_errors_naming_the_value(
    text: str, fragment: str
) -> None:
    with pytest.raises(mtf.ShapeError) as info:
        mtf.convert_to_shape(text)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, mtf.MtfError)
    assert fragment in str(info.value)


def test_dimension_sizes_must_be_integers() -> None:
    with pytest.raises(mtf.ShapeError, match="size True; expected an integer"):
        mtf.Dimension("a", True)
    with pytest.raises(mtf.ShapeError, match="size 2.5; expected an integer"):
        mtf.Dimension("a", 2.5)  # type: ignore[arg-type]


def test_missing_dimension_lookups_name_the_shape() -> None:
    s = mtf.convert_to_shape("a:2,b:3")
    with pytest.raises(mtf.ShapeError, match=r"\[a:2,b:3\] has no dimension named 'z'"):
        s.get_dim_by_name("z")
    with pytest.raises(mtf.ShapeError, match="cannot convert 5 to a Shape"):
        mtf.convert_to_shape(5)
    with pytest.raises(mtf.ShapeError, match=r"\[a:2,b:3\] has no dimension named 'z'"):
        s.resize_dimension("z", 4)
