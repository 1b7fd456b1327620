"""Pipeline pricing and the scale planner (no TensorFlow).

* a stage's step splits into per-micro-batch and once-per-step parts that add
  up to ``evaluate``'s time exactly; one stage and one micro-batch is the plain
  step;
* the pipelined step is ``(m + p - 1)`` micro-batch slots plus the once part,
  the bubble ``p - 1`` slots, the sends one shift over the pipeline axis;
* the scale planner picks a plan that fits, the fastest among its fitting
  trials, shows its choices in ``explain()``, and refuses bad requests naming
  the value.
"""

from __future__ import annotations

import dataclasses

import pytest

import mtf_core as mtf
from cost_models import evaluate, get_hardware
from cost_models.collectives import shift_time_s
from cost_models.pipeline import PipelineError, PipelineSpec, pipeline_cost, split_step
from layout_planner.choices import ScaleError, model_flops, plan_transformer
from layout_planner.scale_plan import ScaleTrial
from mtf_core.comm import LayoutContext
from mtf_core.models import TransformerConfig, build_lm

HW = get_hardware("h100-nvlink-ib")
CFG = TransformerConfig(
    num_layers=4,
    d_model=256,
    heads=8,
    d_kv=32,
    d_ff=1024,
    vocab=1024,
    length=64,
    batch=32,
    activation_dtype="bfloat16",
    shardable_weights=True,
)
RULES = "batch:dp;d_ff:tp;heads:tp;vocab:tp;d_model_stored_ffn:dp"


def _split(cfg: TransformerConfig):
    model = build_lm(cfg, optimizer="adam")
    cost = evaluate(model.graph, "dp:4;tp:2", RULES, HW, [model.loss])
    ctx = LayoutContext.make("dp:4;tp:2", RULES)
    first = next(
        i for i, op in enumerate(model.graph.operations) if op.name == "global_step"
    )
    return split_step(model.graph, cost, ctx, HW, first), cost


def test_split_step_takes_the_ops_seconds_evaluate_gave() -> None:
    model = build_lm(CFG, optimizer="adam")
    seconds: dict = {}
    cost = evaluate(
        model.graph, "dp:4;tp:2", RULES, HW, [model.loss], op_seconds=seconds
    )
    assert cost == evaluate(model.graph, "dp:4;tp:2", RULES, HW, [model.loss])
    ctx = LayoutContext.make("dp:4;tp:2", RULES)
    first = next(
        i for i, op in enumerate(model.graph.operations) if op.name == "global_step"
    )
    assert set(model.graph.operations[first:]) & set(seconds)
    given = split_step(model.graph, cost, ctx, HW, first, seconds)
    # The same seconds, summed in the same order: the same split, exactly.
    assert given == split_step(model.graph, cost, ctx, HW, first)
    # Ops it was not given are priced: an empty map changes nothing.
    assert given == split_step(model.graph, cost, ctx, HW, first, {})


def test_split_step_adds_up_to_evaluate_and_one_stage_is_the_plain_step() -> None:
    split, cost = _split(CFG)
    assert split.per_batch_s + split.once_s == pytest.approx(cost.time_s, rel=1e-12)
    assert 0 < split.once_s < cost.time_s
    one = pipeline_cost(
        PipelineSpec(1, 1),
        split,
        cost.peak_memory_bytes,
        cost.activation_peak_bytes,
        HW.memory_bytes,
        1024,
        ("pp",),
        "pp:1;dp:4;tp:2",
        HW,
    )
    assert one.peak_memory_bytes == cost.peak_memory_bytes
    assert one.step_time_s == pytest.approx(cost.time_s, rel=1e-12)
    assert one.bubble_s == 0.0 and one.send_s == 0.0


