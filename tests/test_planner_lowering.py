"""Every plan lowers and runs: the planner never picks what the lowering cannot
do, the lowering's counters record exactly the collectives the plan predicts,
and the planned layout computes the same loss as one device."""

from __future__ import annotations

import numpy as np
import pytest
from test_planner_graphs import mtf_example, transformer

import mtf_core as mtf
from mtf_core.liveness import step_targets

pytestmark = [pytest.mark.tf, pytest.mark.solver]


def lower(graph, mesh, mesh_shape, rules, devices, feeds, outputs):
    n = mtf.convert_to_shape(mesh_shape).size
    impl = mtf.PlacementMeshImpl(mesh_shape, rules, devices[:n])
    # what a step exporting the outputs lowers (and the plan prices)
    targets = step_targets(graph, outputs)
    lowering = mtf.Lowering(graph, {mesh: impl}, feeds=feeds, targets=targets)
    values = [lowering.export_to_tf_tensor(t).numpy() for t in outputs]
    return lowering.counters, values


def recorded(counters) -> list[tuple[str, tuple[str, ...], int]]:
    return [(c.kind, c.mesh_axes, c.bytes_per_device) for c in counters.collectives]


def predicted(plan) -> list[tuple[str, tuple[str, ...], int]]:
    return [
        (c.kind, c.mesh_axes, c.bytes_per_device) for c in plan.evaluation.collectives
    ]


@pytest.mark.parametrize(
    "mesh_shape, hardware, objective",
    [
        ("x:2;y:2", "cpu-host", "time"),
        ("x:2;y:4", "cpu-host", "time"),
        ("x:2;y:2", "cpu-host", "memory"),
    ],
)
def test_planned_transformer_lowers_with_the_predicted_collectives(
    mesh_shape: str, hardware: str, objective: str, devices: list[str]
) -> None:
    model = transformer(batch=32, d_model=32, d_ff=128)
    rng = np.random.RandomState(0)
    feeds = {
        t: rng.randint(0, 64, size=t.shape.to_integer_list()).astype(np.int32)
        for t in model.placeholders
    }
    plan = mtf.auto_layout(
        model.graph, mesh_shape, [model.loss], hardware, objective, top_k=1
    )
    assert plan.ok and str(plan.layout_rules), "a layout that splits something"
    counters, (loss,) = lower(
        model.graph,
        model.mesh,
        mesh_shape,
        plan.layout_rules,
        devices,
        feeds,
        [model.loss],
    )
    assert recorded(counters) == predicted(plan)
    assert counters.get("flops_per_device", 0.0) == pytest.approx(
        plan.evaluation.flops_per_device, rel=1e-12
    )
    _, (reference,) = lower(
        model.graph, model.mesh, "all:1", "", devices, feeds, [model.loss]
    )
    np.testing.assert_allclose(loss, reference, rtol=2e-5)


def test_mtf_example_plan_lowers_to_the_same_values(devices: list[str]) -> None:
    ex = mtf_example()
    plan = mtf.auto_layout(ex.graph, "m1:4,m2:2", [ex.z], objective="memory")
    counters, (z,) = lower(
        ex.graph, ex.mesh, "m1:4,m2:2", plan.layout_rules, devices, {}, [ex.z]
    )
    assert recorded(counters) == predicted(plan) == []
    np.testing.assert_array_equal(z, np.zeros((10, 20), np.float32))
