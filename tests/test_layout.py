"""Layout rules, tensor layouts and layout-change plans (pure logic, no TensorFlow)."""

from __future__ import annotations

import itertools
import math

import pytest

import mtf_core as mtf
from mtf_core.comm import LayoutContext, layout_change_collectives, plan_layout_change


def test_layout_rules_print_in_canonical_sorted_form() -> None:
    rules = mtf.convert_to_layout_rules("c:m1;a:m2")
    assert str(rules) == "a:m2;c:m1"
    assert repr(rules) == "LayoutRules('a:m2;c:m1')"
    assert list(rules) == [("a", "m2"), ("c", "m1")]


@pytest.mark.parametrize(
    "form",
    [
        "a:m2;c:m1",
        "c:m1, a:m2",
        "c:m1 a:m2",
        "c : m1 ; a: m2",
        {"c": "m1", "a": "m2"},
        [("c", "m1"), ("a", "m2")],
    ],
)
def test_layout_rules_from_any_form_are_equal_values(form: object) -> None:
    rules = mtf.convert_to_layout_rules(form)
    want = mtf.LayoutRules([("a", "m2"), ("c", "m1")])
    assert rules == want and hash(rules) == hash(want)
    assert mtf.convert_to_layout_rules(rules) is rules


def test_empty_layout_rules_replicate_everything() -> None:
    for form in ("", None, []):
        rules = mtf.convert_to_layout_rules(form)
        assert len(rules) == 0 and str(rules) == ""
        layout = rules.tensor_layout("a:4,b:6", "m:2")
        assert layout.is_fully_replicated


def test_tensor_layout_maps_each_tensor_axis_to_its_mesh_axis() -> None:
    rules = mtf.convert_to_layout_rules("a:m2;c:m1")
    layout = rules.tensor_layout("a:10,b:5,c:4", "m1:4;m2:2")
    assert layout == mtf.TensorLayout((1, None, 0))
    assert layout.mesh_axis_to_tensor_axis(2) == (2, 0)
    assert not layout.is_fully_replicated
    assert rules.mesh_dimension_name("c") == "m1"
    assert rules.mesh_dimension_name("b") is None
    assert rules.mesh_dimension_name_to_tensor_dimension_names("m2") == ["a"]


def test_one_mesh_dim_may_split_different_dims_of_different_tensors() -> None:
    rules = mtf.convert_to_layout_rules("batch:m;hidden:m")
    assert rules.tensor_layout("batch:4,rows:3", "m:4") == mtf.TensorLayout((0, None))
    assert rules.tensor_layout("hidden:8", "m:4") == mtf.TensorLayout((0,))


def test_one_tensor_dim_on_two_mesh_dims_is_rejected() -> None:
    with pytest.raises(mtf.LayoutError) as info:
        mtf.convert_to_layout_rules("a:m1;a:m2")
    assert isinstance(info.value, ValueError)
    assert "'a'" in str(info.value)
    assert "'m1'" in str(info.value) and "'m2'" in str(info.value)


def test_two_dims_of_one_tensor_on_one_mesh_dim_are_rejected() -> None:
    rules = mtf.convert_to_layout_rules("a:m1;b:m1")
    with pytest.raises(mtf.LayoutError) as info:
        rules.tensor_layout("a:4,b:6", "m1:2")
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "[a:4,b:6]" in msg and "'a'" in msg and "'b'" in msg
    assert "'m1' of size 2" in msg


def test_indivisible_dimension_error_names_dim_size_axis_and_axis_size() -> None:
    rules = mtf.convert_to_layout_rules("hidden:model")
    with pytest.raises(mtf.IndivisibleDimensionError) as info:
        rules.tensor_layout("batch:8,hidden:10", "data:2;model:4")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, mtf.LayoutError)
    assert str(info.value) == (
        "dimension 'hidden' of size 10 is not divisible by mesh dimension "
        "'model' of size 4"
    )


@pytest.mark.parametrize("text", ["a", "a:", ":m", "a:m;b"])
def test_malformed_layout_rule_strings_are_rejected(text: str) -> None:
    with pytest.raises(
        mtf.LayoutError, match="malformed; expected 'tensor_dim:mesh_dim'"
    ):
        mtf.convert_to_layout_rules(text)


def test_layout_context_rejects_rules_naming_a_missing_mesh_dim() -> None:
    with pytest.raises(mtf.LayoutError) as info:
        LayoutContext.make("rows:2;cols:2", "batch:rows;hidden:model")
    assert str(info.value) == (
        "layout rule hidden:model names mesh dimension 'model', which mesh "
        "[rows:2,cols:2] does not have"
    )


