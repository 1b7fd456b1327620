"""Mesh TF's auto_mtf helpers under mesh_tensorflow.auto_mtf: the graph
interface, the greedy list scheduler and the layout validator."""

from __future__ import annotations

import pytest

import mtf_core as mtf
from mtf_core.compat.auto_mtf import graph_interface, scheduler, valid_layouts
from mtf_core.errors import GraphTypeError


def _graph():
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.Constant(m, 0, "a:3,b:4", "int32", name="X").outputs[0]
    y = mtf.Constant(m, 0, "b:4,c:5", "int32", name="Y").outputs[0]
    z = mtf.einsum([x, y], output_shape="a:3,b:4,c:5", name="Z")
    w = mtf.einsum([x, y], output_shape="a:3,c:5", name="W")
    v = mtf.broadcast(w, mtf.Shape("a:3,b:4,c:5"))
    return g, z, v


def test_list_scheduler_runs_what_frees_most_bytes_first():
    g, z, v = _graph()
    gi = graph_interface.GraphInterface(g)
    gi.set_tensor_final(z.name)
    gi.set_tensor_final(v.name)
    # X (-48 bytes), Y (-80); then W (-60) before Z (-240); then Z, V.
    assert list(scheduler.minimize_peak_memory(gi, "LIST")) == [0, 1, 3, 2, 4]
    assert list(scheduler.minimize_peak_memory(gi, "NAIVE")) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="'FAST' is unknown"):
        scheduler.minimize_peak_memory(gi, "FAST")


def test_memory_contents_keep_tensors_until_their_last_reader():
    g, z, v = _graph()
    gi = graph_interface.GraphInterface(g)
    gi.set_tensor_final(v.name)
    contents = gi.compute_memory_contents_under_schedule([0, 1, 3, 2, 4])
    assert contents[2] == {"X:0", "Y:0", "W:0"}
    # Z is read by no one and not final: it lives only while it is made; X
    # and Y are freed after Z, their last reader.
    assert contents[3] == {"X:0", "Y:0", "W:0", "Z:0"}
    assert contents[4] == {"W:0", v.name}
    assert gi.get_tensor_size("Z:0") == 60 * 4
    assert gi.get_tensor_num_entries("Z:0", {"c": "m"}, {"m": 5}) == 12


def test_layout_validator_checks_splittability_and_divisibility():
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x1 = mtf.zeros(m, "a:5,b:10,concat:15")
    x2 = mtf.zeros(m, "a:5,b:10,concat:20")
    mtf.concat([x1, x2], "concat")
    v = valid_layouts.LayoutValidator(g, "m1:4;m2:2")
    assert v.splittable_mtf_dimension_names == {"a", "b"}
    assert v.is_valid_assignment("b", "m2") and not v.is_valid_assignment("b", "m1")
    assert not v.is_valid_assignment("concat", "m2")


def test_graph_interface_needs_an_mtf_graph():
    with pytest.raises(GraphTypeError, match="got str"):
        graph_interface.GraphInterface("hello")
