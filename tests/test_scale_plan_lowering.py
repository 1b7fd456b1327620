"""A scale plan handed to the pipelined lowering, and its predictions checked.

``plan_transformer`` plans a 4-layer LM (batch 8) on 8 devices with a
memory limit small enough that it splits the model; the plan is lowered by
``PipelinedStep.from_plan`` on 8 logical CPUs and trained 3 Adam steps:

* losses and every variable equal the unpipelined step's on the stage mesh
  under the plan's rules (``rtol 1e-5``, float32);
* the sends are ``plan.pipeline``'s: ``PipelineSpec.sends`` shifts over
  ``pp`` of ``plan.boundary_bytes``, whose shift time is ``send_s``;
* every other collective (kind, axes, bytes) is what the plan priced: its
  stage's collectives ``m`` times per step (once for the optimizer's), plus,
  for the layers of the other stages, a layer's worth each (the 3-layer
  stage graph's less the 2-layer one's, as the scale search extrapolates);
* on the first stage each micro-batch holds the plan's ``held_bytes``;
* a one-stage plan lowers as a one-stage pipeline (``pp:1``: micro-batches,
  no sends) with the same checks, and so do a plan on a sequence axis
  (``pp:2;dp:1;sp:2;tp:2``, the sequence split) and an encoder-decoder's
  plan (one stage: its blocks recomputed, weights stored sharded);
* bad input (another device count, an encoder-decoder's pipeline) is named.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import pytest

from cost_models.collectives import shift_time_s
from cost_models.costs import evaluate
from layout_planner.choices import ScaleChoice, plan_transformer, price_layout
from layout_planner.scale_plan import ScaleError, ScalePlan
from mtf_core.comm import LayoutContext
from mtf_core.errors import ConfigError
from mtf_core.models import TransformerConfig, build_encoder_decoder, build_lm
from mtf_core.models.base import ModelGraph
from mtf_core.optimize import STEP_NAME, AdamWeightDecayOptimizer
from mtf_core.pipeline import build_pipelined_encoder_decoder, held_bytes
from mtf_core.pipeline_schedule import PipelineConfigError, PipelineStages

pytestmark = [pytest.mark.solver, pytest.mark.tf]

CFG = TransformerConfig(
    num_layers=4, d_model=16, heads=4, d_kv=4, d_ff=32, vocab=32, length=8, batch=8
)  # fmt: skip
HW = "h100-nvlink-ib"
OPTIMIZER, LR = "adam", 0.01
STEPS = 3
# Memory limits (bytes per device) under which the planner splits this tiny
# model (replicated, it would fit 80 GiB and be fastest).
PLANS: dict[str, dict[str, Any]] = {
    # 2 stages, 2 micro-batches; the optimizer slots of every weight class
    # sharded over dp (ZeRO-1: gradients reduce-scattered, updated shards
    # gathered once per step).
    # (Recomputation is left out: with it the planner finds a faster plan for
    # this tiny model that splits neither the batch nor over tp.)
    "pp2-slots": {
        "stages": [2],
        "micro_batches": 2,
        "memory_limit": 100_000,
        "recompute": [("none", "none")],
    },
    # 2 stages, 2 micro-batches; weights stored sharded over dp (gathered on
    # each read) and both blocks recomputed.
    "pp2-stored-recomputed": {
        "stages": [2],
        "micro_batches": 2,
        "memory_limit": 50_000,
    },
    # 1 stage (4 data-parallel replicas, so 2 micro-batches), weights stored
    # sharded (over tp).
    "pp1": {"stages": [1], "memory_limit": 80_000, "recompute": [("none", "none")]},
    # 2 stages on a sequence axis too (pp 2 x dp 1 x sp 2 x tp 2), one
    # sequence per micro-batch: the batch cannot split, so the sequence does
    # (over one of the two stage axes, the heads over the other).
    "pp2-sequence": {
        "stages": [2],
        "sequence": [2],
        "micro_batches": 8,
        "memory_limit": 60_000,
        "recompute": [("none", "none")],
    },
    # An encoder-decoder (planned on one stage): 2 micro-batches, both
    # blocks recomputed, weights stored sharded and slots sharded.
    "encdec-pp1": {"encoder_decoder": True, "memory_limit": 120_000},
}


def _plan(name: str) -> ScalePlan:
    return plan_transformer(CFG, 8, HW, optimizer=OPTIMIZER, tensor=[2], **PLANS[name])


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, CFG.vocab, (CFG.batch, CFG.length)).astype(np.int32)
        out.append({"inputs": ids, "targets": np.roll(ids, -1, axis=1)})
    return out


def _feeds(plan: ScalePlan) -> list[dict[str, np.ndarray]]:
    """The batches, as the plan's model takes them: an encoder-decoder
    learns to copy one batch of inputs (the decoder reads them shifted
    right), so that its loss falls within the 3 steps."""
    if not plan.encoder_decoder:
        return _batches()
    ids = _batches()[0]["inputs"]
    copy = {"inputs": ids, "decoder_inputs": np.roll(ids, 1, axis=1), "targets": ids}
    return [copy] * STEPS


def _optimizer(plan: ScalePlan) -> Any:
    """The plan's Adam; for the encoder-decoder's copy task with a larger
    epsilon: some of its weights' gradients are near 0 (decoder queries and
    cross-attention keys), and at 1e-8 Adam scales their summation order's
    rounding up to a whole step (2e-5 apart in 3 steps)."""
    if not plan.encoder_decoder:
        return OPTIMIZER
    return AdamWeightDecayOptimizer(LR, epsilon=1e-4)


def _builder(plan: ScalePlan) -> Any:
    return build_encoder_decoder if plan.encoder_decoder else build_lm


def _keys(collectives: Any) -> Counter[tuple[str, tuple[str, ...], int]]:
    return Counter(
        (str(c.kind), tuple(c.mesh_axes), c.bytes_per_device) for c in collectives
    )


@pytest.fixture(scope="module", params=list(PLANS))
def lowered(request: Any, devices: list[str]) -> dict[str, Any]:
    """The plan, its pipelined step after 3 steps, and the unpipelined step
    (the whole batch on the stage mesh, the plan's rules) after the same."""
    import mtf_core as mtf
    from mtf_core.lowering.pipeline_step import PipelinedStep

    plan = _plan(request.param)
    c = plan.choice
    step = PipelinedStep.from_plan(plan, _optimizer(plan), LR, devices)
    losses = [step(b) for b in _feeds(plan)]
    cfg = plan.config.replace(
        recompute_attention=c.recompute_attention, recompute_ffn=c.recompute_ffn
    )
    ref = _builder(plan)(cfg, optimizer=_optimizer(plan), learning_rate=LR)
    impl = mtf.PlacementMeshImpl(
        c.stage_mesh, plan.layout_rules, devices[: c.devices // c.stages]
    )
    fn = mtf.compile_function(
        ref.graph, {ref.mesh: impl}, inputs=ref.placeholders, outputs=[ref.loss],
        updates=ref.updates,
    )  # fmt: skip
    names = [t.operation.name for t in ref.placeholders]
    ref_losses = [float(fn(*(b[n] for n in names))[0]) for b in _feeds(plan)]
    return {
        "name": request.param,
        "plan": plan,
        "step": step,
        "losses": losses,
        "ref_losses": ref_losses,
        "values": step.fn.variables.to_dict(),
        "ref_values": fn.variables.to_dict(),
    }


def test_the_planner_chose_what_each_case_exercises(lowered: dict[str, Any]) -> None:
    """The cases are not vacuous: the plan splits the model over dp and tp
    and, per case, shards the weights or recomputes as described."""
    plan, name = lowered["plan"], lowered["name"]
    c = plan.choice
    rules = dict(plan.stage_plan.layout_rules)
    recomputed = (c.recompute_attention, c.recompute_ffn) != ("none", "none")
    if name == "pp2-sequence":
        assert c.mesh_sizes == (2, 1, 2, 2) and c.micro_batches == 8
        assert plan.choice.full_mesh == "pp:2;dp:1;sp:2;tp:2"
        assert "batch" not in rules  # one sequence per micro-batch
        assert {rules.get("length"), rules.get("heads")} == {"sp", "tp"}, rules
        assert not recomputed
        return
    model = lowered["step"].model
    assert plan.encoder_decoder == (name == "encdec-pp1")
    if plan.encoder_decoder:
        assert c.mesh_sizes == (1, 4, 1, 2) and c.micro_batches == 2
        assert set(rules.values()) == {"dp", "tp"}, plan.layout_rules
        assert plan.sharded_classes and plan.slot_sharded_classes and recomputed
        assert model.feed_names == ("inputs", "decoder_inputs", "targets")
        assert "  encoder-decoder: one stage (a pipeline" in plan.explain()
        assert len(model.inputs) == 3 * c.micro_batches
        return
    assert c.mesh_sizes == ((2, 2, 1, 2) if name != "pp1" else (1, 4, 1, 2))
    assert c.micro_batches == 2
    assert set(rules.values()) == {"dp", "tp"}, plan.layout_rules
    if name == "pp2-slots":
        assert plan.slot_sharded_classes and not plan.sharded_classes
        assert not recomputed
    elif name == "pp2-stored-recomputed":
        assert plan.sharded_classes and recomputed
    else:
        assert plan.sharded_classes and not recomputed
    assert "encoder-decoder" not in plan.explain()
    assert (model.spec.stages, model.spec.micro_batches, model.spec.schedule) == (
        c.stages, c.micro_batches, c.schedule
    )  # fmt: skip
    assert model.config.recompute_ffn == c.recompute_ffn


def test_plan_lowering_trains_like_the_unpipelined_step(
    lowered: dict[str, Any],
) -> None:
    np.testing.assert_allclose(lowered["losses"], lowered["ref_losses"], rtol=1e-5)
    assert lowered["losses"][-1] < lowered["losses"][0]
    ref, got = lowered["ref_values"], lowered["values"]
    stages = lowered["plan"].choice.stages
    assert set(got) - set(ref) == {f"{STEP_NAME}_stage_{s}" for s in range(1, stages)}
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sends_are_the_plans(lowered: dict[str, Any]) -> None:
    plan, counters = lowered["plan"], lowered["step"].counters
    sends = [c for c in counters.collectives if c.mesh_axes == ("pp",)]
    assert len(sends) == plan.pipeline.spec.sends
    assert len(sends) == 2 * plan.choice.micro_batches * (plan.choice.stages - 1)
    if plan.choice.stages == 1:
        assert plan.pipeline.send_s == 0.0
        return
    # [batch/m, length, d_model] float32, batch over dp: 4 x 8 x 16 x 4 / 2;
    # on the sequence axis one sequence, its length split: 1 x 8 x 16 x 4 / 2.
    assert plan.boundary_bytes == (256 if lowered["name"] == "pp2-sequence" else 1024)
    assert {(c.kind, c.bytes_per_device) for c in sends} == {
        ("shift", plan.boundary_bytes)
    }
    link = plan.hardware.link_for_axis("pp", plan.choice.full_mesh)
    assert shift_time_s(plan.boundary_bytes, link) == plan.pipeline.send_s


def _stage_graph(plan: ScalePlan, layers: int) -> ModelGraph:
    """A stage graph as the planner builds it: ``layers`` layers, the
    embedding and the head, one micro-batch, the chosen recomputation."""
    c = plan.choice
    cfg = plan.config.replace(
        num_layers=layers,
        batch=plan.config.batch // c.micro_batches,
        recompute_attention=c.recompute_attention,
        recompute_ffn=c.recompute_ffn,
    )
    return _builder(plan)(cfg, optimizer=OPTIMIZER)


def _split(model: ModelGraph, cost: Any) -> tuple[Counter[Any], Counter[Any]]:
    """``cost``'s collectives per micro-batch and once per step, cut as
    ``cost_models.pipeline.split_step`` cuts them: the optimizer's (ops from
    the step counter on) and the reduce-scatters are once per step."""
    ops = model.graph.operations
    first = next(i for i, op in enumerate(ops) if op.name == STEP_NAME)
    once_ops = {op.name for op in ops[first:]}
    once_ops |= {op.name for op in ops if op.op_type == "ReduceScatter"}
    pairs = list(zip(cost.collectives, cost.collective_ops))
    once = _keys(c for c, n in pairs if n in once_ops)
    per = _keys(c for c, n in pairs if n not in once_ops)
    return per, once


def _times(counter: Counter[Any], k: int) -> Counter[Any]:
    return Counter({key: k * n for key, n in counter.items()})


def test_other_collectives_are_what_the_plan_priced(lowered: dict[str, Any]) -> None:
    plan, counters = lowered["plan"], lowered["step"].counters
    c = plan.choice
    n = CFG.num_layers // c.stages
    rules = plan.stage_plan.layout_rules

    def priced(model: ModelGraph) -> Any:
        return evaluate(model.graph, c.stage_mesh, rules, plan.hardware, [model.loss])

    # The plan's priced collectives are its stage graph's (L/p layers).
    stage = _stage_graph(plan, n)
    priced_stage = plan.stage_plan.evaluation
    assert priced_stage is not None
    assert priced_stage.collectives == priced(stage).collectives
    per, once = _split(stage, priced_stage)
    # The other stages' layers, at a layer's worth each.
    extra = CFG.num_layers - n
    if extra:
        two, three = _stage_graph(plan, 2), _stage_graph(plan, 3)
        per2, once2 = _split(two, priced(two))
        per3, once3 = _split(three, priced(three))
        assert per2 <= per3 and once2 <= once3
        per += _times(per3 - per2, extra)
        once += _times(once3 - once2, extra)
    predicted = _times(per, c.micro_batches) + once
    got = _keys(x for x in counters.collectives if x.mesh_axes != ("pp",))
    assert got == predicted
    # The plan's weight sharding is there: gradients reduce-scattered and
    # weights (stored) or updated shards (slots-only) gathered.
    assert {k for k, _, _ in got} >= {"reducescatter", "allconcat"}


def test_first_stage_holds_the_plans_bytes_per_micro_batch(
    lowered: dict[str, Any],
) -> None:
    plan, model = lowered["plan"], lowered["step"].model
    c = plan.choice
    if c.stages == 1:
        # One micro-batch in flight: held bytes price nothing (peak + 0 x held).
        assert plan.pipeline.spec.in_flight == 1
        assert plan.pipeline.peak_memory_bytes == plan.stage_plan.cost.peak_memory_bytes
        return
    ctx = LayoutContext.make(c.stage_mesh, plan.stage_plan.layout_rules)
    held = [held_bytes(model, 0, j, ctx) for j in range(c.micro_batches)]
    assert held == [plan.pipeline.held_bytes] * c.micro_batches
    # Twice tests/test_scale_pipeline_lowering.py's figures (micro-batches of
    # 4 sequences here, 2 there): every activation kept, or (whole blocks
    # recomputed) the blocks' inputs and the ids.
    recomputed = c.recompute_ffn == "block"
    if lowered["name"] == "pp2-sequence":
        # One sequence per micro-batch, its length (and the heads) split in
        # two: under a third of the 4-sequence micro-batches' 27456.
        assert plan.pipeline.held_bytes == 7888
        return
    assert plan.pipeline.held_bytes == (4160 if recomputed else 27456)


def test_bad_plans_are_refused_naming_the_value(devices: list[str]) -> None:
    from mtf_core.lowering.pipeline_step import PipelinedStep

    plan = _plan("pp2-slots")
    with pytest.raises(
        ConfigError,
        match=r"4 devices given for a plan on 8 devices \(mesh \[pp:2;dp:2;tp:2\]\); "
        "expected 8",
    ):
        PipelinedStep.from_plan(plan, OPTIMIZER, LR, devices[:4])
    wrong = dataclasses.replace(plan, devices=16)
    with pytest.raises(
        ConfigError,
        match=r"mesh \[pp:2;dp:2;tp:2\] has 8 devices but the plan is for 16",
    ):
        PipelinedStep.from_plan(wrong, OPTIMIZER, LR)
    # An encoder-decoder's pipeline is neither priced nor built: asked for,
    # it is refused by name.
    with pytest.raises(
        ScaleError, match=r"stages \[2\] for an encoder-decoder; expected \[1\]"
    ):
        plan_transformer(
            CFG, 8, HW, optimizer=OPTIMIZER, encoder_decoder=True, stages=[2],
            tensor=[2], micro_batches=2,
        )  # fmt: skip
    with pytest.raises(
        ScaleError, match=r"stages \[2\] for an encoder-decoder; expected \[1\]"
    ):
        price_layout(
            CFG, ScaleChoice(2, 2, 2, 2, "1f1b", "none", "none"), "batch:dp", HW,
            encoder_decoder=True,
        )  # fmt: skip
    with pytest.raises(
        PipelineConfigError,
        match="2 pipeline stages for an encoder-decoder; expected 1",
    ):
        build_pipelined_encoder_decoder(CFG, PipelineStages(2, 2, "1f1b"), OPTIMIZER)
