"""concat / split / stack / unstack / slice / pad / shift: values and gradients
under every layout, what they communicate, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import (
    LAYOUTS,
    MODEL_SPLIT,
    LayoutCase,
    assert_communication_as_recorded,
    check_op,
    lower,
    upstream_for,
    weighted_sum,
)

import mtf_core as mtf
from mtf_core.ops.slicing import shift_pieces

pytestmark = pytest.mark.tf


def _tf_shift(x: tf.Tensor, offset: int, axis: int, wrap: bool) -> tf.Tensor:
    """y[i] = x[i - offset] along ``axis`` in plain TensorFlow."""
    if wrap:
        return tf.roll(x, offset, axis)
    n = x.shape[axis]
    pads = [[0, 0]] * x.shape.rank
    if abs(offset) >= n:
        return x * 0.0
    if offset > 0:
        pads[axis] = [offset, 0]
        return tf.pad(_tf_take(x, axis, 0, n - offset), pads)
    pads[axis] = [0, -offset]
    return tf.pad(_tf_take(x, axis, -offset, n + offset), pads)


def _tf_take(x: tf.Tensor, axis: int, start: int, length: int) -> tf.Tensor:
    begin = [0] * x.shape.rank
    size = [-1] * x.shape.rank
    begin[axis], size[axis] = start, length
    return tf.slice(x, begin, size)


# The standard layouts split batch on data and hidden on model, so each of
# these runs with its interesting dim whole, split, and split in 2-D.
CASES = {
    "concat_along_hidden": (
        ["batch:8,hidden:4", "batch:8,hidden:8"],
        lambda a, b: mtf.concat([a, b], "hidden"),
        lambda a, b: tf.concat([a, b], 1),
    ),
    "concat_along_another_dim": (
        ["batch:8,hidden:4", "batch:8,hidden:4"],
        lambda a, b: mtf.concat([a, b], "batch"),
        lambda a, b: tf.concat([a, b], 0),
    ),
    "split_hidden_then_concat_reversed": (
        ["batch:8,hidden:12"],
        lambda x: mtf.concat(mtf.split(x, "hidden", [4, 8])[::-1], "hidden"),
        lambda x: tf.concat(tf.split(x, [4, 8], 1)[::-1], 1),
    ),
    "split_into_equal_pieces": (
        ["batch:8,hidden:8"],
        lambda x: mtf.split(x, mtf.Dimension("hidden", 8), 2)[1] * 2.0,
        lambda x: tf.split(x, 2, 1)[1] * 2.0,
    ),
    "stack_new_dim_in_the_middle": (
        ["batch:8,hidden:4", "batch:8,hidden:4"],
        lambda a, b: mtf.stack([a, b * 3.0], "pair", axis=1),
        lambda a, b: tf.stack([a, b * 3.0], 1),
    ),
    "unstack_hidden_and_restack_reversed": (
        ["batch:8,hidden:4"],
        lambda x: mtf.stack(mtf.unstack(x, "hidden")[::-1], "rev", axis=0),
        lambda x: tf.stack(tf.unstack(x, axis=1)[::-1], 0),
    ),
    "slice_hidden": (
        ["batch:8,hidden:12"],
        lambda x: mtf.slice(x, 4, 8, "hidden"),
        lambda x: x[:, 4:12],
    ),
    "pad_hidden": (
        ["batch:8,hidden:4"],
        lambda x: mtf.pad(x, [1, 3], "hidden"),
        lambda x: tf.pad(x, [[0, 0], [1, 3]]),
    ),
}
for _offset in (1, 3, -5, 9):
    for _wrap in (False, True):
        CASES[f"shift_hidden_by_{_offset}_wrap_{_wrap}"] = (
            ["batch:8,hidden:8"],
            lambda x, o=_offset, w=_wrap: mtf.shift(x, o, "hidden", w),
            lambda x, o=_offset, w=_wrap: _tf_shift(x, o, 1, w),
        )
CASES["shift_batch_by_minus_3"] = (
    ["batch:8,hidden:4"],
    lambda x: mtf.shift(x, -3, "batch", wrap=False),
    lambda x: _tf_shift(x, -3, 0, False),
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_slicing_ops_and_their_gradients_do_not_depend_on_layout(
    devices: list[str], case: str
) -> None:
    shapes, mtf_fn, tf_fn = CASES[case]
    check_op(devices, shapes, mtf_fn, tf_fn)


def _graph(*shapes: str):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    rng = np.random.RandomState(1)
    xs = [
        mtf.import_tf_tensor(
            mesh,
            rng.randn(*mtf.convert_to_shape(s).to_integer_list()).astype(np.float32),
            s,
        )
        for s in shapes
    ]
    return graph, mesh, xs


def test_concat_of_a_split_dim_gathers_each_input_once(devices: list[str]) -> None:
    def build():
        graph, mesh, (a, b) = _graph("batch:8,hidden:4", "batch:8,hidden:8")
        return graph, mesh, mtf.concat([a, b], "hidden")

    seen = assert_communication_as_recorded(devices, build)
    assert seen["one_device"] == seen["batch_split"] == []
    # model:4 splits hidden: each input is allconcatenated from its slice
    # ([8, 1] and [8, 2] float32), and the output is sliced locally
    assert seen["model_split"] == [
        ("allconcat", ("model",), 32),
        ("allconcat", ("model",), 64),
    ]
    assert seen["split_2d"] == [
        ("allconcat", ("model",), 16),
        ("allconcat", ("model",), 32),
    ]


def test_ops_needing_a_whole_dim_mark_it_unsplittable() -> None:
    graph, mesh, (a, b) = _graph("batch:8,hidden:4", "batch:8,hidden:4")
    ops = {
        "concat": mtf.concat([a, b], "hidden").operation,
        "split": mtf.split(a, "hidden", 2)[0].operation,
        "unstack": mtf.unstack(a, "hidden")[0].operation,
        "slice": mtf.slice(a, 1, 2, "hidden").operation,
        "pad": mtf.pad(a, [1, 0], "hidden").operation,
    }
    for name, op in ops.items():
        assert op.unsplittable_dims() == {"hidden"}, name
        assert "batch" in op.splittable_dims(), name
    assert mtf.stack([a, b], "s").operation.unsplittable_dims() == frozenset()
    assert mtf.shift(a, 1, "hidden", False).operation.unsplittable_dims() == frozenset()


@pytest.mark.parametrize(
    "offset,wrap,expected",
    [
        # hidden:8 on model:4 -> blocks of 2; a [8, 1] float32 edge is 32 bytes
        (1, False, [("shift", ("model",), 32)]),
        (3, False, [("shift", ("model",), 32), ("shift", ("model",), 32)]),
        (2, True, [("shift", ("model",), 64)]),
        (-7, True, [("shift", ("model",), 32)]),  # = +1 around the ring
        (8, False, []),  # everything shifts out: zeros, nothing sent
    ],
)
def test_shift_along_a_split_dim_sends_only_edge_pieces(
    devices: list[str], offset: int, wrap: bool, expected: list
) -> None:
    def build():
        graph, mesh, (x,) = _graph("batch:8,hidden:8")
        return graph, mesh, mtf.shift(x, offset, "hidden", wrap)

    seen = assert_communication_as_recorded(devices, build, [MODEL_SPLIT])
    assert seen["model_split"] == expected


def test_shift_pieces_cover_each_output_block_once() -> None:
    for offset in range(-9, 10):
        for wrap in (False, True):
            pieces = shift_pieces(offset, 2, 4, wrap)
            assert sum(length for _, length, _, _ in pieces) == 2


def test_every_slicing_op_predicts_what_it_communicates(devices: list[str]) -> None:
    def build():
        graph, mesh, (a, b) = _graph("batch:8,hidden:8", "batch:8,hidden:8")
        parts = mtf.split(mtf.concat([a, b], "hidden"), "hidden", [4, 12])
        y = mtf.pad(mtf.slice(parts[1], 2, 8, "hidden"), [4, 4], "hidden")
        y = mtf.shift(y, 5, "hidden", wrap=True) + mtf.shift(y, -3, "batch", False)
        z = mtf.stack(mtf.unstack(y, "batch"), "batch", axis=0)
        out = mtf.stack([z, z * 2.0], "two", axis=2)
        # the gradients are slicing ops too (split, concat, slice, pad, shift, ...)
        upstream = upstream_for(out, np.random.RandomState(0))
        return graph, mesh, [out, *mtf.gradients([weighted_sum(out, upstream)], [a, b])]

    custom = LayoutCase("stacked_dim_split", "two:2;data:2", "two:two;hidden:data")
    seen = assert_communication_as_recorded(devices, build, [*LAYOUTS, custom])
    assert seen["one_device"] == []
    kinds = {k for k, _, _ in seen["split_2d"]}
    assert kinds == {"allconcat", "shift"}


def test_stack_with_the_new_dim_split_keeps_each_devices_block(
    devices: list[str],
) -> None:
    graph, mesh, xs = _graph("batch:4", "batch:4", "batch:4", "batch:4")
    y = mtf.stack(xs, "layer", axis=1)
    case = LayoutCase("layer_split", "model:4", "layer:model")
    (got,), lowering = lower(graph, mesh, case, devices, [y])
    (want,), _ = lower(graph, mesh, LAYOUTS[0], devices, [y])
    np.testing.assert_array_equal(got, want)
    assert lowering.counters.collectives == []


def test_slicing_ops_reject_bad_input() -> None:
    graph, mesh, (a, b, c) = _graph("batch:8,hidden:4", "batch:4,hidden:4", "batch:8")
    with pytest.raises(mtf.ShapeError, match="every dimension but 'hidden'"):
        mtf.concat([a, b], "hidden")
    with pytest.raises(mtf.ShapeError, match="has no dimension 'nope'"):
        mtf.concat([a, a], "nope")
    with pytest.raises(mtf.ShapeError, match=r"sum to 5.*size 4"):
        mtf.split(a, "hidden", [2, 3])
    with pytest.raises(mtf.ShapeError, match="3 equal pieces"):
        mtf.split(a, "hidden", 3)
    with pytest.raises(mtf.ShapeError, match="does not match hidden:4"):
        mtf.split(a, mtf.Dimension("hidden", 5), 2)
    with pytest.raises(mtf.ShapeError, match="one shape"):
        mtf.stack([a, b], "s")
    with pytest.raises(mtf.ShapeError, match="already have a dimension 'batch'"):
        mtf.stack([a, a], "batch")
    with pytest.raises(mtf.ShapeError, match="axis 5 is out of range"):
        mtf.stack([c, c], "s", axis=5)
    with pytest.raises(mtf.ShapeError, match="runs past dimension hidden:4"):
        mtf.slice(a, 3, 2, "hidden")
    with pytest.raises(mtf.ShapeError, match=r"begin is -1"):
        mtf.slice(a, -1, 2, "hidden")
    with pytest.raises(mtf.ShapeError, match=r"paddings\[1\] is -2"):
        mtf.pad(a, [1, -2], "hidden")
    with pytest.raises(mtf.ShapeError, match="expected \\[before, after\\]"):
        mtf.pad(a, [1], "hidden")
    with pytest.raises(mtf.ShapeError, match="offset 1.5 is not an integer"):
        mtf.shift(a, 1.5, "hidden", False)
    with pytest.raises(ValueError, match="has no dimension 'model'"):
        mtf.unstack(a, "model")


def test_slicing_ops_are_identity_when_nothing_changes() -> None:
    graph, mesh, (a,) = _graph("batch:8,hidden:4")
    assert mtf.slice(a, 0, 4, "hidden") is a
    assert mtf.pad(a, [0, 0], "hidden") is a
    assert mtf.shift(a, 0, "hidden", False) is a
    assert mtf.shift(a, 8, "batch", True) is a
    assert mtf.concat([a], "hidden") is a