def test_pipelined_step_is_m_plus_p_minus_1_slots_and_sends_over_the_axis() -> None:
    split, cost = _split(CFG)
    spec = PipelineSpec(4, 8, "1f1b")
    assert spec.in_flight == 4 and PipelineSpec(4, 8, "gpipe").in_flight == 8
    mesh = "pp:4;dp:4;tp:2"  # pp's groups span hosts of 8: InfiniBand
    p = pipeline_cost(spec, split, cost.peak_memory_bytes, cost.activation_peak_bytes,
                      HW.memory_bytes, 4096, ("pp",), mesh, HW)  # fmt: skip
    send = shift_time_s(4096, HW.link_for_axis("pp", mesh))
    assert HW.link_for_axis("pp", mesh) == HW.inter_host_link
    slot = split.per_batch_s + 2 * send
    # 1F1B holds 4 micro-batches: three more micro-batches' activations.
    assert (
        p.peak_memory_bytes == cost.peak_memory_bytes + 3 * cost.activation_peak_bytes
    )
    assert p.send_s == send
    assert p.step_time_s == pytest.approx((8 + 4 - 1) * slot + split.once_s)
    assert p.bubble_s == pytest.approx(3 * slot)


def test_pipeline_requests_are_checked_by_value() -> None:
    with pytest.raises(PipelineError, match="8 pipeline stages for 4 layers"):
        PipelineSpec(8, 8).check(4, 32)
    with pytest.raises(PipelineError, match="3 pipeline stages do not divide 4"):
        PipelineSpec(3, 4).check(4, 32)
    with pytest.raises(
        PipelineError, match="5 micro-batches do not divide the batch of 32"
    ):
        PipelineSpec(2, 5).check(4, 32)
    with pytest.raises(PipelineError, match="'zigzag'"):
        PipelineSpec(2, 4, "zigzag")
    with pytest.raises(PipelineError, match="stages"):
        PipelineSpec(0, 4)


def test_model_flops_match_megatrons_formula_for_gpt3() -> None:
    cfg = TransformerConfig(
        num_layers=96, d_model=12288, heads=96, d_kv=128, d_ff=49152,
        vocab=51200, length=2048, batch=1536,
    )  # fmt: skip
    b, s, layer, h, v = 1536, 2048, 96, 12288, 51200
    megatron = 72 * b * s * layer * h * h * (1 + s / (6 * h) + v / (12 * h * layer))
    assert model_flops(cfg) == pytest.approx(megatron, rel=1e-12)


@pytest.mark.solver
def test_scale_planner_picks_the_fastest_fitting_trial_and_explains_it() -> None:
    limit = 6 * 2**20  # binds on the micro-batches' held activations
    plan = plan_transformer(
        CFG, 16, HW, stages=[1, 2], tensor=[2, 4], memory_limit=limit
    )
    assert plan.fits and plan.peak_memory_bytes <= limit
    fitting = [t for t in plan.trials if t.fits]
    # The trial was priced from the tables, the plan by evaluate of its stage
    # graph: the same terms, summed in another order.
    assert plan.step_time_s == pytest.approx(
        min(t.step_time_s for t in fitting), rel=1e-12
    )
    assert any(not t.fits for t in plan.trials)  # the limit binds somewhere
    # Two stages, and whole blocks recomputed: keeping everything is over.
    assert (plan.choice.stages, plan.choice.recompute_attention) == (2, "block")
    kept = [
        t
        for t in plan.trials
        if (t.choice.stages, t.choice.tensor) == (2, 2)
        and t.choice.recompute_attention == "none"
    ]
    assert kept and not kept[0].fits
    text = plan.explain()
    for word in ("pp=", "micro_batches", "recompute", "sharded weights", "bfloat16",
                 "bubble", "MFU"):  # fmt: skip
        assert word in text
    assert 0 < plan.mfu < 1
    # A note without a step (a joint program slower than the step before
    # it) on the chosen mesh leaves the line of its free layout as it was.
    mine = [t for t in plan.trials if t.choice.mesh_sizes == plan.choice.mesh_sizes]
    first = mine[0]
    note = ScaleTrial(first.choice, None, None, False, "", "slower than 1 s")
    noted = dataclasses.replace(plan, trials=(*plan.trials, note))
    assert noted.explain().splitlines()[:-1] == text.splitlines()[:-1]


