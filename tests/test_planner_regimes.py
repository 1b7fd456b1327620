"""Under the time objective the planner finds the plans practitioners use, in
the regimes where they pay: Megatron-style model parallelism, data
parallelism, and weights split once replicating them no longer fits."""

from __future__ import annotations

import pytest
from test_planner_graphs import (
    DATA_PARALLEL_SIZES,
    MEGATRON_HW,
    MEGATRON_MESH,
    MEGATRON_SIZES,
    PRESSURE_HW,
    PRESSURE_MESH,
    PRESSURE_SIZES,
    gpu,
    transformer,
)

import mtf_core as mtf

pytestmark = pytest.mark.solver


def baseline(plan: mtf.LayoutPlan, name: str):  # type: ignore[name-defined]
    return next(b for b in plan.baselines if b.name == name)


def test_transformer_with_fast_model_axis_gets_megatrons_plan() -> None:
    model = transformer(**MEGATRON_SIZES)
    plan = mtf.auto_layout(model.graph, MEGATRON_MESH, [model.loss], MEGATRON_HW)
    assert str(plan.layout_rules) == "batch:batch;d_ff:model;heads:model;vocab:model"
    megatron = baseline(plan, "megatron")
    assert megatron.layout_rules == plan.layout_rules
    # It beats the other baselines, and its communication is on both axes:
    # gradients over the slow batch axis, activations over the fast model axis.
    for name in ("replicated", "data-parallel"):
        assert plan.cost.time_s < baseline(plan, name).cost.time_s
    assert {a for a, _ in plan.cost.comm_s_by_axis} == {"batch", "model"}
    assert plan.solver.gap == 0.0 and plan.solver.verified


def test_large_batch_small_weights_gets_data_parallel() -> None:
    model = transformer(**DATA_PARALLEL_SIZES)
    plan = mtf.auto_layout(model.graph, "all:8", [model.loss], gpu())
    assert str(plan.layout_rules) == "batch:all"
    assert baseline(plan, "data-parallel").layout_rules == plan.layout_rules
    assert plan.cost.time_s < baseline(plan, "megatron").cost.time_s
    # Data parallelism communicates gradients only: allreduces of exactly the
    # (replicated) parameter bytes, plus the 4-byte loss.
    ev = plan.evaluation
    assert ev is not None
    assert {c.kind for c in ev.collectives} == {"allreduce"}
    assert (
        sum(c.bytes_per_device for c in ev.collectives) == ev.param_bytes_per_device + 4
    )


def test_weights_and_slots_that_do_not_fit_replicated_get_split() -> None:
    model = transformer(**PRESSURE_SIZES)
    free = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, top_k=1
    )
    # Without memory pressure the fastest plan replicates every weight.
    assert str(free.layout_rules) == "batch:b"
    assert free.evaluation is not None
    replicated_weights = (
        free.evaluation.param_bytes_per_device + free.evaluation.slot_bytes_per_device
    )
    limit = free.cost.peak_memory_bytes - replicated_weights // 4
    plan = mtf.auto_layout(
        model.graph, PRESSURE_MESH, [model.loss], PRESSURE_HW, memory_limit=limit
    )
    assert plan.ok and plan.cost.peak_memory_bytes <= limit
    assert plan.evaluation is not None
    assert (
        plan.evaluation.param_bytes_per_device + plan.evaluation.slot_bytes_per_device
        < replicated_weights
    )
    assert plan.layout_rules.mesh_dimension_name("batch") == "b"
    assert {d for d, _ in plan.layout_rules} & {"d_ff", "heads", "d_model", "vocab"}
    assert not baseline(plan, "data-parallel").cost.fits
    # Splitting weights over the slow axis costs time: the plan is slower.
    assert plan.cost.time_s > free.cost.time_s


def test_when_nothing_fits_the_plan_says_which_tensors_and_by_how_much() -> None:
    model = transformer()
    plan = mtf.auto_layout(
        model.graph, "x:2;y:2", [model.loss], gpu(), memory_limit=10_000
    )
    assert plan.status.value == "infeasible" and not plan.ok and not plan.fits
    assert plan.candidates == ()
    over = plan.cost.peak_memory_bytes - 10_000
    assert over > 0
    assert f"({over:,} B) over" in plan.reason
    assert "nothing fits in 9.77 KiB per device" in plan.reason
    # The layout shown is the one with the smallest peak.
    smallest = mtf.auto_layout(
        model.graph, "x:2;y:2", [model.loss], gpu(), objective="memory", top_k=1
    )
    assert plan.cost.peak_memory_bytes == smallest.cost.peak_memory_bytes
    # Asked for the smallest peak under that limit, the answer is the same:
    # nothing fits, the same layout, the same reason.
    least = mtf.auto_layout(
        model.graph, "x:2;y:2", [model.loss], gpu(), memory_limit=10_000,
        objective="memory",
    )  # fmt: skip
    assert least.status.value == "infeasible" and not least.ok and not least.fits
    assert least.layout_rules == plan.layout_rules
    assert least.cost.peak_memory_bytes == plan.cost.peak_memory_bytes
    assert least.reason == plan.reason
    assert smallest.status.value == "optimal" and smallest.fits
