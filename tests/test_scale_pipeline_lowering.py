"""Pipelined training steps lowered on the placement backend (8 logical CPUs).

A 4-layer LM on ``pp:2;dp:2;tp:2``: two stages of two layers, the batch of 8
cut into 4 micro-batches, GPipe and 1F1B.

* losses and every weight after 3 steps equal the unpipelined step's;
* the sends are ``2 m (p - 1)`` shifts over ``pp`` of the boundary slice the
  cost model prices (:mod:`cost_models.pipeline`), and every other
  collective is the plan's: each micro-batch's ``m`` times, the weight
  gradients' allreduces once per step;
* flops are ``m`` micro-batches of the unpipelined model's work, plus the
  ``m - 1`` gradient accumulations per weight;
* what a micro-batch holds between its forward and backward on the first
  stage is the plan's ``held_bytes_per_micro_batch``;
* the schedules' orders hold at most ``p`` (1F1B) or ``m`` (GPipe)
  micro-batches, and the step carries them as control dependencies;
* bad input is refused naming the value.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from cost_models import evaluate, get_hardware
from cost_models.collectives import shift_time_s
from cost_models.memory import memory_model
from cost_models.pipeline import (
    PipelineSpec,
    held_bytes_per_micro_batch,
    pipeline_cost,
    split_step,
)
from mtf_core.autodiff import gradients
from mtf_core.comm import LayoutContext
from mtf_core.errors import ConfigError
from mtf_core.models import TransformerConfig, build_lm
from mtf_core.optimize import STEP_NAME
from mtf_core.pipeline import build_pipelined_lm, held_bytes
from mtf_core.pipeline_schedule import (
    PipelineConfigError,
    PipelineStages,
    global_order,
    in_flight,
    stage_orders,
)
from mtf_core.shapes import Shape

# Weights stored under per-class names, as the scale planner builds them
# (the rules here leave those names whole).
CFG = TransformerConfig(
    num_layers=4, d_model=16, heads=4, d_kv=4, d_ff=32, vocab=32, length=8,
    batch=8, shardable_weights=True,
)  # fmt: skip
MESH = "pp:2;dp:2;tp:2"
STAGE_MESH = "dp:2;tp:2"
# The ffn weights stored sharded over dp (ZeRO): gathered on each read.
RULES = "batch:dp;heads:tp;d_ff:tp;vocab:tp;d_model_stored_ffn:dp"
P, M = 2, 4
MB_CFG = CFG.replace(batch=CFG.batch // M)  # one micro-batch
STEPS = 3
HW = get_hardware("h100-nvlink-ib")


def _batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        ids = rng.integers(0, CFG.vocab, (CFG.batch, CFG.length)).astype(np.int32)
        out.append({"inputs": ids, "targets": np.roll(ids, -1, axis=1)})
    return out


def _plain_step(model: Any, mesh: str, rules: str, devices: list[str]) -> Any:
    """The unpipelined step of ``model`` on the first devices."""
    import mtf_core as mtf

    n = mtf.convert_to_shape(mesh).size
    return mtf.compile_function(
        model.graph, {model.mesh: mtf.PlacementMeshImpl(mesh, rules, devices[:n])},
        inputs=model.placeholders, outputs=[model.loss], updates=model.updates,
    )  # fmt: skip


@pytest.fixture(scope="module")
def unpipelined(devices: list[str]) -> dict[str, Any]:
    model = build_lm(CFG, optimizer="sgd", learning_rate=0.5)
    fn = _plain_step(model, STAGE_MESH, RULES, devices)
    losses = [float(fn(b["inputs"], b["targets"])[0]) for b in _batches()]
    return {"losses": losses, "values": fn.variables.to_dict(), "fn": fn}


@pytest.fixture(scope="module", params=["gpipe", "1f1b"])
def pipelined(request: Any, devices: list[str]) -> dict[str, Any]:
    from mtf_core.lowering.pipeline_step import PipelinedStep

    model = build_pipelined_lm(
        CFG, PipelineStages(P, M, request.param), "sgd", learning_rate=0.5
    )
    step = PipelinedStep(model, MESH, RULES, devices)
    losses = [step(b) for b in _batches()]
    return {
        "model": model,
        "step": step,
        "losses": losses,
        "values": step.fn.variables.to_dict(),
    }


def test_pipelined_steps_equal_the_unpipelined_step(
    unpipelined: dict[str, Any], pipelined: dict[str, Any]
) -> None:
    np.testing.assert_allclose(pipelined["losses"], unpipelined["losses"], rtol=1e-5)
    ref, got = unpipelined["values"], pipelined["values"]
    # Each stage counts its own steps; everything else is the same variable.
    assert set(got) - set(ref) == {f"{STEP_NAME}_stage_1"}
    assert set(ref) <= set(got)
    for name, value in ref.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert got[STEP_NAME] == got[f"{STEP_NAME}_stage_1"] == STEPS
    # The weights moved: equal values are not the initial ones.
    first = build_lm(CFG, optimizer="sgd")
    w = next(v for v in first.graph.trainable_variables if "ffn" in v.name)
    assert not np.allclose(ref[w.name], w.initializer(w.shape.to_integer_list()))


def test_adam_on_four_stages_equals_the_unpipelined_step(devices: list[str]) -> None:
    """One layer per stage on pp:4;dp:2: Adam's bias correction reads each
    stage's own step counter, which must count the same steps."""
    from mtf_core.lowering.pipeline_step import PipelinedStep

    ref = build_lm(CFG, optimizer="adam", learning_rate=0.01)
    fn = _plain_step(ref, "dp:2", "batch:dp", devices)
    model = build_pipelined_lm(CFG, PipelineStages(4, 4, "1f1b"), "adam", 0.01)
    step = PipelinedStep(model, "pp:4;dp:2", "batch:dp", devices)
    for b in _batches():
        want = float(fn(b["inputs"], b["targets"])[0])
        assert step(b) == pytest.approx(want, rel=1e-5)
    got = step.fn.variables.to_dict()
    assert [int(got[f"{STEP_NAME}_stage_{s}"]) for s in (1, 2, 3)] == [STEPS] * 3
    for name, value in fn.variables.to_dict().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_public_road_orders_the_units_and_gives_the_same_loss(
    devices: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TensorFlow's private APIs (tf_private's public road) the step
    is traced by tf.function; the order is still public control dependencies."""
    from mtf_core.lowering import tf_private
    from mtf_core.lowering.pipeline_step import PipelinedStep

    monkeypatch.setenv(tf_private.PUBLIC_ENV, "1")
    cfg = CFG.replace(num_layers=2, batch=4)
    ref = build_lm(cfg, optimizer="sgd", learning_rate=0.5)
    fn = _plain_step(ref, "dp:2", "batch:dp", devices)
    model = build_pipelined_lm(cfg, PipelineStages(2, 2, "1f1b"), "sgd", 0.5)
    step = PipelinedStep(model, "pp:2;dp:2", "batch:dp", devices)
    ids = np.arange(32, dtype=np.int32).reshape(4, 8) % cfg.vocab
    batch = {"inputs": ids, "targets": np.roll(ids, -1, axis=1)}
    for _ in range(2):
        want = float(fn(batch["inputs"], batch["targets"])[0])
        assert step(batch) == pytest.approx(want, rel=1e-5)
    assert step.fn.ordered_ops > 0
    names = {op.name for op in step.fn.concrete.graph.get_operations()}
    assert {"done_F0_0", "done_F1_0", "done_B0_0"} <= names


@pytest.mark.solver
@pytest.mark.parametrize("recompute", [("block", "block"), ("scores", "none")])
def test_recomputed_pipeline_equals_the_unpipelined_step_and_holds_the_plans_bytes(
    recompute: tuple[str, str], devices: list[str]
) -> None:
    """Recomputed blocks (whole, or the attention scores) inside a pipeline:
    the same values, and on the first stage each micro-batch holds what the
    scale planner prices (with whole blocks: their inputs and the ids)."""
    from layout_planner.choices import ScaleChoice, price_layout
    from mtf_core.lowering.pipeline_step import PipelinedStep

    cfg = CFG.replace(recompute_attention=recompute[0], recompute_ffn=recompute[1])
    ref = build_lm(cfg, optimizer="sgd", learning_rate=0.5)
    fn = _plain_step(ref, STAGE_MESH, RULES, devices)
    model = build_pipelined_lm(cfg, PipelineStages(P, M, "1f1b"), "sgd", 0.5)
    step = PipelinedStep(model, MESH, RULES, devices)
    for b in _batches()[:2]:
        want = float(fn(b["inputs"], b["targets"])[0])
        assert step(b) == pytest.approx(want, rel=1e-5)
    got = step.fn.variables.to_dict()
    for name, value in fn.variables.to_dict().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    choice = ScaleChoice(P, 2, 2, M, "1f1b", *recompute)
    plan = price_layout(CFG, choice, RULES, HW, optimizer="sgd").pipeline
    ctx = LayoutContext.make(STAGE_MESH, RULES)
    assert [held_bytes(model, 0, j, ctx) for j in range(M)] == [plan.held_bytes] * M
    assert plan.held_bytes == {"block": 2080, "scores": 11552}[recompute[0]]


def _stage_cost() -> tuple[Any, Any, Any]:
    """The plan's stage graph (L/p layers at one micro-batch) and its cost."""
    stage = build_lm(
        CFG.replace(num_layers=CFG.num_layers // P, batch=CFG.batch // M),
        optimizer="sgd",
    )
    cost = evaluate(stage.graph, STAGE_MESH, RULES, HW, [stage.loss])
    return stage, cost, LayoutContext.make(STAGE_MESH, RULES)


def test_sends_are_the_cost_models_shifts_over_the_pipeline_axis(
    pipelined: dict[str, Any],
) -> None:
    counters = pipelined["step"].counters
    spec = PipelineSpec(P, M, pipelined["model"].spec.schedule)
    sends = [c for c in counters.collectives if c.mesh_axes == ("pp",)]
    # The boundary activation the planner prices: [batch/m, length, d_model]
    # float32, batch over dp: 2 x 8 x 16 x 4 bytes / 2 = 512 per device.
    ctx = LayoutContext.make(STAGE_MESH, RULES)
    shape = Shape([MB_CFG.batch_dim, CFG.length_dim, CFG.model_dim])
    boundary = ctx.slice_bytes(shape, "float32")
    assert boundary == 512
    assert len(sends) == spec.sends == 2 * M * (P - 1) == 8
    assert {(c.kind, c.bytes_per_device, c.op_type) for c in sends} == {
        ("shift", boundary, "StageSend")
    }
    stage, cost, _ = _stage_cost()
    first = next(
        i for i, op in enumerate(stage.graph.operations) if op.name == STEP_NAME
    )
    split = split_step(stage.graph, cost, ctx, HW, first)
    priced = pipeline_cost(
        spec, split, cost.peak_memory_bytes, 0, HW.memory_bytes,
        sends[0].bytes_per_device, ("pp",), MESH, HW,
    )  # fmt: skip
    assert priced.send_s == shift_time_s(boundary, HW.link_for_axis("pp", MESH))


@pytest.fixture(scope="module")
def micro_batch(devices: list[str]) -> dict[str, Any]:
    """The unpipelined model at one micro-batch: evaluate()'s cost and its
    lowering's counters; ops from ``first_update`` on are the optimizer's."""
    model = build_lm(MB_CFG, optimizer="sgd")
    fn = _plain_step(model, STAGE_MESH, RULES, devices)
    fn.trace()
    ops = model.graph.operations
    return {
        "model": model,
        "cost": evaluate(model.graph, STAGE_MESH, RULES, HW, [model.loss]),
        "counters": fn.counters,
        "first_update": next(i for i, o in enumerate(ops) if o.name == STEP_NAME),
    }


def _keys(collectives: Any) -> Counter[tuple[str, tuple[str, ...], int]]:
    return Counter(
        (str(c.kind), tuple(c.mesh_axes), c.bytes_per_device) for c in collectives
    )


def lowered_mb_keys(micro_batch: dict[str, Any]) -> Counter[Any]:
    return _keys(micro_batch["counters"].collectives)


def test_collectives_are_each_micro_batchs_plus_the_once_per_step_ones(
    pipelined: dict[str, Any], micro_batch: dict[str, Any]
) -> None:
    # The plan's split of the step (split_step): once per step are the
    # collectives the optimizer issues or forces (the weight gradients'
    # allreduces over dp) and the stored weights' gradients' reduce-scatters;
    # the rest (the stored weights' gathers too) is per micro-batch.  The
    # pipelined lowering issues the unpipelined micro-batch step's
    # per-micro-batch collectives m times and the once-per-step ones once:
    # accumulated gradients stay pending sums until the optimizer (or the
    # stored weight's reduce-scatter) reads them.
    cost = micro_batch["cost"]
    ops = micro_batch["model"].graph.operations
    once_ops = {op.name for op in ops[micro_batch["first_update"] :]}
    once_ops |= {op.name for op in ops if op.op_type == "ReduceScatter"}
    once = _keys(c for c, n in zip(cost.collectives, cost.collective_ops)
                 if n in once_ops)  # fmt: skip
    assert {k[:2] for k in once} == {
        ("allreduce", ("dp",)), ("reducescatter", ("dp",))
    }  # fmt: skip
    assert ("allconcat", ("dp",), 512) in lowered_mb_keys(micro_batch)
    lowered_mb = lowered_mb_keys(micro_batch)
    assert once <= lowered_mb
    per = lowered_mb - once
    pipelined_keys = _keys(
        c for c in pipelined["step"].counters.collectives if c.mesh_axes != ("pp",)
    )
    assert pipelined_keys == Counter({k: M * n for k, n in per.items()}) + once


def test_flops_are_m_micro_batches_plus_gradient_accumulation(
    pipelined: dict[str, Any], micro_batch: dict[str, Any]
) -> None:
    model, counters = pipelined["model"], pipelined["step"].counters
    flops = counters.flops_per_device
    ctx = LayoutContext.make(STAGE_MESH, RULES)
    # Per micro-batch, each stage does the same work.
    for s in range(P):
        per_mb = [
            sum(
                flops.get(op.name, 0.0)
                for op, w in model.work.items()
                if (w.stage, w.micro_batch) == (s, j) and op not in model.accumulations
            )
            for j in range(M)
        ]
        assert len(set(per_mb)) == 1 and per_mb[0] > 0, per_mb
    # Accumulation: m - 1 adds of each weight's gradient slice (a stored
    # weight's at its gathered read, whole over dp: reduce-scattered once).
    acc = sum(flops.get(op.name, 0.0) for op in model.accumulations)
    assert len(model.accumulations) == (M - 1) * len(model.variables)
    summed = [op.outputs[0] for op in model.accumulations]
    assert acc == sum(ctx.slice_bytes(t.shape, t.dtype) / 4 for t in summed)
    kernels = [t for t in summed if t.shape.ndims == 2 and "d_ff" in t.shape]
    assert len(kernels) == (M - 1) * 2 * CFG.num_layers
    assert all(t.shape.dimension_names.count("d_model") == 1 for t in kernels)
    # All units together are m micro-batches of the unpipelined model's
    # forward and backward (its lowering at one micro-batch, optimizer aside).
    ref = micro_batch["counters"].flops_per_device
    ops = micro_batch["model"].graph.operations[: micro_batch["first_update"]]
    ref_mb = sum(ref.get(op.name, 0.0) for op in ops)
    units = sum(flops.get(op.name, 0.0) for op in model.work)
    assert units - acc == pytest.approx(M * ref_mb, rel=1e-12)


@pytest.mark.solver
def test_the_scale_plans_sends_and_held_bytes_are_the_lowerings(
    pipelined: dict[str, Any],
) -> None:
    """The scale planner's price of this pipeline (price_layout: the mesh,
    micro-batches, schedule and rules given) against what was lowered."""
    from layout_planner.choices import ScaleChoice, price_layout

    model, counters = pipelined["model"], pipelined["step"].counters
    choice = ScaleChoice(P, 2, 2, M, model.spec.schedule, "none", "none")
    assert choice.full_mesh == MESH
    plan = price_layout(CFG, choice, RULES, HW, optimizer="sgd").pipeline
    sends = [c for c in counters.collectives if c.mesh_axes == ("pp",)]
    assert len(sends) == plan.spec.sends
    link = HW.link_for_axis("pp", MESH)
    assert {shift_time_s(c.bytes_per_device, link) for c in sends} == {plan.send_s}
    ctx = LayoutContext.make(STAGE_MESH, RULES)
    assert [held_bytes(model, 0, j, ctx) for j in range(M)] == [plan.held_bytes] * M


def test_first_stage_holds_what_the_plan_prices_per_micro_batch(
    pipelined: dict[str, Any],
) -> None:
    stage, _, ctx = _stage_cost()
    ops = stage.graph.operations
    first_backward = 1 + next(i for i, o in enumerate(ops) if o is stage.loss.operation)
    head = next(i for i, o in enumerate(ops) if o.name == "final_norm_scale")
    memory = memory_model(stage.graph, [stage.loss])
    planned = held_bytes_per_micro_batch(stage.graph, memory, ctx, first_backward, head)
    model = pipelined["model"]
    assert [held_bytes(model, 0, j, ctx) for j in range(M)] == [planned] * M
    assert planned == 13728


def test_schedules_hold_at_most_p_or_m_micro_batches_and_are_ordered(
    pipelined: dict[str, Any],
) -> None:
    model, step = pipelined["model"], pipelined["step"]
    orders = stage_orders(model.spec)
    held = [in_flight(o) for o in orders]
    if model.spec.schedule == "1f1b":
        assert held == [P - s for s in range(P)]
        assert [str(w) for w in orders[0]] == [
            "F0@0", "F1@0", "B0@0", "F2@0", "B1@0", "F3@0", "B2@0", "B3@0"
        ]  # fmt: skip
    else:
        assert held == [M] * P
    # Every unit but a stage's first waits for the one before it: a NoOp
    # after all of a unit's ops, a control input of the next unit's ops.
    graph = step.fn.concrete.graph
    barriers = {op.name for op in graph.get_operations() if op.name.startswith("done_")}
    assert len(barriers) == P * (2 * M - 1)
    waiting: Counter[str] = Counter(
        c.name for op in graph.get_operations() for c in op.control_inputs
        if c.name in barriers
    )  # fmt: skip
    assert set(waiting) == barriers
    assert step.fn.ordered_ops >= sum(waiting.values()) > 0
    # On stage 0, 1F1B's third forward waits for the first backward; GPipe's
    # first backward waits for the last forward.
    before = "done_B0_0" if model.spec.schedule == "1f1b" else "done_F3_0"
    assert waiting[before] > 0


def test_the_cost_models_in_flight_count_is_the_schedules() -> None:
    """PipelineSpec.in_flight (m for GPipe, min(p, m) for 1F1B) is the most
    micro-batches any stage of the lowered order holds, and every order can
    be built (no stage waits forever)."""
    for p in range(1, 6):
        for m in range(1, 9):
            for schedule in ("gpipe", "1f1b"):
                spec = PipelineStages(p, m, schedule)
                orders = stage_orders(spec)
                assert max(map(in_flight, orders)) == (
                    PipelineSpec(p, m, schedule).in_flight
                ), (p, m, schedule)
                assert all(len(o) == 2 * m for o in orders)
                assert len(global_order(spec)) == 2 * m * p


def test_units_are_built_in_an_order_every_stage_keeps() -> None:
    model = build_pipelined_lm(
        CFG.replace(num_layers=2, batch=4), PipelineStages(2, 2, "1f1b"), "sgd"
    )
    assert [str(w) for w in model.order] == [
        "F0@0", "F0@1", "F1@0", "B0@1", "B0@0", "F1@1", "B1@1", "B1@0"
    ]  # fmt: skip
    for order in stage_orders(model.spec):
        built = [w for w in model.order if w.stage == order[0].stage]
        assert built == order
    # Forward sends go to stage 1, backward sends to stage 0, one per
    # micro-batch each; differentiating through a send sends back.
    assert [(model.work[op].phase, op.mesh.name) for op in model.sends] == [
        ("F", "stage_1"), ("B", "stage_0"), ("F", "stage_1"), ("B", "stage_0")
    ]  # fmt: skip
    x = model.sends[0].inputs[0]
    (dx,) = gradients([model.sends[0].outputs[0]], [x])
    assert dx is not None and dx.operation.op_type == "StageSend"
    assert dx.mesh is x.mesh


def test_1f1b_peak_memory_is_a_fraction_of_gpipes_when_run(devices: list[str]) -> None:
    """The order holds at run time: with 8 micro-batches on 2 stages GPipe
    keeps 8 micro-batches' activations on each stage, 1F1B 2 on the first
    and 1 on the last (held bytes 16 vs 3 times a stage's).  Measured: the
    peak of TensorFlow's CPU allocator (which the logical CPUs share)."""
    import tensorflow as tf

    from mtf_core.lowering.pipeline_step import PipelinedStep

    cfg = CFG.replace(num_layers=2, d_model=64, d_kv=16, d_ff=256, vocab=64,
                      length=128, batch=32)  # fmt: skip
    ids = np.random.default_rng(0).integers(0, 64, (32, 128)).astype(np.int32)
    batch = {"inputs": ids, "targets": np.roll(ids, -1, axis=1)}
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        model = build_pipelined_lm(cfg, PipelineStages(2, 8, schedule), "sgd", 0.1)
        step = PipelinedStep(model, "pp:2;dp:2", "batch:dp", devices)
        step(batch)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        step(batch)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        peaks[schedule] = peak - before
    # Measured once (whole process, load 2): 50.3 MB and 10.5 MB.
    assert peaks["1f1b"] < 0.4 * peaks["gpipe"], peaks


def test_bad_pipelines_are_refused_naming_the_value(devices: list[str]) -> None:
    from mtf_core.lowering.pipeline_step import PipelinedStep

    with pytest.raises(PipelineConfigError, match="3 pipeline stages do not divide 4"):
        build_pipelined_lm(CFG, PipelineStages(3, 4), "sgd")
    with pytest.raises(
        PipelineConfigError, match="3 micro-batches do not divide the batch of 8"
    ):
        build_pipelined_lm(CFG, PipelineStages(2, 3), "sgd")
    with pytest.raises(PipelineConfigError, match="'zigzag'"):
        PipelineStages(2, 4, "zigzag")
    with pytest.raises(PipelineConfigError, match="micro_batches"):
        PipelineStages(2, 0)
    model = build_pipelined_lm(CFG.replace(num_layers=2), PipelineStages(2, 2), "sgd")
    with pytest.raises(ConfigError, match="no pipeline axis 'pp'"):
        PipelinedStep(model, "dp:2;tp:2", RULES, devices)
    with pytest.raises(ConfigError, match="size 4 but the model has 2 stages"):
        PipelinedStep(model, "pp:4;dp:2", RULES, devices)
    step = PipelinedStep(model, MESH, RULES, devices)
    with pytest.raises(ConfigError, match=r"has shape \[8, 4\]; expected \[8, 8\]"):
        step({"inputs": np.zeros((8, 4), np.int32), "targets": np.zeros((8, 4))})


def test_a_pipelined_graph_round_trips_through_the_graph_format() -> None:
    from mtf_core.serialization import graph_from_dict, graph_to_dict

    model = build_pipelined_lm(CFG, PipelineStages(P, M, "1f1b"), "sgd", 0.5)
    doc = graph_to_dict(model.graph, outputs=[model.loss])
    again = graph_from_dict(doc)
    sends = [op for op in again.graph.operations if op.op_type == "StageSend"]
    assert len(sends) == 2 * M * (P - 1)  # activations forward, gradients back
    # Each send leaves its input's stage for the next (or previous) one.
    assert all(op.inputs[0].mesh is not op.outputs[0].mesh for op in sends)
    # The same ops on the same stages (initializers are not in the format).
    twice = graph_to_dict(again.graph, outputs=again.outputs)

    def ops(d: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [
            (o["name"], o["op_type"], o["mesh"], o["inputs"], o["outputs"])
            for o in d["operations"]
        ]

    assert ops(twice) == ops(doc)