def test_scale_planner_refuses_bad_requests_naming_the_value() -> None:
    with pytest.raises(ScaleError, match="'float16'"):
        plan_transformer(CFG.replace(activation_dtype="float16"), 64, "tpu-v4")
    with pytest.raises(PipelineError, match="8 pipeline stages for 4 layers"):
        plan_transformer(CFG, 16, HW, stages=[8])
    with pytest.raises(PipelineError, match="7 micro-batches"):
        plan_transformer(CFG, 16, HW, stages=[2], tensor=[2], micro_batches=7)
    with pytest.raises(ScaleError, match="8192 devices"):
        plan_transformer(CFG, 8192, HW)
    assert mtf.convert_to_shape("pp:2;dp:4;tp:2").size == 16


def test_sizes_that_leave_no_mesh_are_refused_saying_which_and_why() -> None:
    # Before, each came back as "no plan ... fits in 85,899,345,920 B per
    # device (0 trials)", which blamed the memory.
    with pytest.raises(ScaleError, match="pp 2 x tp 8 = 16 does not divide 8"):
        plan_transformer(CFG, 8, HW, stages=[2], tensor=[8])
    with pytest.raises(
        ScaleError, match="pp 1 x tp 1 leaves dp 8, which does not divide the batch 3"
    ):
        plan_transformer(CFG.replace(batch=3), 8, HW, stages=[1], tensor=[1])
    with pytest.raises(ScaleError, match=r"no mesh of 4093 devices to try.*\(and"):
        plan_transformer(CFG, 4093, HW)  # a prime: only pp 1 x tp 1, and dp 4093
    for field in ("stages", "tensor"):
        with pytest.raises(ScaleError, match=f"{field} is empty"):
            plan_transformer(CFG, 8, HW, **{field: []})


@pytest.mark.solver
def test_a_model_too_large_to_count_in_64_bits_is_refused_naming_why() -> None:
    # Within the service's ranges, but the step's picoseconds (a million
    # micro-batches) or the graph's bytes overflow int64: before, CP-SAT or
    # numpy raised and the service answered 503 "solve_failed", our bug.
    huge = TransformerConfig(
        num_layers=1, d_model=64, heads=1024, d_kv=64, d_ff=64, vocab=64,
        length=65536, batch=1048576,
    )  # fmt: skip
    with pytest.raises(ScaleError, match=r"64-bit integers, up to 2\*\*62 ps") as slow:
        plan_transformer(huge, 1, HW, time_limit_s=1, workers=1)
    assert "none of the 1 trials could be laid out" in str(slow.value)
    assert "fits in" not in str(slow.value)  # not a memory problem
    with pytest.raises(ScaleError, match=r"under 2\*\*55 B") as big:
        plan_transformer(
            huge.replace(length=1048576), 1, HW, micro_batches=1, workers=1
        )
    assert "batch:1048576,heads:1024,length:1048576" in str(big.value)


@pytest.mark.solver
def test_the_inner_axis_stays_inside_a_host_and_4096_devices_plan() -> None:
    wide = CFG.replace(num_layers=2, d_model=2048, heads=16, d_kv=128, d_ff=8192,
                       batch=256, length=256)  # fmt: skip
    plan = plan_transformer(wide, 256, HW, stages=[1], tensor=[4, 8, 16])
    # The inner axis of 8 is one host (NVLink); 16 spans two (InfiniBand).
    assert plan.choice.tensor == 8, plan.explain()
    wider = [t for t in plan.trials if t.choice.tensor == 16]
    assert wider and wider[0].step_time_s > 2 * plan.step_time_s
    big = plan_transformer(
        CFG.replace(batch=4096),
        4096,
        HW,
        stages=[4],
        tensor=[8],
        recompute=[("none", "none")],
    )
    assert big.fits and big.choice.full_mesh == "pp:4;dp:128;tp:8"
    assert big.devices == 4096 and 0 < big.mfu < 1
