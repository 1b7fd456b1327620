"""Optimizer slots only sharding (ZeRO-1, Megatron-LM's distributed optimizer).

A weight class's slot name ``d_model_slots_<class>`` on the data axis keeps
the weight whole (no gather on read), reduce-scatters its gradient over the
data axis, keeps the Adam slots in shards and all-gathers the updated shard.
The placement lowering issues exactly what ``evaluate`` prices, the values
are the plain layout's, and the slots take 1/n of the bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_scale_stored_weights import (
    CFG,
    CLASSES,
    MEGATRON,
    MESH,
    ZERO,
    losses,
    lowered,
    specs,
)

import mtf_core as mtf
from cost_models import evaluate, get_hardware
from mtf_core.comm import LayoutContext
from mtf_core.errors import ConfigError, GraphError
from mtf_core.models import TransformerConfig, build_lm
from mtf_core.ops.stored import slot_names

SLOTS = MEGATRON + ";" + ";".join(f"d_model_slots_{c}:dp" for c in CLASSES)
BOTH = ZERO + ";" + ";".join(f"d_model_slots_{c}:dp" for c in CLASSES)
SLOT_CFG = CFG.replace(shardable_weights=True, shardable_slots=True)
HW = get_hardware("h100-nvlink-ib")


def _sharded_slot_bytes(graph: mtf.Graph, rules: str) -> int:
    """Per device, the bytes of the Adam slots kept under slot names."""
    ctx = LayoutContext.make(MESH, rules)
    return sum(
        ctx.slice_bytes(v.shape, v.dtype)
        for v in graph.all_variables
        if "/adam_" in v.name
        and any(n.startswith("d_model_slots_") for n in v.shape.dimension_names)
    )


@pytest.mark.tf
def test_slots_only_lowers_with_exactly_the_predicted_collectives(
    devices: list[str],
) -> None:
    counters, cost = lowered(SLOT_CFG, SLOTS, devices)
    assert specs(counters.collectives) == specs(cost.collectives)
    assert counters["flops_per_device"] == pytest.approx(cost.flops_per_device, 1e-12)
    # One reduce-scatter over dp per sharded weight (q, k, v, o, wi, wo per
    # layer; embedding, positions, logits): wi's whole tp-split float32
    # gradient [d_model 32, d_ff 64/2] per device goes in.
    scatters = counters.of_kind("reducescatter")
    assert len(scatters) == 2 * 6 + 3
    assert {c.mesh_axes for c in scatters} == {("dp",)}
    assert sorted(c.bytes_per_device for c in scatters).count(32 * 32 * 4) == 4
    # Nothing is gathered on read; the updated shard is gathered once.
    gathers = counters.of_kind("allconcat")
    assert not [c for c in gathers if c.op_type == "StoredRead"]
    after = [c for c in gathers if c.op_name.endswith("/gather")]
    assert len(after) == 2 * 6 + 3 and {c.mesh_axes for c in after} == {("dp",)}
    # No weight gradient is allreduced over dp any more (only the norms' and
    # biases', which have no d_model-and-another-dim shape).
    _, plain = lowered(CFG, MEGATRON, devices)
    dp_plain = [c for c in plain.collectives if c.mesh_axes == ("dp",)]
    dp_ours = [
        c for c in cost.collectives if c.mesh_axes == ("dp",) and c.kind == "allreduce"
    ]
    assert len(dp_ours) == len(dp_plain) - (2 * 6 + 3)
    # Weights stay whole; the sharded slots take exactly a quarter.
    assert cost.param_bytes_per_device == plain.param_bytes_per_device
    graph = build_lm(SLOT_CFG, optimizer="adam").graph
    whole = _sharded_slot_bytes(graph, MEGATRON)
    quarter = _sharded_slot_bytes(graph, SLOTS)
    assert whole == 4 * quarter > 0
    assert cost.slot_bytes_per_device == plain.slot_bytes_per_device - whole + quarter


@pytest.mark.tf
def test_slots_only_trains_to_the_plain_layouts_values(devices: list[str]) -> None:
    plain, _ = losses(CFG, MEGATRON, devices, 3)
    ours, step = losses(SLOT_CFG, SLOTS, devices, 3)
    np.testing.assert_allclose(ours, plain, rtol=1e-5)
    assert plain[2] < plain[0]
    by_name = {v.name: v for v in step.variables.graph.all_variables}
    wi = by_name[next(n for n in by_name if n.endswith("ffn_wi_kernel"))]
    m = by_name[wi.name + "/adam_m"]
    # The weight is whole over dp (split over tp only), its slot a quarter.
    assert wi.shape.dimension_names[0] == "d_model_stored_ffn"
    assert m.shape.dimension_names[0] == "d_model_slots_ffn"
    assert step.variables.slices(wi)[0].shape == (32, 64 // 2)
    assert step.variables.slices(m)[0].shape == (32 // 4, 64 // 2)


@pytest.mark.tf
def test_slots_only_in_bfloat16_scatters_bfloat16_gradients(devices: list[str]) -> None:
    cfg = SLOT_CFG.replace(activation_dtype="bfloat16")
    counters, cost = lowered(cfg, SLOTS, devices)
    assert specs(counters.collectives) == specs(cost.collectives)
    wi = [
        c
        for c in counters.of_kind("reducescatter")
        if c.bytes_per_device == 32 * 32 * 2
    ]
    assert len(wi) == 4  # wi and wo of both layers, in bfloat16
    # ... and the updated float32 shard ([d_model 32/4, d_ff 64/2]) is
    # gathered in float32.
    after = [c for c in counters.of_kind("allconcat") if c.op_name.endswith("/gather")]
    assert [c.bytes_per_device for c in after].count(32 // 4 * 32 * 4) == 4


def test_unsplit_slot_names_cost_what_the_plain_layout_costs() -> None:
    cfg = SLOT_CFG.replace(activation_dtype="bfloat16")
    ours = build_lm(cfg, optimizer="adam")
    plain = build_lm(CFG.replace(activation_dtype="bfloat16"), optimizer="adam")
    a = evaluate(ours.graph, MESH, MEGATRON, HW, [ours.loss])
    b = evaluate(plain.graph, MESH, MEGATRON, HW, [plain.loss])
    assert sorted(specs(a.collectives)) == sorted(specs(b.collectives))
    assert a.param_bytes_per_device == b.param_bytes_per_device
    assert a.slot_bytes_per_device == b.slot_bytes_per_device


def test_stored_and_slot_names_on_one_axis_cost_what_stored_alone_costs() -> None:
    """ZeRO-3 through both names: the slots follow the stored shard, the
    renames between them are free."""
    cfg = CFG.replace(shardable_weights=True, activation_dtype="bfloat16")
    stored = build_lm(cfg, optimizer="adam")
    both = build_lm(cfg.replace(shardable_slots=True), optimizer="adam")
    a = evaluate(stored.graph, MESH, ZERO, HW, [stored.loss])
    b = evaluate(both.graph, MESH, BOTH, HW, [both.loss])
    assert sorted(specs(a.collectives)) == sorted(specs(b.collectives))
    assert a.slot_bytes_per_device == b.slot_bytes_per_device
    assert a.param_bytes_per_device == b.param_bytes_per_device


def test_slot_names_need_a_callable_policy_and_existing_dims() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    with pytest.raises(GraphError, match="not callable"):
        with slot_names(g, "d:d_slots"):  # type: ignore[arg-type]
            pass
    with slot_names(g, lambda name, shape: {"x": "x_slots"}):
        with pytest.raises(GraphError, match="'x'.*no such dimension"):
            mtf.get_variable(m, "w", "d:4,e:2")


def test_slots_only_is_a_config_flag_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="shardable_slots must be True or False"):
        TransformerConfig(shardable_slots="yes")  # type: ignore[arg-type]


def test_pipelined_slots_only_gathers_once_per_step_not_per_micro_batch() -> None:
    from layout_planner.choices import ScaleChoice, price_layout

    cfg = TransformerConfig(
        num_layers=4, d_model=256, heads=8, d_kv=32, d_ff=1024, vocab=512,
        length=64, batch=64, activation_dtype="bfloat16",
    )  # fmt: skip
    choice = ScaleChoice(2, 4, 2, 16, "1f1b", "none", "none")
    classes = ";".join(f"d_model_{{}}_{c}:dp" for c in CLASSES)
    both = classes.format(*["stored"] * 4) + ";" + classes.format(*["slots"] * 4)
    stored = price_layout(cfg, choice, MEGATRON + ";" + both)  # ZeRO-3
    slots = price_layout(cfg, choice, MEGATRON + ";" + classes.format(*["slots"] * 4))
    plain = price_layout(cfg, choice, MEGATRON)
    assert slots.slot_sharded_classes == tuple(sorted(CLASSES))
    assert stored.sharded_classes == tuple(sorted(CLASSES))
    assert not stored.slot_sharded_classes
    # Stored weights are gathered in every micro-batch's forward pass (16 per
    # step); slots-only gathers each updated shard once per step.
    assert slots.pipeline.per_micro_batch_s < stored.pipeline.per_micro_batch_s
    assert slots.step_time_s < stored.step_time_s
    # Slots-only: the plain layout's per-micro-batch work, and once per step
    # a reduce-scatter plus a gather (the allreduce's bytes) with a quarter
    # of the Adam update; whole weights and quarter slots: less memory.
    assert slots.pipeline.per_micro_batch_s == pytest.approx(
        plain.pipeline.per_micro_batch_s, rel=1e-9
    )
    assert slots.pipeline.once_s < plain.pipeline.once_s
    assert slots.peak_memory_bytes < plain.peak_memory_bytes
    assert "optimizer slots only sharded" in slots.explain()


@pytest.mark.solver
def test_planner_chooses_slots_only_per_class_when_adam_state_does_not_fit() -> None:
    cfg = TransformerConfig(
        num_layers=2, d_model=1024, heads=8, d_kv=128, d_ff=4096, vocab=1024,
        length=64, batch=512, activation_dtype="bfloat16",
    )  # fmt: skip
    plain = build_lm(cfg, optimizer="adam")
    slots = build_lm(cfg.replace(shardable_slots=True), optimizer="adam")
    free = mtf.auto_layout(plain.graph, "x:8", [plain.loss], HW, top_k=1)
    assert str(free.layout_rules) == "batch:x"
    limit = int(free.cost.peak_memory_bytes * 0.8)
    tight = mtf.auto_layout(
        slots.graph, "x:8", [slots.loss], HW, memory_limit=limit, top_k=1
    )
    assert tight.cost.fits and tight.cost.peak_memory_bytes <= limit
    rules = dict(tight.layout_rules)
    assert rules["batch"] == "x"
    assert all(rules[f"d_model_slots_{c}"] == "x" for c in CLASSES)
    # Weights stay whole: the plain layout's parameter bytes.
    assert tight.evaluation is not None and free.evaluation is not None
    assert (
        tight.evaluation.param_bytes_per_device
        == free.evaluation.param_bytes_per_device
    )
    text = tight.explain()
    assert "d_model_slots_ffn (1024) -> x: split over x (8 ways)" in text
    assert "would not fit" in text
