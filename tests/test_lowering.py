"""Lowering onto logical CPUs: the placement mesh impl and its collectives,
counters, lazy allreduces, compiled steps and checkpoints across layouts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from layout_cases import (
    BATCH_SPLIT,
    LAYOUTS,
    MODEL_SPLIT,
    ONE_DEVICE,
    SPLIT_2D,
    LayoutCase,
    lower,
)

import mtf_core as mtf
from mtf_core.comm import layout_change_collectives
from mtf_core.lowering.counters import Counters
from mtf_core.lowering.placement import LaidOutTensor

pytestmark = pytest.mark.tf


def _mesh() -> tuple[mtf.Graph, mtf.Mesh]:
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "mesh")


def _values(laid: LaidOutTensor) -> list[np.ndarray]:
    return [s.numpy() for s in laid.slices]


@pytest.fixture
def impl(devices: list[str]) -> mtf.PlacementMeshImpl:
    """A 2x4 mesh (pnum = 4 * x + y) recording into fresh counters."""
    impl = mtf.PlacementMeshImpl("x:2;y:4", "", devices)
    impl.counters = Counters()
    return impl


def _pnums(impl: mtf.PlacementMeshImpl, shape: list[int]) -> LaidOutTensor:
    """Each device's slice filled with its pnum."""
    return impl.slicewise(
        lambda p: tf.fill(shape, tf.cast(p, tf.float32)), impl.laid_out_pnum()
    )


# -- the placement mesh impl ---------------------------------------------------


def test_each_slice_lives_on_its_own_device(impl: mtf.PlacementMeshImpl) -> None:
    laid = impl.laid_out_pnum()
    assert [s.device.split("/")[-1] for s in laid.slices] == [
        f"device:CPU:{p}" for p in range(8)
    ]
    assert _values(laid) == list(range(8))
    assert _values(impl.laid_out_pcoordinate(1)) == [0, 1, 2, 3] * 2


