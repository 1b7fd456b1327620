"""random_uniform / random_normal / dropout: the same numbers under every
layout, new numbers per compiled step, and a gradient through the same mask."""

from __future__ import annotations

import json

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    ONE_DEVICE,
    SPLIT_2D,
    assert_same_under_layouts,
    lower,
    upstream_for,
    weighted_sum,
)

import mtf_core as mtf

pytestmark = pytest.mark.tf

SHAPE = "batch:8,hidden:8"


def _graph() -> tuple[mtf.Graph, mtf.Mesh]:
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "mesh")


def test_random_ops_give_the_same_numbers_under_every_layout(
    devices: list[str],
) -> None:
    graph, mesh = _graph()
    u = mtf.random_uniform(mesh, SHAPE, minval=-2.0, maxval=3.0, seed=7)
    n = mtf.random_normal(mesh, SHAPE, mean=1.0, stddev=0.5)
    i = mtf.random_uniform(mesh, "hidden:8", minval=0, maxval=5, dtype=mtf.int32)
    got_u, got_n, got_i = assert_same_under_layouts(graph, mesh, devices, [u, n, i])
    assert got_u.shape == (8, 8) and got_u.dtype == np.float32
    assert got_u.min() >= -2.0 and got_u.max() < 3.0
    assert abs(got_n.mean() - 1.0) < 0.2 and 0.3 < got_n.std() < 0.7
    assert got_i.dtype == np.int32 and set(got_i) <= set(range(5))
    # every layout really split something, and no random op communicates
    for case in LAYOUTS:
        _, lowering = lower(graph, mesh, case, devices, [u, n, i])
        assert lowering.counters.collectives == []


def test_random_ops_with_other_seeds_or_lowering_seeds_differ(
    devices: list[str],
) -> None:
    graph, mesh = _graph()
    a = mtf.random_uniform(mesh, SHAPE, seed=1)
    b = mtf.random_uniform(mesh, SHAPE, seed=2)
    c = mtf.random_uniform(mesh, SHAPE)  # seeded from its own name
    d = mtf.random_uniform(mesh, SHAPE)
    impl = SPLIT_2D.impl(devices)
    first = mtf.Lowering(graph, {mesh: impl}, seed=0)
    second = mtf.Lowering(graph, {mesh: impl}, seed=1)
    va, vb, vc, vd = (first.export_to_tf_tensor(t).numpy() for t in (a, b, c, d))
    assert len({v.tobytes() for v in (va, vb, vc, vd)}) == 4
    assert not np.array_equal(va, second.export_to_tf_tensor(a).numpy())
    again = mtf.Lowering(graph, {mesh: impl}, seed=0)
    np.testing.assert_array_equal(va, again.export_to_tf_tensor(a).numpy())
    assert a.operation.stateful and a.operation.attrs()["seed"] == 1
    json.dumps(c.operation.attrs())


def test_dropout_mask_and_gradient_do_not_depend_on_layout(
    devices: list[str],
) -> None:
    graph, mesh = _graph()
    xv = np.random.RandomState(0).uniform(1.0, 2.0, (8, 8)).astype(np.float32)
    x = mtf.import_tf_tensor(mesh, xv, SHAPE)
    y = mtf.dropout(x, rate=0.25, seed=3)
    upstream = upstream_for(y, np.random.RandomState(1))
    (dx,) = mtf.gradients([weighted_sum(y, upstream)], [x])
    got_y, got_dx = assert_same_under_layouts(graph, mesh, devices, [y, dx])
    kept = got_y != 0
    assert 0.55 < kept.mean() < 0.95
    np.testing.assert_allclose(got_y[kept], xv[kept] / 0.75, rtol=1e-6)
    # the gradient goes through the very same mask
    np.testing.assert_allclose(got_dx, np.where(kept, upstream / 0.75, 0.0), rtol=1e-6)


def test_dropout_noise_shape_shares_the_mask_along_missing_dims(
    devices: list[str],
) -> None:
    graph, mesh = _graph()
    x = mtf.ones(mesh, SHAPE)
    y = mtf.dropout(x, keep_prob=0.5, noise_shape="hidden:8", seed=11)
    assert y.shape == x.shape
    (got,) = assert_same_under_layouts(graph, mesh, devices, [y])
    assert (got == got[0:1, :]).all()
    assert set(np.unique(got)) <= {0.0, 2.0}


