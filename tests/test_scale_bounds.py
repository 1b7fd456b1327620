"""The scale search's lower bound on a pipelined step
(layout_planner.scale_bounds) never exceeds what a trial on that mesh costs."""

from __future__ import annotations

import itertools
import os

import pytest

import mtf_core as mtf
from cost_models.profiles import get_hardware
from layout_planner.choices import model_flops, plan_transformer
from layout_planner.problem import LayoutProblem
from layout_planner.scale_bounds import flops_bound_s, recompute_bound_s
from mtf_core.models import TransformerConfig, build_lm

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


def _problem(cfg, mesh, hw, recompute):
    attn, ffn = recompute
    model = build_lm(
        cfg.replace(recompute_attention=attn, recompute_ffn=ffn), optimizer="adam"
    )
    return LayoutProblem(model.graph, mtf.convert_to_shape(mesh), hw, [model.loss])


# Large enough for the projections' flops to dominate the recomputed blocks
# (the graphs cost the same to build and price at any size): a long
# sequence, and a short one with a wide feed-forward (little attention).
WIDE = TransformerConfig(
    num_layers=2, d_model=4096, heads=32, d_kv=128, d_ff=16384, vocab=512,
    length=2048, batch=8, activation_dtype="bfloat16",
)  # fmt: skip
FFN_HEAVY = WIDE.replace(d_model=2048, heads=16, d_ff=32768, length=128, batch=64)


@pytest.mark.parametrize("mesh", ["dp:2;tp:2", "x:2;y:2;z:2"])
@pytest.mark.parametrize("cfg", [WIDE, FFN_HEAVY], ids=["wide", "ffn-heavy"])
def test_recomputing_whole_blocks_adds_at_least_its_bound_under_every_layout(mesh, cfg):
    """Under every layout the tables accept, the graph that recomputes
    whole blocks costs at least the one that keeps them plus
    ``recompute_bound_s`` (one stage, one micro-batch)."""
    hw = get_hardware("h100-nvlink-ib")
    keep = _problem(cfg, mesh, hw, ("none", "none"))
    block = _problem(cfg, mesh, hw, ("block", "block"))
    devices = keep.mesh_shape.size
    bound = recompute_bound_s(cfg, ("block", "block"), hw, 1, 1, devices)
    assert bound > 0
    dims = keep.free_dims
    assert block.free_dims == dims
    added = []
    for axes in itertools.product(*([None, *keep.allowed[d]] for d in dims)):
        asg = dict(zip(dims, axes))
        a, b = keep.table_cost(asg), block.table_cost(asg)
        if a.invalid is None and b.invalid is None:
            added.append(b.time_s - a.time_s)
    assert len(added) > 50
    assert min(added) >= bound * (1 - 1e-9)
    # Not vacuous: the layout that adds least adds within 5x the bound (the
    # scores, norms and activations recomputed besides are not counted).
    assert min(added) < 5 * bound


def test_a_pipelined_trial_recomputing_whole_blocks_costs_the_flops_and_recompute_bounds():
    hw = get_hardware("h100-nvlink-ib")
    plan = plan_transformer(
        CFG, 8, hardware=hw, memory_limit=30 * 2**20, exhaustive=True,
        stages=[1, 2, 4], recompute=[("block", "block")], time_limit_s=30.0,
    )  # fmt: skip
    priced = [t for t in plan.trials if t.step_time_s is not None]
    assert len(priced) >= 4
    for t in priced:
        c = t.choice
        extra = recompute_bound_s(
            CFG, ("block", "block"), hw, c.stages, c.micro_batches, 8 // c.stages
        )
        assert 0 < extra and _bound(CFG, hw, c) + extra <= t.step_time_s, c


def test_the_recompute_bound_is_zero_where_it_is_not_known():
    hw = get_hardware("h100-nvlink-ib")
    block = ("block", "block")
    assert recompute_bound_s(CFG, block, hw, 2, 4, 4) > 0
    assert recompute_bound_s(CFG, ("scores", "none"), hw, 2, 4, 4) == 0
    assert recompute_bound_s(CFG, ("block", "none"), hw, 2, 4, 4) == 0
    assert recompute_bound_s(CFG.replace(experts=4), block, hw, 2, 4, 4) == 0
    assert recompute_bound_s(CFG, block, hw, 2, 4, 4, encoder_decoder=True) == 0
    # A fitted profile's rates are no roofline: no bound.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fitted = get_hardware(os.path.join(root, "bench", "profiles", "h100-kernels.json"))
    assert fitted.rates is not None
    assert recompute_bound_s(CFG, block, fitted, 2, 4, 4) == 0
