"""The caching LayoutContext answers exactly as the lowering's (pure Python)."""

from __future__ import annotations

import itertools

import pytest

import mtf_core as mtf
from cost_models.gc_pause import gc_paused
from cost_models.layout_cache import CachedLayoutContext
from mtf_core.comm import LayoutContext
from mtf_core.errors import LayoutError

SHAPES = ["a:4,b:6", "b:6,c:8", "a:4,c:8,d:3", "d:3", ""]
MESH = "x:2;y:2;z:1"


def _answers(ctx: LayoutContext, shape: mtf.Shape) -> object:
    try:
        return (
            ctx.tensor_layout(shape),
            ctx.slice_bytes(shape, "float32"),
            ctx.slice_bytes(shape, "bfloat16"),
            ctx.slice_shape(shape),
        )
    except LayoutError as e:  # IndivisibleDimensionError included
        return (type(e), str(e))


def test_cached_context_answers_and_raises_like_the_lowerings() -> None:
    for axes in itertools.product([None, "x", "y", "z"], repeat=4):
        rules = [(d, m) for d, m in zip("abcd", axes) if m is not None]
        plain = LayoutContext.make(MESH, rules)
        cached = CachedLayoutContext.make(MESH, rules)
        for name in "abcde":
            assert cached.mesh_axis(name) == plain.mesh_axis(name)
            assert cached.effective_mesh_axis(name) == plain.effective_mesh_axis(name)
        for _ in range(2):  # the second time from the caches
            for text in SHAPES:
                shape = mtf.convert_to_shape(text)
                assert _answers(cached, shape) == _answers(plain, shape), (rules, text)
        names = list("abcd")
        assert cached.devices_splitting(names) == plain.devices_splitting(names)


class _KeyedByRank(CachedLayoutContext):
    """A wrong cache (keyed by rank and dtype only): the test below must fail
    on it, or it could not catch such a bug in the real one."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self._by_rank: dict[object, object] = {}

    def slice_bytes(self, shape: object, dtype: object) -> int:
        key = (len(shape.dims), dtype)  # type: ignore[attr-defined]
        if key not in self._by_rank:
            self._by_rank[key] = super().slice_bytes(shape, dtype)
        return self._by_rank[key]  # type: ignore[return-value]

    def tensor_layout(self, shape: object) -> object:  # type: ignore[override]
        key = len(shape.dims)  # type: ignore[attr-defined]
        if key not in self._by_rank:
            self._by_rank[key] = super().tensor_layout(shape)
        return self._by_rank[key]


def _check_different_shapes_get_their_own_answers(cached: LayoutContext) -> None:
    one = mtf.convert_to_shape("a:4,b:2")
    assert cached.slice_bytes(one, "float32") == 2 * 2 * 4
    layout_one = cached.tensor_layout(one)
    del one  # its id may be reused by the next shape of the same size
    # Same rank and dtype, different dims and sizes: different answers.
    other = mtf.convert_to_shape("b:8,a:2")
    assert cached.slice_bytes(other, "float32") == 8 * 1 * 4
    assert cached.tensor_layout(other) != layout_one
    assert cached.slice_bytes(mtf.convert_to_shape("a:4"), "int32") == 2 * 4
    assert cached.slice_bytes(mtf.convert_to_shape("c:4"), "int32") == 4 * 4


def test_equal_rank_shapes_that_are_different_objects_share_nothing() -> None:
    _check_different_shapes_get_their_own_answers(
        CachedLayoutContext.make("x:2", "a:x")
    )
    with pytest.raises(AssertionError):
        _check_different_shapes_get_their_own_answers(_KeyedByRank.make("x:2", "a:x"))


def test_gc_pause_restores_the_collectors_state() -> None:
    import gc

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()
