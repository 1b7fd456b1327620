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
from layout_planner.scale_bounds import copy_rates, flops_bound_s, recompute_bound_s
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


# Two shapes: a long sequence (the attention scores dominate what is
# recomputed), and a short one with a wide feed-forward (little attention).
WIDE = TransformerConfig(
    num_layers=2, d_model=4096, heads=32, d_kv=128, d_ff=16384, vocab=512,
    length=2048, batch=8, activation_dtype="bfloat16",
)  # fmt: skip
FFN_HEAVY = WIDE.replace(d_model=2048, heads=16, d_ff=32768, length=128, batch=64)
NONE = ("none", "none")
OPTIONS = [("scores", "none"), ("block", "block"), ("block", "none"), ("none", "block")]


def _rates(cfg, hw, options=OPTIONS, least=NONE, builder=build_lm):
    return copy_rates(cfg, builder, "adam", least, options, hw)


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("mesh", ["dp:2;tp:2", "x:2;y:2;z:2"])
@pytest.mark.parametrize("cfg", [WIDE, FFN_HEAVY], ids=["wide", "ffn-heavy"])
def test_each_recomputation_option_adds_at_least_its_bound_under_every_layout(
    cfg, mesh, micro_batches
):
    """Under every layout the tables accept, a micro-batch's graph that
    recomputes costs at least the one that keeps its activations plus the
    option's ``recompute_bound_s`` per slot (one stage of ``m`` micro-batches:
    ``m`` slots); the rates come from the whole batch's graph, so with two
    micro-batches they are scaled down to half the sequences."""
    hw = get_hardware("h100-nvlink-ib")
    rates = _rates(cfg, hw)
    small = cfg.replace(batch=cfg.batch // micro_batches)
    keep = _problem(small, mesh, hw, NONE)
    devices = keep.mesh_shape.size
    dims = keep.free_dims
    assignments = [
        dict(zip(dims, axes))
        for axes in itertools.product(*([None, *keep.allowed[d]] for d in dims))
    ]
    for option in OPTIONS:
        bound = (
            recompute_bound_s(rates[option], cfg, 1, micro_batches, devices)
            / micro_batches
        )
        assert bound > 0, option
        again = _problem(small, mesh, hw, option)
        assert again.free_dims == dims
        added = []
        for asg in assignments:
            a, b = keep.table_cost(asg), again.table_cost(asg)
            if a.invalid is None and b.invalid is None:
                added.append(b.time_s - a.time_s)
        assert len(added) > 50
        assert min(added) >= bound * (1 - 1e-9), option
        # Not vacuous: the layout that adds least adds within 2.5 times the
        # bound (its collectives, and ops not split over every device).
        assert min(added) < 2.5 * bound, option


def test_the_attention_scores_bound_is_what_the_best_layout_adds():
    """Where every op recomputed is split over every device (batch and heads
    over the two axes), the bound is what recomputing the scores adds, to
    within 0.2%: they are memory-bound elementwise ops and two einsums."""
    hw = get_hardware("h100-nvlink-ib")
    rate = _rates(WIDE, hw)[("scores", "none")]
    keep = _problem(WIDE, "dp:2;tp:2", hw, NONE)
    again = _problem(WIDE, "dp:2;tp:2", hw, ("scores", "none"))
    asg = {d: None for d in keep.free_dims} | {"batch": 0, "heads": 1}  # dp, tp
    added = again.table_cost(asg).time_s - keep.table_cost(asg).time_s
    assert added == pytest.approx(recompute_bound_s(rate, WIDE, 1, 1, 4), rel=2e-3)


def test_a_pipelined_trial_that_recomputes_costs_the_flops_and_recompute_bounds():
    hw = get_hardware("h100-nvlink-ib")
    options = [("scores", "none"), ("block", "block")]
    rates = _rates(CFG, hw, options)
    for option in options:
        plan = plan_transformer(
            CFG, 8, hardware=hw, memory_limit=30 * 2**20, exhaustive=True,
            stages=[1, 2, 4], recompute=[option], time_limit_s=30.0,
        )  # fmt: skip
        priced = [t for t in plan.trials if t.step_time_s is not None]
        assert len(priced) >= 4
        for t in priced:
            c = t.choice
            extra = recompute_bound_s(
                rates[option], CFG, c.stages, c.micro_batches, 8 // c.stages
            )
            assert 0 < extra and _bound(CFG, hw, c) + extra <= t.step_time_s, c


def test_the_recompute_bound_is_zero_where_it_is_not_known():
    hw = get_hardware("h100-nvlink-ib")
    block = ("block", "block")
    assert all(r > 0 for r in _rates(CFG, hw).values())
    # The option the free layouts take adds nothing over itself.
    assert _rates(CFG, hw, [block], least=block) == {block: 0.0}
    assert _rates(CFG.replace(experts=4), hw) == dict.fromkeys(OPTIONS, 0.0)
    assert copy_rates(CFG, build_lm, "adam", NONE, [block], hw, True) == {block: 0}
    # A fitted profile's rates are no roofline: no bound.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fitted = get_hardware(os.path.join(root, "bench", "profiles", "h100-kernels.json"))
    assert fitted.rates is not None
    assert _rates(CFG, fitted) == dict.fromkeys(OPTIONS, 0.0)


def test_an_option_whose_graph_lacks_some_op_of_the_least_has_no_bound():
    """The bound counts only what an option adds: where its graph is not
    the least option's and more (here a narrower feed-forward), the copy is
    not all it changes, so there is none."""
    hw = get_hardware("h100-nvlink-ib")

    def narrower(cfg, optimizer):
        if cfg.recompute_ffn != "none":
            cfg = cfg.replace(d_ff=cfg.d_ff // 2)
        return build_lm(cfg, optimizer=optimizer)

    got = _rates(CFG, hw, builder=narrower)
    assert got[("block", "block")] == got[("none", "block")] == 0
    assert got[("scores", "none")] > 0 and got[("block", "none")] > 0