def test_processor_coordinates_round_trip(impl: mtf.PlacementMeshImpl) -> None:
    for p in range(8):
        c = impl.pnum_to_processor_coordinates(p)
        assert c == [p // 4, p % 4]
        assert impl.processor_coordinates_to_pnum(c) == p
    assert impl.processor_groups([1]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert impl.processor_groups([0]) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_logical_device_objects_are_accepted(devices: list[str]) -> None:
    logical = tf.config.list_logical_devices("CPU")[:2]
    impl = mtf.PlacementMeshImpl("m:2", "a:m", logical)
    assert impl.devices == devices[:2]


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: c.name)
def test_import_slices_and_export_reassembles_every_layout(
    devices: list[str], case: LayoutCase
) -> None:
    impl = case.impl(devices)
    shape = mtf.convert_to_shape("batch:8,k:3,hidden:4")
    full = np.arange(96, dtype=np.float32).reshape(8, 3, 4)
    laid = impl.import_tf_tensor(full, shape)
    assert [list(s.shape) for s in laid.slices] == [impl.slice_shape(shape)] * len(
        impl.devices
    )
    for p, s in enumerate(laid.slices):
        b = impl.slice_begin(shape, p)
        n = impl.slice_shape(shape)
        want = full[b[0] : b[0] + n[0], :, b[2] : b[2] + n[2]]
        np.testing.assert_array_equal(s.numpy(), want)
    np.testing.assert_array_equal(impl.export_to_tf_tensor(laid, shape), full)


# -- collectives -----------------------------------------------------------------


def test_allreduce_sums_maxes_and_mins_within_groups(
    impl: mtf.PlacementMeshImpl,
) -> None:
    x = _pnums(impl, [2])
    assert [v[0] for v in _values(impl.allreduce(x, [1]))] == [6] * 4 + [22] * 4
    assert [v[0] for v in _values(impl.allreduce(x, [0, 1]))] == [28] * 8
    maxes = _values(impl.allreduce(x, [0], "MAX"))
    assert [v[0] for v in maxes] == [4, 5, 6, 7] * 2
    mins = _values(impl.allreduce(x, [1], "MIN"))
    assert [v[0] for v in mins] == [0] * 4 + [4] * 4
    recs = impl.counters.collectives
    assert [(r.kind, r.mesh_axes, r.reduction, r.bytes_per_device) for r in recs] == [
        ("allreduce", ("y",), "SUM", 8),
        ("allreduce", ("x", "y"), "SUM", 8),
        ("allreduce", ("x",), "MAX", 8),
        ("allreduce", ("y",), "MIN", 8),
    ]
    # The Reduction enum and Mesh TF's strings are the same reduction.
    from mtf_core.comm import Reduction

    by_enum = _values(impl.allreduce(x, [0], Reduction.MAX))
    assert [v[0] for v in by_enum] == [v[0] for v in maxes]
    assert impl.counters.collectives[-1].reduction is Reduction.MAX


def test_an_unknown_reduction_is_refused_naming_it_and_the_known_ones(
    impl: mtf.PlacementMeshImpl,
) -> None:
    with pytest.raises(
        mtf.LoweringError, match=r"unknown reduction 'PROD'; expected one of SUM, MAX"
    ):
        impl.allreduce(_pnums(impl, [2]), [1], "PROD")


def test_allconcat_gathers_slices_in_coordinate_order(
    impl: mtf.PlacementMeshImpl,
) -> None:
    out = _values(impl.allconcat(_pnums(impl, [1, 2]), 1, 0))
    assert [v[:, 0].tolist() for v in out] == [[0, 1, 2, 3]] * 4 + [[4, 5, 6, 7]] * 4
    assert impl.counters["allconcat/y"] == 8


def test_alltoall_swaps_which_dim_is_split(impl: mtf.PlacementMeshImpl) -> None:
    # device p holds row p of a [8, 4] matrix whose rows are split over y
    x = impl.slicewise(
        lambda p: tf.reshape(tf.cast(p * 10, tf.float32) + tf.range(4.0), [1, 4]),
        impl.laid_out_pnum(),
    )
    out = _values(impl.alltoall(x, 1, split_axis=1, concat_axis=0))
    for p, v in enumerate(out):
        x_, y_ = divmod(p, 4)
        want = [[10.0 * (4 * x_ + i) + y_] for i in range(4)]
        np.testing.assert_array_equal(v, want)
    assert [(r.kind, r.mesh_axes) for r in impl.counters.collectives] == [
        ("alltoall", ("y",))
    ]


def test_allsplit_slices_locally_without_communication(
    impl: mtf.PlacementMeshImpl,
) -> None:
    x = impl.slicewise(lambda: tf.range(8.0))
    out = _values(impl.allsplit(x, 1, 0))
    assert [v.tolist() for v in out] == [[2.0 * y, 2.0 * y + 1] for y in range(4)] * 2
    assert impl.counters.collectives == []


@pytest.mark.parametrize("wrap", [True, False])
def test_shift_by_n_processors_moves_slices_along_one_axis(
    impl: mtf.PlacementMeshImpl, wrap: bool
) -> None:
    out = [
        v[0] for v in _values(impl.shift_by_n_processors(_pnums(impl, [1]), 1, 1, wrap))
    ]
    if wrap:
        assert out == [3, 0, 1, 2, 7, 4, 5, 6]
    else:
        assert out == [0, 0, 1, 2, 0, 4, 5, 6]
    assert [
        (r.kind, r.mesh_axes, r.bytes_per_device) for r in impl.counters.collectives
    ] == [("shift", ("y",), 4)]


def _layouts_of_three_dims() -> list[mtf.TensorLayout]:
    out = []
    for axes in itertools.product([None, 0, 1], repeat=3):
        used = [m for m in axes if m is not None]
        if len(used) == len(set(used)):
            out.append(mtf.TensorLayout(axes))
    return out


def test_every_layout_change_keeps_values_and_records_its_plan(
    impl: mtf.PlacementMeshImpl,
) -> None:
    """All 169 moves between the 13 layouts of a:8,b:8,c:4 on x:2,y:4."""
    shape = mtf.convert_to_shape("a:8,b:8,c:4")
    full = np.arange(256, dtype=np.float32).reshape(8, 8, 4)

    def laid_as(layout: mtf.TensorLayout) -> list[np.ndarray]:
        out = []
        for p in range(8):
            c = impl.pnum_to_processor_coordinates(p)
            idx = tuple(
                slice(None)
                if m is None
                else slice(
                    c[m] * d.size // impl.shape[m].size,
                    (c[m] + 1) * d.size // impl.shape[m].size,
                )
                for d, m in zip(shape, layout)
            )
            out.append(full[idx])
        return out

    layouts = _layouts_of_three_dims()
    for old, new in itertools.product(layouts, layouts):
        impl.counters = Counters()
        x = LaidOutTensor([tf.constant(s) for s in laid_as(old)])
        got = _values(impl.apply_layout_change(x, shape, old, new))
        for a, b in zip(got, laid_as(new)):
            np.testing.assert_array_equal(a, b, err_msg=f"{old} -> {new}")
        planned = layout_change_collectives(impl.ctx, shape, "float32", old, new)
        recorded = [
            (r.kind, r.mesh_axes, r.bytes_per_device) for r in impl.counters.collectives
        ]
        assert recorded == [(s.kind, s.mesh_axes, s.bytes_per_device) for s in planned]


# -- the Lowering ------------------------------------------------------------------


def test_lowering_only_lowers_what_targets_need(devices: list[str]) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8")
    never_fed = mtf.placeholder(mesh, "batch:8")
    y = x * 2.0
    z = never_fed + 1.0
    impl = BATCH_SPLIT.impl(devices)
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds={x: np.arange(8.0)}, targets=[y])
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(y), np.arange(8.0) * 2)
    assert len(lowering.lowered_operation(y.operation).slices) == 4
    assert z not in lowering.tensors
    with pytest.raises(mtf.LoweringError, match="has not been lowered"):
        lowering.export_to_tf_tensor(z)


