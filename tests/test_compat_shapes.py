"""Mesh TF idioms on shapes and graphs: ``shape.dims`` adds with lists,
graph names are case-insensitive; bad input keeps its clear errors."""

from __future__ import annotations

import pytest

import mtf_core as mtf
from mtf_core.errors import ShapeError


def test_dims_add_and_slice_with_lists_as_mesh_tf_code_does():
    a, b, c = mtf.Dimension("a", 2), mtf.Dimension("b", 3), mtf.Dimension("c", 4)
    dims = mtf.Shape([a, b]).dims
    assert list(dims + [c]) == [a, b, c]
    assert list([c] + dims) == [c, a, b]
    assert list(dims[:-1] + [c]) == [a, c]
    assert list(dims[1:] + (c,)) == [b, c]
    assert dims == [a, b] and dims != [b, a]
    assert mtf.Shape(dims[:1] + [c]) == mtf.Shape("a:2,c:4")


def test_shape_stays_frozen_and_hashable():
    s = mtf.Shape("a:2,b:3")
    assert hash(s) == hash(mtf.Shape([("a", 2), ("b", 3)]))
    assert {s: 1}[mtf.Shape("a:2,b:3")] == 1
    with pytest.raises(AttributeError):
        s.dims = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.dims[0] = mtf.Dimension("z", 1)  # type: ignore[index]


def test_dims_adding_a_non_sequence_is_a_type_error():
    with pytest.raises(TypeError):
        mtf.Shape("a:2").dims + mtf.Dimension("b", 3)  # noqa: B018


def test_shapes_built_from_added_dims_still_reject_repeated_names():
    dims = mtf.Shape("a:2,b:3").dims
    with pytest.raises(ShapeError, match=r"repeats dimension name\(s\) \['a'\]"):
        mtf.Shape(dims + [mtf.Dimension("a", 5)])


def test_graph_unique_name_is_case_insensitive_and_skips_taken_suffixes():
    g = mtf.Graph()
    assert [g.unique_name(n) for n in ("a", "a", "a")] == ["a", "a_1", "a_2"]
    g = mtf.Graph()
    assert [g.unique_name(n) for n in ("a", "a_1", "a")] == ["a", "a_1", "a_2"]
    g = mtf.Graph()
    assert [g.unique_name(n) for n in ("a", "A", "a_1")] == ["a", "A_1", "a_1_1"]
    g = mtf.Graph()
    assert g.unique_name("x", mark_as_used=False) == "x"
    assert g.unique_name("x") == "x"


def test_mesh_takes_a_variable_placer():
    g = mtf.Graph()

    class Placer:
        def device_function(self, op):
            return "cpu:0"

    placer = Placer()
    mesh = mtf.Mesh(g, "m", placer)
    assert mesh.variable_placer is placer
    assert mesh.variable_placer_fn == placer.device_function
    assert mtf.Mesh(g, "n").variable_placer_fn == "cpu:0"


def test_to_integer_list_is_a_property_that_can_still_be_called():
    s = mtf.Shape("a:2,b:3")
    assert s.to_integer_list == [2, 3]  # Mesh TF: a property
    assert s.to_integer_list() == [2, 3]  # mtf_core's callers: a method
    assert mtf.Shape([]).to_integer_list == []
