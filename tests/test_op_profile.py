"""Where a measured step's time went: TensorFlow's profiler read per op class
(mtf_core.lowering.op_profile), on a real compiled step of 4 logical CPUs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core.errors import ConfigError
from mtf_core.lowering.op_profile import kernel_seconds, op_class_of_type, profile_step
from mtf_core.models import MlpConfig, build_mlp_classifier

pytestmark = pytest.mark.tf


def test_op_types_map_to_the_cost_models_classes() -> None:
    assert op_class_of_type("_MklMatMul") == "matmul"
    assert op_class_of_type("BatchMatMulV2") == "matmul"
    assert op_class_of_type("Softmax") == "transcendental"
    assert op_class_of_type("Sum") == "reduce"
    assert op_class_of_type("AddN") == "add_n"
    assert op_class_of_type("CollectiveReduceV2") == "collective"
    assert op_class_of_type("Mul") == "elementwise"


def test_only_kernel_events_count_and_callers_are_not_counted_twice() -> None:
    events = [
        ("layer/MatMul:_MklMatMul", 2.0),
        ("MatMul_1:MatMul", 1.0),
        ("Softmax:Softmax", 0.5),
        ("ExecutorState::Process", 9.0),  # a host event, not a kernel
        ("EagerLocalExecute: __inference_f_15", 9.0),
        ("StatefulPartitionedCall:StatefulPartitionedCall", 9.0),  # its callees
        ("add:AddV2", 0.25),
    ]
    assert kernel_seconds(events) == {
        "matmul": 3.0,
        "transcendental": 0.5,
        "elementwise": 0.25,
    }


def _step(devices: list[str]) -> tuple[Any, list[Any]]:
    cfg = MlpConfig(batch=256, features=64, hidden=256, classes=8)
    model = build_mlp_classifier(cfg, optimizer="sgd", learning_rate=0.1)
    impl = mtf.PlacementMeshImpl("x:4", "batch:x", devices[:4])
    step = mtf.compile_function(
        model.graph, {model.mesh: impl}, model.placeholders, [model.loss], model.updates
    )
    rng = np.random.RandomState(0)
    x = rng.standard_normal([256, 64]).astype(np.float32)
    y = rng.randint(0, 8, [256]).astype(np.int32)
    return step, [x, y]


def test_a_data_parallel_step_spends_its_time_in_matmuls_and_placed_sums(
    devices: list[str],
) -> None:
    step, args = _step(devices)
    prof = profile_step(step, args, steps=2)
    assert prof["total"] == pytest.approx(
        sum(v for k, v in prof.items() if k != "total")
    )
    # Forward and backward matmuls of the 3 layers ran on every device; the
    # weight gradients' allreduce over x is the placement backend's add_n.
    assert prof["matmul"] > 0 and prof["add_n"] > 0
    assert prof["total"] < 60  # seconds per step: device-seconds, not garbage
    assert set(prof) <= {
        "matmul", "transcendental", "reduce", "gather", "random", "movement",
        "assign", "collective", "add_n", "transfer", "elementwise", "total",
    }  # fmt: skip


def test_profile_steps_must_be_positive(devices: list[str]) -> None:
    with pytest.raises(ConfigError, match="steps must be at least 1, got 0"):
        profile_step(lambda: None, steps=0)


def test_selu_is_priced_as_a_transcendental_op() -> None:
    from cost_models.op_classes import op_class

    graph = mtf.Graph()
    x = mtf.zeros(mtf.Mesh(graph, "m"), "a:4")
    assert op_class(mtf.selu(x).operation) == "transcendental"
    assert op_class(mtf.relu(x).operation) == "elementwise"
