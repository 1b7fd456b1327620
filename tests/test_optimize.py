"""Optimizers: updates match NumPy references, slots are laid-out variables."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core import optimize
from mtf_core.errors import ConfigError, GraphError

B, H, C = 4, 8, 6
X = np.random.RandomState(0).randn(B, H).astype(np.float32)
W0 = (np.random.RandomState(1).randn(H, C) * 0.5).astype(np.float32)


def _build(opt: optimize.Optimizer):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    b, h, c = (
        mtf.Dimension("batch", B),
        mtf.Dimension("hidden", H),
        mtf.Dimension("classes", C),
    )
    x = mtf.placeholder(mesh, [b, h], name="x")
    w = mtf.get_variable(mesh, "w", [h, c], initializer=lambda s, d: W0)
    loss = mtf.reduce_mean(mtf.square(mtf.einsum([x, w], output_shape=[b, c])))
    grads = mtf.gradients([loss], [w])
    updates = opt.apply_grads(grads, graph.trainable_variables)
    return graph, mesh, x, loss, updates


def _run(opt: optimize.Optimizer, devices, steps: int, shape="all:1", rules=""):
    graph, mesh, x, loss, updates = _build(opt)
    n = mtf.convert_to_shape(shape).size
    impl = mtf.PlacementMeshImpl(shape, rules, devices[:n])
    fn = mtf.compile_function(graph, {mesh: impl}, [x], [loss], updates)
    losses = [float(fn(X)[0]) for _ in range(steps)]
    return losses, fn.variables.to_dict(), graph, fn


def _grad(w: np.ndarray) -> np.ndarray:
    y = X @ w
    return (2.0 / (B * C)) * X.T @ y


@pytest.mark.tf
def test_sgd_step_matches_numpy(devices):
    _, values, _, _ = _run(optimize.SgdOptimizer(0.1), devices, 2)
    w = W0.copy()
    for _ in range(2):
        w = w - 0.1 * _grad(w)
    np.testing.assert_allclose(values["w"], w, rtol=1e-5, atol=1e-6)
    assert int(values["global_step"]) == 2


@pytest.mark.tf
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_matches_numpy(devices, nesterov):
    opt = optimize.MomentumOptimizer(0.05, momentum=0.9, nesterov=nesterov)
    _, values, _, _ = _run(opt, devices, 3)
    w, m = W0.copy(), np.zeros_like(W0)
    for _ in range(3):
        g = _grad(w)
        m = 0.9 * m + g
        w = w - 0.05 * (g + 0.9 * m if nesterov else m)
    np.testing.assert_allclose(values["w"], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["w/momentum"], m, rtol=1e-5, atol=1e-6)


@pytest.mark.tf
def test_adam_with_bias_correction_and_weight_decay_matches_numpy(devices):
    opt = optimize.AdamWeightDecayOptimizer(
        0.01, beta1=0.8, beta2=0.95, epsilon=1e-6, weight_decay_rate=0.1
    )
    _, values, _, _ = _run(opt, devices, 3)
    w, m, v = W0.copy(), np.zeros_like(W0), np.zeros_like(W0)
    for t in range(1, 4):
        g = _grad(w)
        m = 0.8 * m + 0.2 * g
        v = 0.95 * v + 0.05 * g * g
        lr_t = 0.01 * np.sqrt(1 - 0.95**t) / (1 - 0.8**t)
        w = w - lr_t * m / (np.sqrt(v) + 1e-6) - 0.01 * 0.1 * w
    np.testing.assert_allclose(values["w/adam_m"], m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(values["w/adam_v"], v, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(values["w"], w, rtol=1e-5, atol=1e-6)


@pytest.mark.tf
def test_adafactor_factored_second_moments_match_numpy(devices):
    opt = optimize.AdafactorOptimizer()  # relative step, parameter scale, clipping
    _, values, graph, _ = _run(opt, devices, 2)
    # hidden (8) is the largest dim, classes (6) the second: vr keeps classes.
    shapes = {v.name: v.shape.to_integer_list() for v in graph.all_variables}
    assert shapes["w/adafactor_vr"] == [C] and shapes["w/adafactor_vc"] == [H]
    w = W0.astype(np.float64)
    vr, vc = np.zeros(C), np.zeros(H)
    for t in range(1, 3):
        g = _grad(w.astype(np.float32)).astype(np.float64)
        d = 1 - t**-0.8
        gsq = g * g + 1e-30
        vr = d * vr + (1 - d) * gsq.mean(axis=0)
        vc = d * vc + (1 - d) * gsq.mean(axis=1)
        x = g / np.sqrt(vr[None, :] / vr.mean()) / np.sqrt(vc[:, None])
        x = x / max(np.sqrt((x * x).mean()) / 1.0, 1.0)
        lr = min(1 / np.sqrt(t), 0.01) * max(np.sqrt((w * w).mean()), 1e-3)
        w = w - lr * x
    np.testing.assert_allclose(values["w/adafactor_vr"], vr, rtol=1e-4)
    np.testing.assert_allclose(values["w/adafactor_vc"], vc, rtol=1e-4)
    np.testing.assert_allclose(values["w"], w, rtol=1e-4, atol=1e-6)


@pytest.mark.tf
def test_slot_variables_are_laid_out_like_their_parameters(devices):
    opt = optimize.AdamWeightDecayOptimizer(0.01)
    _, _, graph, fn = _run(opt, devices, 1, shape="all:4", rules="hidden:all")
    names = {v.name: v for v in graph.all_variables}
    assert {v.name for v in graph.trainable_variables} == {"w"}
    for slot in ("w/adam_m", "w/adam_v"):
        assert not names[slot].trainable
        slices = fn.variables.slices(names[slot])
        assert len(slices) == 4
        assert [list(s.shape) for s in slices] == [[H // 4, C]] * 4


@pytest.mark.tf
@pytest.mark.parametrize(
    "make",
    [
        lambda: optimize.AdamWeightDecayOptimizer(0.01, weight_decay_rate=0.01),
        lambda: optimize.AdafactorOptimizer(beta1=0.9),
    ],
)
def test_optimizer_updates_do_not_depend_on_layout(devices, make):
    one, v1, _, _ = _run(make(), devices, 3)
    two, v2, _, _ = _run(make(), devices, 3, "rows:2;cols:2", "batch:rows;hidden:cols")
    np.testing.assert_allclose(one, two, rtol=1e-5)
    np.testing.assert_allclose(v1["w"], v2["w"], rtol=1e-5, atol=1e-7)


@pytest.mark.tf
def test_clip_by_global_norm_scales_to_the_limit(devices):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    a = mtf.constant(mesh, np.array([3.0, 0.0], np.float32), "i:2")
    b = mtf.constant(mesh, np.array([[4.0]], np.float32), "j:1,k:1")
    (ca, cb), norm = optimize.clip_by_global_norm([a, b], 1.0)
    impl = mtf.PlacementMeshImpl("all:1", "", devices[:1])
    low = mtf.Lowering(graph, {mesh: impl})
    assert float(low.export_to_tf_tensor(norm)) == pytest.approx(5.0)
    np.testing.assert_allclose(low.export_to_tf_tensor(ca).numpy(), [0.6, 0.0])
    np.testing.assert_allclose(low.export_to_tf_tensor(cb).numpy(), [[0.8]])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: optimize.SgdOptimizer(-1.0), "learning_rate must be a positive"),
        (lambda: optimize.MomentumOptimizer(0.1, momentum=1.5), "momentum must be in"),
        (lambda: optimize.AdamWeightDecayOptimizer(0.1, beta2=1.0), "beta2"),
        (lambda: optimize.AdamWeightDecayOptimizer(0.1, weight_decay_rate=-1), "-1"),
        (lambda: optimize.make_optimizer("lion"), "'lion'"),
    ],
)
def test_bad_hyperparameters_raise_config_errors_naming_the_value(make, message):
    with pytest.raises(ConfigError, match=message) as info:
        make()
    assert isinstance(info.value, ValueError)


def test_apply_grads_rejects_all_none_and_mismatched_gradients():
    graph, mesh, *_ = _build(optimize.SgdOptimizer(0.1))
    w = graph.trainable_variables[0]
    with pytest.raises(GraphError, match="every gradient is None"):
        optimize.SgdOptimizer(0.1).apply_grads([None], [w])
    with pytest.raises(GraphError, match="1 variables"):
        optimize.SgdOptimizer(0.1).apply_grads([None, None], [w])
    wrong = mtf.zeros(mesh, "hidden:8")
    with pytest.raises(GraphError, match="has shape"):
        optimize.SgdOptimizer(0.1).apply_grads([wrong], [w])


def test_global_step_is_shared_and_counted_once_per_apply():
    graph, mesh, *_ = _build(optimize.SgdOptimizer(0.1))
    step = optimize.global_step(mesh)
    assert step.operation in graph.all_variables
    assert step.operation not in graph.trainable_variables
    assert optimize.global_step(mesh) is step
    increments = [
        op for op in graph.operations if getattr(op, "variable", None) is step.operation
    ]
    assert len(increments) == 1
