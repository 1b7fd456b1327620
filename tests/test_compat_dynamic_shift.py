"""``dynamic_shift`` (Mesh TF's Transformer left-aligns decoded sequences with
it): values equal numpy's and one device's under the 1-D, 2-D and replicated
layouts, the gradient moves back, every op's ``communication()`` is what it
records, the cost model prices it as it lowers, and bad offsets are refused
by name."""

from __future__ import annotations

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    assert_communication_as_recorded,
    assert_same_under_layouts,
    upstream_for,
    weighted_sum,
)
from test_cost_agreement import assert_agrees
from test_cost_graphs import Case

import mtf_core as mtf

pytestmark = pytest.mark.tf

XV = np.arange(1, 33, dtype=np.int32).reshape(4, 8)
OFFSETS = np.array([0, -2, 3, 9], np.int32)


def _numpy_shift(x: np.ndarray, offsets: np.ndarray, wrap: bool) -> np.ndarray:
    out = np.zeros_like(x)
    n = x.shape[1]
    for b, off in enumerate(offsets):
        for i in range(n):
            j = i - off
            if wrap:
                out[b, i] = x[b, j % n]
            elif 0 <= j < n:
                out[b, i] = x[b, j]
    return out


def _graph(dtype: str = "int32"):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, XV.astype(dtype), "batch:4,hidden:8")
    offset = mtf.import_tf_tensor(mesh, OFFSETS, "batch:4")
    return graph, mesh, x, offset


@pytest.mark.parametrize("wrap", [False, True], ids=["zeros", "wrap"])
def test_dynamic_shift_shifts_each_row_by_its_offset_under_every_layout(
    devices: list[str], wrap: bool
) -> None:
    graph, mesh, x, offset = _graph()
    y = mtf.dynamic_shift(x, offset, "hidden", wrap)
    assert y.shape == x.shape and y.dtype == "int32"
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    np.testing.assert_array_equal(got, _numpy_shift(XV, OFFSETS, wrap))


def test_dynamic_shift_gradient_shifts_back(devices: list[str]) -> None:
    graph, mesh, x, offset = _graph("float32")
    y = mtf.dynamic_shift(x, offset, "hidden", wrap=True)
    up = upstream_for(y, np.random.RandomState(0))
    (dx,) = mtf.gradients([weighted_sum(y, up)], [x])
    _, got_dx = assert_same_under_layouts(graph, mesh, devices, [y, dx])
    # y[i] = x[i - off] wrapped, so dx[j] = up[j + off]
    np.testing.assert_allclose(got_dx, _numpy_shift(up, -OFFSETS, wrap=True))


def test_dynamic_shift_communicates_as_its_parts_say(devices: list[str]) -> None:
    def build():
        graph, mesh, x, offset = _graph("float32")
        return graph, mesh, mtf.dynamic_shift(x, offset, "hidden", wrap=False)

    rec = assert_communication_as_recorded(devices, build)
    assert rec["one_device"] == rec["batch_split"] == []
    # hidden split 4 ways: the renamed copy of hidden is whole, so the rename
    # concatenates x's slices over "model" (each device sends its slice of
    # [batch:4, hidden:8] float32: 32 bytes, 16 under the 2-D split); the
    # einsum's output is split again locally.
    assert rec["model_split"] == [("allconcat", ("model",), 32)]
    assert rec["split_2d"] == [("allconcat", ("model",), 16)]


def test_cost_model_prices_dynamic_shift_as_it_lowers(devices: list[str]) -> None:
    graph, mesh, x, offset = _graph("float32")
    y = mtf.dynamic_shift(x, offset, "hidden", wrap=False)
    layouts = [(c.mesh_shape, c.rules) for c in LAYOUTS]
    case = Case(graph, mesh, [y], layouts)
    for mesh_shape, rules in layouts:
        _, (got,) = assert_agrees(case, mesh_shape, rules, devices)
        np.testing.assert_array_equal(got, _numpy_shift(XV, OFFSETS, False))


def test_dynamic_shift_by_an_int_is_shift_and_bad_offsets_are_refused() -> None:
    graph, mesh, x, offset = _graph()
    assert mtf.dynamic_shift(x, 2, "hidden", False).operation.op_type == "Shift"
    with pytest.raises(mtf.ShapeError, match="offset .*hidden:8.* has the shifted"):
        mtf.dynamic_shift(
            x, mtf.zeros(mesh, "hidden:8", dtype="int32"), "hidden", False
        )
    with pytest.raises(mtf.ShapeError, match="has beam:2, not a dimension of x"):
        mtf.dynamic_shift(x, mtf.zeros(mesh, "beam:2", dtype="int32"), "hidden", False)
    with pytest.raises(mtf.DTypeError, match="is float32; expected an integer"):
        mtf.dynamic_shift(x, mtf.zeros(mesh, "batch:4"), "hidden", False)
    with pytest.raises(mtf.ShapeError, match="offset 1.5 is neither"):
        mtf.dynamic_shift(x, 1.5, "hidden", False)  # type: ignore[arg-type]
    with pytest.raises(mtf.ShapeError, match="length"):
        mtf.dynamic_shift(x, offset, "length", False)


def test_mesh_tensorflow_dynamic_shift_is_mtf_cores() -> None:
    import mtf_core.compat as compat

    compat.install()
    try:
        import mesh_tensorflow

        assert mesh_tensorflow.dynamic_shift is mtf.dynamic_shift
    finally:
        compat.uninstall()