def test_layout_context_slices_and_ignores_size_one_axes() -> None:
    ctx = LayoutContext.make("data:1;model:4", "batch:data;hidden:model")
    shape = mtf.convert_to_shape("batch:8,hidden:16,out:3")
    assert ctx.slice_shape(shape) == [8, 4, 3]
    assert ctx.slice_bytes(shape, "float32") == 8 * 4 * 3 * 4
    assert ctx.slice_bytes(shape, "bfloat16") == 8 * 4 * 3 * 2
    assert ctx.mesh_axis("batch") == 0
    assert ctx.effective_mesh_axis("batch") is None
    assert ctx.reduced_axes(["batch", "hidden", "out"]) == [1]
    assert ctx.devices_splitting(["hidden", "out"]) == 4


def test_check_op_dims_rejects_two_dims_of_one_op_on_one_mesh_dim() -> None:
    ctx = LayoutContext.make("m:2", "a:m;b:m")
    ctx.check_op_dims("Einsum e", ["a", "c"])
    with pytest.raises(mtf.LayoutError, match="Einsum e would split both 'a' and 'b'"):
        ctx.check_op_dims("Einsum e", ["a", "b"])


# -- layout changes ----------------------------------------------------------

CTX = LayoutContext.make("x:2;y:4", "")
SHAPE = mtf.convert_to_shape("a:8,b:8,c:4")


def _kinds(old: tuple, new: tuple) -> list[tuple[str, int]]:
    steps = plan_layout_change(
        CTX, SHAPE, "float32", mtf.TensorLayout(old), mtf.TensorLayout(new)
    )
    return [(s.kind, s.mesh_axis) for s in steps]


def test_layout_change_follows_the_transition_table() -> None:
    assert _kinds((0, None, None), (None, None, None)) == [("allconcat", 0)]
    assert _kinds((None, None, None), (0, None, None)) == [("allsplit", 0)]
    assert _kinds((0, None, None), (None, 0, None)) == [("alltoall", 0)]
    assert _kinds((0, 1, None), (0, 1, None)) == []


def test_layout_change_bytes_are_each_devices_input_slice() -> None:
    old, new = mtf.TensorLayout((0, 1, None)), mtf.TensorLayout((None, None, None))
    specs = layout_change_collectives(CTX, SHAPE, "float32", old, new)
    # a:8/2 x b:8/4 x c:4 floats = 128 bytes, then a gathered: 256 bytes
    assert [(s.kind, s.mesh_axes, s.bytes_per_device) for s in specs] == [
        ("allconcat", ("x",), 128),
        ("allconcat", ("y",), 256),
    ]


def test_swapping_two_axes_breaks_the_cycle_with_an_allconcat() -> None:
    assert _kinds((0, 1, None), (1, 0, None)) == [
        ("allconcat", 0),
        ("alltoall", 1),
        ("allsplit", 0),
    ]


def test_a_dim_loses_its_old_axis_before_gaining_a_new_one() -> None:
    # a moves from x to y while y leaves b: x must leave a first.
    assert _kinds((0, 1, None), (1, None, None)) == [
        ("allconcat", 0),
        ("alltoall", 1),
    ]


def _valid_layouts(n_axes: int) -> list[tuple[int | None, ...]]:
    """Every layout of a three-dim tensor using each mesh axis at most once."""
    out = []
    for axes in itertools.product([None, *range(n_axes)], repeat=3):
        used = [m for m in axes if m is not None]
        if len(used) == len(set(used)):
            out.append(axes)
    return out


@pytest.mark.parametrize("mesh", ["x:2;y:4", "x:2;y:2;z:2", "x:1;y:4"])
def test_every_layout_change_reaches_its_target_without_double_splits(
    mesh: str,
) -> None:
    """Replays every plan between all layouts of a:8,b:8,c:4 on the mesh."""
    ctx = LayoutContext.make(mesh, "")

    def local(layout: tuple[int | None, ...]) -> list[int]:
        return [
            d.size if m is None else d.size // ctx.mesh_shape[m].size
            for d, m in zip(SHAPE, layout)
        ]

    live = [m for m, d in enumerate(ctx.mesh_shape) if d.size > 1]
    layouts = _valid_layouts(ctx.ndims)
    for old, new in itertools.product(layouts, layouts):
        split = {t: m for t, m in enumerate(old) if m in live}
        sizes = local(old)
        for step in plan_layout_change(
            ctx, SHAPE, "float32", mtf.TensorLayout(old), mtf.TensorLayout(new)
        ):
            n = ctx.mesh_shape[step.mesh_axis].size
            assert step.bytes_per_device == (
                0 if step.kind == "allsplit" else 4 * math.prod(sizes)
            )
            if step.concat_axis is not None:
                assert split.pop(step.concat_axis) == step.mesh_axis
                sizes[step.concat_axis] *= n
            if step.split_axis is not None:
                assert step.split_axis not in split, (old, new, step)
                split[step.split_axis] = step.mesh_axis
                sizes[step.split_axis] //= n
        assert split == {t: m for t, m in enumerate(new) if m in live}
        assert sizes == local(new)
