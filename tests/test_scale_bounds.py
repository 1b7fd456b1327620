"""The scale search's lower bound on a pipelined step
(layout_planner.scale_bounds) never exceeds what a trial on that mesh costs."""

from __future__ import annotations

import pytest

from cost_models.profiles import get_hardware
from layout_planner.choices import model_flops, plan_transformer
from layout_planner.scale_bounds import flops_bound_s
from mtf_core.models import TransformerConfig

CFG = TransformerConfig(
    num_layers=12, d_model=256, heads=8, d_kv=32, d_ff=1024, vocab=1024,
    length=128, batch=32, activation_dtype="bfloat16",
)  # fmt: skip


def _bound(cfg, hw, choice, encoder_decoder=False):
    c = choice
    return flops_bound_s(
        model_flops(cfg, encoder_decoder), hw, c.stages * c.data * c.tensor,
        c.micro_batches, c.stages,
    )  # fmt: skip


@pytest.mark.parametrize("memory_mib", [None, 30])
def test_bound_is_below_every_trial_of_the_exhaustive_search(memory_mib):
    hw = get_hardware("h100-nvlink-ib")
    limit = None if memory_mib is None else memory_mib * 2**20
    plan = plan_transformer(
        CFG, 8, hardware=hw, memory_limit=limit, exhaustive=True,
        stages=[1, 2, 4], time_limit_s=30.0,
    )  # fmt: skip
    priced = [t for t in plan.trials if t.step_time_s is not None]
    assert len(priced) >= 8
    for t in priced:
        # Every trial, recomputing or not, fitting or not, costs at least it.
        b = _bound(CFG, hw, t.choice)
        assert 0 < b <= t.step_time_s, (t.choice, b, t.step_time_s)


def test_bound_holds_for_the_encoder_decoder():
    hw = get_hardware("tpu-v4")
    cfg = CFG.replace(num_layers=4)
    plan = plan_transformer(
        cfg, 8, hardware=hw, encoder_decoder=True, exhaustive=True,
        stages=[1], tensor=[1, 2, 4], time_limit_s=30.0,
    )  # fmt: skip
    priced = [t for t in plan.trials if t.step_time_s is not None]
    assert priced
    for t in priced:
        assert 0 < _bound(cfg, hw, t.choice, True) <= t.step_time_s


def test_the_bubble_stretches_the_bound():
    hw = get_hardware("h100-nvlink-ib")
    flat = flops_bound_s(1e15, hw, 8, 16, 1)
    assert flat == pytest.approx(1e15 / (8 * hw.peak_flops))
    # 16 micro-batches through 4 stages: 19 slots for 16 micro-batches' work.
    assert flops_bound_s(1e15, hw, 8, 16, 4) == pytest.approx(flat * 19 / 16)