def test_lowered_assign_updates_the_variable_slices(devices: list[str]) -> None:
    graph, mesh = _mesh()
    w = mtf.get_variable(mesh, "w", "batch:8", initializer=lambda s, d: np.ones(s))
    step = mtf.assign_add(w, mtf.ones(mesh, "batch:8") * 2.0)
    lowering = mtf.Lowering(graph, {mesh: BATCH_SPLIT.impl(devices)})
    updates = lowering.lowered_operation(step)
    assert len(updates) == 4  # one assign per device
    np.testing.assert_array_equal(lowering.variables.export(w), np.full(8, 3.0))
    assert [v.device.split("/")[-1] for v in lowering.variable_slices(w)] == [
        f"device:CPU:{p}" for p in range(4)
    ]


def test_flops_per_device_divide_by_the_devices_splitting_the_op(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,hidden:16")
    w = mtf.placeholder(mesh, "hidden:16,out:4")
    y = mtf.einsum([x, w], output_shape="batch:8,out:4")
    feeds = {x: np.ones((8, 16), np.float32), w: np.ones((16, 4), np.float32)}
    full = 2 * 8 * 16 * 4
    for case, ways in [
        (ONE_DEVICE, 1),
        (BATCH_SPLIT, 4),
        (MODEL_SPLIT, 4),
        (SPLIT_2D, 8),
    ]:
        _, lowering = lower(graph, mesh, case, devices, [y], feeds)
        assert lowering.counters.flops_per_device[y.operation.name] == full / ways


# -- counters and lazy allreduces ----------------------------------------------------


def _two_matmuls() -> tuple[mtf.Graph, mtf.Mesh, list[mtf.Tensor], dict]:
    graph, mesh = _mesh()
    rng = np.random.RandomState(0)
    ts, feeds = [], {}
    for shape in ["batch:8,hidden:8", "hidden:8,out:4"] * 3:
        t = mtf.placeholder(mesh, shape)
        feeds[t] = rng.randn(*t.shape.to_integer_list()).astype(np.float32)
        ts.append(t)
    return graph, mesh, ts, feeds


def test_sum_of_two_einsums_with_split_reduced_dims_allreduces_once(
    devices: list[str],
) -> None:
    graph, mesh, (a, b, c, d, _, _), feeds = _two_matmuls()
    y = mtf.matmul(a, b) + mtf.matmul(c, d)
    (got,), lowering = lower(graph, mesh, SPLIT_2D, devices, [y], feeds)
    want = feeds[a] @ feeds[b] + feeds[c] @ feeds[d]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    recs = lowering.counters.collectives
    assert [(r.kind, r.mesh_axes, r.bytes_per_device) for r in recs] == [
        ("allreduce", ("model",), 4 * 4 * 4)  # [batch:8/2, out:4] floats
    ]
    # Mesh TensorFlow's summed keys
    assert lowering.counters["allreduce"] == 64
    assert lowering.counters["allreduce/model"] == 64
    assert lowering.counters["allreduce/model/Einsum"] == 64
    assert "allreduce/data" not in lowering.counters


def test_add_n_of_einsums_allreduces_once(devices: list[str]) -> None:
    graph, mesh, ts, feeds = _two_matmuls()
    y = mtf.add_n([mtf.matmul(ts[i], ts[i + 1]) for i in (0, 2, 4)])
    (got,), lowering = lower(graph, mesh, MODEL_SPLIT, devices, [y], feeds)
    want = sum(feeds[ts[i]] @ feeds[ts[i + 1]] for i in (0, 2, 4))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len(lowering.counters.of_kind("allreduce")) == 1


def test_einsums_reduced_over_different_axes_are_not_fused(
    devices: list[str],
) -> None:
    graph, mesh = _mesh()
    x1 = mtf.placeholder(mesh, "batch:8,k:2")
    x2 = mtf.placeholder(mesh, "hidden:8,k:2")
    s = mtf.einsum([x1], output_shape="k:2") + mtf.einsum([x2], output_shape="k:2")
    rng = np.random.RandomState(1)
    feeds = {
        x1: rng.randn(8, 2).astype(np.float32),
        x2: rng.randn(8, 2).astype(np.float32),
    }
    (got,), lowering = lower(graph, mesh, SPLIT_2D, devices, [s], feeds)
    want = feeds[x1].sum(0) + feeds[x2].sum(0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    axes = sorted(r.mesh_axes for r in lowering.counters.collectives)
    assert axes == [("data",), ("model",)]


def test_a_pending_sum_is_reduced_once_before_a_nonlinear_use(
    devices: list[str],
) -> None:
    graph, mesh, (a, b, *_), feeds = _two_matmuls()
    p = mtf.matmul(a, b)
    y = mtf.tanh(p) + mtf.exp(p)  # two consumers, one allreduce
    (got,), lowering = lower(graph, mesh, MODEL_SPLIT, devices, [y], feeds)
    ab = feeds[a] @ feeds[b]
    np.testing.assert_allclose(got, np.tanh(ab) + np.exp(ab), rtol=1e-5, atol=1e-5)
    assert len(lowering.counters.of_kind("allreduce")) == 1


def _mnist_forward() -> tuple[mtf.Graph, mtf.Mesh, *tuple[mtf.Tensor, ...]]:
    """The MNIST network's forward pass: x, labels, logits and the mean loss."""
    graph, mesh = _mesh()
    x = mtf.placeholder(mesh, "batch:8,rows:4,cols:4")
    labels = mtf.placeholder(mesh, "batch:8,classes:4")
    w1 = mtf.get_variable(mesh, "w1", "rows:4,cols:4,hidden:8")
    w2 = mtf.get_variable(mesh, "w2", "hidden:8,classes:4")
    h = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8,hidden:8"))
    logits = mtf.einsum([h, w2], output_shape="batch:8,classes:4")
    loss = mtf.reduce_mean(
        mtf.layers.softmax_cross_entropy_with_logits(logits, labels, "classes")
    )
    return graph, mesh, x, labels, logits, loss


def _mnist_feeds(x: mtf.Tensor, labels: mtf.Tensor, seed: int = 0) -> dict:
    rng = np.random.RandomState(seed)
    return {
        x: rng.rand(8, 4, 4).astype(np.float32),
        labels: np.eye(4, dtype=np.float32)[rng.randint(0, 4, 8)],
    }


def test_batch_only_layout_of_the_mnist_forward_pass_communicates_nothing(
    devices: list[str],
) -> None:
    graph, mesh, x, labels, logits, _ = _mnist_forward()
    feeds = _mnist_feeds(x, labels)
    (want,), _ = lower(graph, mesh, ONE_DEVICE, devices, [logits], feeds)
    (got,), lowering = lower(graph, mesh, BATCH_SPLIT, devices, [logits], feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert lowering.counters.collectives == []
    assert "allreduce" not in lowering.counters


def test_communication_declared_by_ops_matches_what_lowering_records(
    devices: list[str],
) -> None:
    graph, mesh, x, labels, logits, loss = _mnist_forward()
    feeds = _mnist_feeds(x, labels)
    for case in LAYOUTS:
        _, lowering = lower(graph, mesh, case, devices, [logits, loss], feeds)
        ctx = case.impl(devices).ctx
        declared = [
            (op.name, s.kind, s.mesh_axes, s.reduction, s.bytes_per_device)
            for op in graph.operations
            for s in op.communication(ctx)
        ]
        recorded = [
            (r.op_name, r.kind, r.mesh_axes, r.reduction, r.bytes_per_device)
            for r in lowering.counters.collectives
        ]
        assert sorted(recorded) == sorted(declared), case.name


# -- compiled steps and checkpoints ---------------------------------------------------


def _training_step(case: LayoutCase, devices: list[str]) -> tuple:
    graph, mesh, x, labels, _, loss = _mnist_forward()
    w1, w2 = graph.trainable_variables
    g1, g2 = mtf.gradients([loss], [w1, w2])
    updates = [mtf.assign_sub(w1, g1 * 0.5), mtf.assign_sub(w2, g2 * 0.5)]
    fn = mtf.compile_function(
        graph,
        {mesh: case.impl(devices)},
        inputs=[x, labels],
        outputs=[loss],
        updates=updates,
    )
    return fn, (w1, w2)


def _batches(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for seed in range(n):
        rng = np.random.RandomState(seed)
        out.append(
            (
                rng.rand(8, 4, 4).astype(np.float32),
                np.eye(4, dtype=np.float32)[rng.randint(0, 4, 8)],
            )
        )
    return out


def test_compiled_steps_give_the_same_losses_under_every_layout(
    devices: list[str],
) -> None:
    batches = _batches(3)
    curves = {}
    for case in LAYOUTS:
        fn, (w1, _) = _training_step(case, devices)
        slices = fn.variables.slices(w1)
        before = fn.variables.export(w1)
        curves[case.name] = [fn(*b)[0] for b in batches]
        # updated in place: the same per-device tf.Variables, new values
        assert fn.variables.slices(w1) == slices
        assert len(slices) == case.n_devices
        assert not np.allclose(fn.variables.export(w1), before)
    reference = curves[ONE_DEVICE.name]
    assert len(set(np.round(reference, 4))) == 3  # each call took its own batch
    for name, curve in curves.items():
        np.testing.assert_allclose(curve, reference, rtol=1e-5, err_msg=name)


def test_compiled_step_records_its_collectives_when_traced(
    devices: list[str],
) -> None:
    fn, _ = _training_step(SPLIT_2D, devices)
    assert fn.trace() > 0
    assert fn.counters is not None
    assert fn.counters["allreduce/data"] > 0 and fn.counters["allreduce/model"] > 0


def test_checkpoint_from_one_layout_resumes_identically_under_another(
    devices: list[str],
) -> None:
    (b0, b1) = _batches(2)
    src, _ = _training_step(BATCH_SPLIT, devices)
    src(*b0)
    checkpoint = src.variables.to_dict()
    next_loss = src(*b1)[0]
    for case in (ONE_DEVICE, MODEL_SPLIT, SPLIT_2D):
        dst, (w1, _) = _training_step(case, devices)
        dst.variables.load_dict(checkpoint)
        np.testing.assert_array_equal(dst.variables.export(w1), checkpoint["w1"])
        np.testing.assert_allclose(dst(*b1)[0], next_loss, rtol=1e-6, err_msg=case.name)


def test_variable_store_rejects_bad_checkpoints(devices: list[str]) -> None:
    fn, (w1, _) = _training_step(MODEL_SPLIT, devices)
    good = fn.variables.to_dict()
    with pytest.raises(
        mtf.ShapeError, match=r"w1 has shape \[rows:4,cols:4,hidden:8\]"
    ):
        fn.variables.import_(w1, np.zeros((4, 4)))
    with pytest.raises(mtf.LoweringError, match=r"checkpoint lacks variables \['w2'\]"):
        fn.variables.load_dict({"w1": good["w1"]})
    with pytest.raises(mtf.LoweringError, match="has variable 'w3', which the graph"):
        fn.variables.load_dict({**good, "w3": good["w1"]})
    fn.variables.load_dict({"w1": good["w1"] * 2}, strict=False)
    np.testing.assert_allclose(fn.variables.export(w1), good["w1"] * 2)
