"""``mesh_tensorflow.optimize``: Mesh TF's optimizer constructors and
defaults on mtf_core's update rules, configurable with gin."""

from __future__ import annotations

import numpy as np
import pytest
from services import require_module
from test_optimize import W0, _grad, _run

from mtf_core.compat import optimize as mopt
from mtf_core.errors import ConfigError

pytestmark = pytest.mark.tf


def test_mesh_tf_adam_has_no_bias_correction_and_decays_every_variable(devices):
    # Mesh TF's positional order: learning_rate, weight_decay_rate.
    opt = mopt.AdamWeightDecayOptimizer(0.01, 0.1, beta_1=0.8, beta_2=0.95)
    assert opt.epsilon == 1e-6 and not opt.bias_correction
    _, values, _, _ = _run(opt, devices, 3)
    w, m, v = W0.copy(), np.zeros_like(W0), np.zeros_like(W0)
    for _ in range(3):
        g = _grad(w)
        m = 0.8 * m + 0.2 * g
        v = 0.95 * v + 0.05 * g * g
        w = w - 0.01 * (m / (np.sqrt(v) + 1e-6) + 0.1 * w)
    np.testing.assert_allclose(values["w"], w, rtol=1e-5, atol=1e-6)


def test_mesh_tf_adafactor_factors_only_dims_of_min_size(devices):
    # w is 8x6: below the default min_dim_size_to_factor (128), so one full v.
    _, values, _, _ = _run(mopt.AdafactorOptimizer(), devices, 1)
    # Slots named as Mesh TF 0.1.21 names them ({var}_slot_v, ...).
    assert "w_slot_v" in values and "w_slot_vr" not in values
    _, values, _, _ = _run(
        mopt.AdafactorOptimizer(min_dim_size_to_factor=4), devices, 1
    )
    # Row statistics drop the largest dim (hidden:8), column ones the other.
    assert values["w_slot_vr"].shape == (6,)
    assert values["w_slot_vc"].shape == (8,)


def test_mesh_tf_optimizers_name_their_slots_as_mesh_tf_does(devices):
    """Mesh TF 0.1.21's slot names (its optimize.py), so a checkpoint's slots
    restore by name: Adafactor ``{var}_slot_v`` / ``_slot_m``, Momentum
    ``{var}_momentum_v``, Adam ``{var}/adam_m``; mtf_core's own keep theirs."""
    from mtf_core import optimize as core

    slots = {
        mopt.AdafactorOptimizer(beta1=0.9): {"w_slot_v", "w_slot_m"},
        mopt.MomentumOptimizer(0.1, 0.9): {"w_momentum_v"},
        mopt.AdamWeightDecayOptimizer(0.01): {"w/adam_m", "w/adam_v"},
        core.AdafactorOptimizer(beta1=0.9): {
            "w/adafactor_vr",
            "w/adafactor_vc",
            "w/adafactor_m",
        },  # fmt: skip
        core.MomentumOptimizer(0.1, 0.9): {"w/momentum"},
    }
    for opt, want in slots.items():
        _, values, _, _ = _run(opt, devices, 1)
        assert set(values) - {"w", "global_step"} == want, type(opt)


def test_mesh_tf_adafactor_constant_decay_rate_matches_numpy(devices):
    opt = mopt.AdafactorOptimizer(
        learning_rate=0.1, decay_rate=0.5, multiply_by_parameter_scale=False,
        clipping_threshold=None,
    )  # fmt: skip
    _, values, _, _ = _run(opt, devices, 2)
    w, v = W0.copy(), np.zeros_like(W0)
    for _ in range(2):
        g = _grad(w)
        v = 0.5 * v + 0.5 * (g * g + 1e-30)
        w = w - 0.1 * g / np.sqrt(v)
    np.testing.assert_allclose(values["w"], w, rtol=1e-4, atol=1e-6)


def test_unsupported_adafactor_options_are_a_clear_error():
    with pytest.raises(ConfigError, match="stacked_dim_names=\\['layers'\\]"):
        mopt.AdafactorOptimizer(stacked_dim_names=["layers"])


def test_optimizers_are_gin_configurable_under_mesh_tf_names():
    gin = require_module("gin", "compat")
    import mtf_core.compat  # noqa: F401  (registers them on import)

    @gin.configurable
    def make(optimizer):
        return optimizer()

    with gin.unlock_config():
        gin.parse_config(
            "make.optimizer = @optimize.AdafactorOptimizer\n"
            "optimize.AdafactorOptimizer.beta1 = 0.5"
        )
    try:
        opt = make()
    finally:
        gin.clear_config()
    assert isinstance(opt, mopt.AdafactorOptimizer) and opt.beta1 == 0.5
