"""The scale search's lower bound on a pipelined step
(layout_planner.scale_bounds) never exceeds what a trial on that mesh costs,
and is tighter than the model's flops at peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from cost_models.profiles import get_hardware
from layout_planner.choices import model_flops, plan_transformer
from layout_planner.scale_bounds import StepBound, flops_bound_s
from mtf_core.models import TransformerConfig, build_encoder_decoder, build_lm

ROOT = Path(__file__).resolve().parent.parent
CFG = TransformerConfig(
    num_layers=12, d_model=256, heads=8, d_kv=32, d_ff=1024, vocab=1024,
    length=128, batch=32, activation_dtype="bfloat16",
)  # fmt: skip


@pytest.mark.parametrize("memory_mib", [None, 30])
def test_bound_is_below_every_trial_of_the_exhaustive_search(memory_mib):
    hw = get_hardware("h100-nvlink-ib")
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True)
    bound = StepBound(cfg, build_lm, "adam", hw, model_flops(cfg))
    assert bound.roofline
    limit = None if memory_mib is None else memory_mib * 2**20
    plan = plan_transformer(
        CFG, 8, hardware=hw, memory_limit=limit, exhaustive=True,
        stages=[1, 2, 4], time_limit_s=30.0,
    )  # fmt: skip
    priced = [t for t in plan.trials if t.step_time_s is not None]
    assert len(priced) >= 8
    tighter = 0
    for t in priced:
        c = t.choice
        b = bound.bound_s(c.stages, c.data, c.tensor, c.micro_batches)
        # Every trial, recomputing or not, fitting or not, costs at least it.
        assert 0 < b <= t.step_time_s, (c, b, t.step_time_s)
        old = flops_bound_s(
            model_flops(cfg), hw, c.stages * c.data * c.tensor,
            c.micro_batches, c.stages,
        )  # fmt: skip
        tighter += b > old
    assert tighter == len(priced)


def test_bound_holds_for_the_encoder_decoder():
    hw = get_hardware("tpu-v4")
    cfg = CFG.replace(num_layers=4, shardable_weights=True, shardable_slots=True)
    flops = model_flops(cfg, encoder_decoder=True)
    bound = StepBound(cfg, build_encoder_decoder, "adam", hw, flops)
    plan = plan_transformer(
        cfg, 8, hardware=hw, encoder_decoder=True, exhaustive=True,
        stages=[1, 2], time_limit_s=30.0,
    )  # fmt: skip
    for t in plan.trials:
        if t.step_time_s is not None:
            c = t.choice
            b = bound.bound_s(c.stages, c.data, c.tensor, c.micro_batches)
            assert b <= t.step_time_s


def test_calibrated_profiles_fall_back_to_the_flops_bound():
    # A calibrated profile prices ops by per-class rates with per-op overheads,
    # not by the roofline: the bound is the model's flops at peak.
    hw = get_hardware(str(ROOT / "bench" / "profiles" / "ci-host-cpu8.json"))
    assert hw.rates is not None
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True)
    flops = model_flops(cfg)
    bound = StepBound(cfg, build_lm, "adam", hw, flops)
    assert not bound.roofline
    assert bound.bound_s(2, 2, 2, 16) == flops_bound_s(flops, hw, 8, 16, 2)