def test_dropout_masks_change_per_compiled_step_but_not_per_layout(
    devices: list[str],
) -> None:
    steps = {}
    for case in (ONE_DEVICE, SPLIT_2D):
        graph, mesh = _graph()
        x = mtf.placeholder(mesh, SHAPE)
        y = mtf.dropout(x, keep_prob=0.5, seed=5)
        fn = mtf.compile_function(graph, {mesh: case.impl(devices)}, [x], [y])
        ones = np.ones((8, 8), np.float32)
        steps[case.name] = [fn(ones)[0], fn(ones)[0]]
    one, two_d = steps[ONE_DEVICE.name], steps[SPLIT_2D.name]
    assert not np.array_equal(one[0], one[1])
    np.testing.assert_array_equal(one[0], two_d[0])
    np.testing.assert_array_equal(one[1], two_d[1])


def test_a_step_resumed_at_step_n_under_another_layout_draws_the_same_masks(
    devices: list[str],
) -> None:
    # A checkpoint holds variables, not the step counter: the resumed step is
    # told its step number (random_step) and then draws what the
    # uninterrupted run drew.
    masks = {}
    for case in (ONE_DEVICE, SPLIT_2D):
        graph, mesh = _graph()
        x = mtf.placeholder(mesh, SHAPE)
        y = mtf.dropout(x, keep_prob=0.5, seed=5)
        masks[case.name] = mtf.compile_function(
            graph, {mesh: case.impl(devices)}, [x], [y]
        )
    uninterrupted, resumed = masks[ONE_DEVICE.name], masks[SPLIT_2D.name]
    ones = np.ones((8, 8), np.float32)
    drawn = [uninterrupted(ones)[0] for _ in range(3)]
    assert uninterrupted.random_step == 3
    resumed.random_step = 2
    np.testing.assert_array_equal(resumed(ones)[0], drawn[2])
    assert resumed.random_step == 3
    resumed.random_step = 0
    np.testing.assert_array_equal(resumed(ones)[0], drawn[0])
    with pytest.raises(mtf.LoweringError, match="random_step -1 is negative"):
        resumed.random_step = -1
    with pytest.raises(mtf.LoweringError, match="random_step 2.0 is not an integer"):
        resumed.random_step = 2.0  # type: ignore[assignment]
    # The SPMD backend keeps the same counter.
    graph, mesh = _graph()
    x = mtf.placeholder(mesh, SHAPE)
    y = mtf.dropout(x, keep_prob=0.5, seed=5)
    impl = mtf.SimdMeshImpl("data:2;model:2", "batch:data;hidden:model", devices[:4])
    spmd = mtf.compile_function(graph, {mesh: impl}, [x], [y])
    spmd.random_step = 1
    np.testing.assert_array_equal(spmd(ones)[0], drawn[1])


def test_dropout_is_identity_when_keeping_everything_or_not_training() -> None:
    graph, mesh = _graph()
    x = mtf.ones(mesh, SHAPE)
    assert mtf.dropout(x, keep_prob=1.0) is x
    assert mtf.dropout(x, rate=0.5, is_training=False) is x
    assert mtf.dropout(x, rate=0.0) is x
    # Mesh TensorFlow's positional order: dropout(x, is_training, keep_prob)
    assert mtf.dropout(x, False, 0.5) is x
    assert mtf.dropout(x, True, 1.0) is x
    assert mtf.dropout(x, True, 0.5).shape == x.shape


def test_random_ops_reject_bad_input() -> None:
    graph, mesh = _graph()
    x = mtf.ones(mesh, SHAPE)
    with pytest.raises(ValueError, match="exactly one of keep_prob and rate"):
        mtf.dropout(x)
    with pytest.raises(ValueError, match="exactly one of keep_prob and rate"):
        mtf.dropout(x, keep_prob=0.5, rate=0.5)
    with pytest.raises(ValueError, match=r"keep_prob 0.0 must be in \(0, 1\]"):
        mtf.dropout(x, keep_prob=0.0)
    with pytest.raises(ValueError, match=r"is_training is 0.1; expected True or Fal"):
        mtf.dropout(x, 0.1)
    with pytest.raises(mtf.ShapeError, match="noise_shape dimension seq:4"):
        mtf.dropout(x, rate=0.1, noise_shape="seq:4")
    with pytest.raises(ValueError, match="maxval 0.0 must be greater than minval 1.0"):
        mtf.random_uniform(mesh, SHAPE, minval=1.0, maxval=0.0)
    with pytest.raises(mtf.DTypeError, match="int32 needs maxval"):
        mtf.random_uniform(mesh, SHAPE, dtype=mtf.int32)
    with pytest.raises(mtf.DTypeError, match="not a floating dtype"):
        mtf.random_normal(mesh, SHAPE, dtype=mtf.int32)
    with pytest.raises(ValueError, match="stddev -1.0 must be >= 0"):
        mtf.random_normal(mesh, SHAPE, stddev=-1.0)
    with pytest.raises(ValueError, match="seed 'a' is not an integer"):
        mtf.random_normal(mesh, SHAPE, seed="a")
