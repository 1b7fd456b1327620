"""``mtf.auto_layout``'s surface: the plan object, its dict form, explanations,
mesh-shape search and clear errors for bad requests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_planner_graphs import (
    INFINIBAND,
    MEGATRON_SIZES,
    NVLINK,
    mtf_example,
    transformer,
)

import mtf_core as mtf
from cost_models import HardwareError, HardwareProfile
from layout_planner import LayoutPlan, PlannerError
from layout_planner.mesh_search import factorizations
from layout_planner.options import DEFAULT_TIME_LIMIT_S

pytestmark = pytest.mark.solver


@pytest.fixture(scope="module")
def plan() -> LayoutPlan:
    model = transformer(batch=32, d_model=32, d_ff=128)
    return mtf.auto_layout(model.graph, "x:2;y:4", [model.loss], "cpu-host")


def test_plan_round_trips_through_json(plan: LayoutPlan) -> None:
    text = json.dumps(plan.to_dict())
    again = LayoutPlan.from_dict(json.loads(text))
    assert again == plan
    assert plan.evaluation is not None and again.evaluation is None  # not rebuilt
    assert again.to_dict()["candidates"] == plan.to_dict()["candidates"]
    d = plan.to_dict()
    assert d["layout_rules"] == str(plan.layout_rules)
    assert d["cost"]["comm_s_by_axis"] == dict(plan.cost.comm_s_by_axis)
    assert d["solver"]["status"] == "optimal" and d["solver"]["gap"] == 0.0
    assert d["evaluation"]["collectives"]  # evaluate()'s view, in lowering order
    assert {b["name"] for b in d["baselines"]} == {
        "replicated",
        "data-parallel",
        "megatron",
    }


def test_from_dict_rejects_an_unknown_format_version(plan: LayoutPlan) -> None:
    d = plan.to_dict()
    d["format_version"] = 99
    with pytest.raises(PlannerError, match="format_version 99"):
        LayoutPlan.from_dict(d)


def test_explain_says_where_each_dim_went_and_why(plan: LayoutPlan) -> None:
    text = plan.explain()
    for choice in plan.dims:
        assert f"  {choice.name} (" in text
    by_name = {c.name: c for c in plan.dims}
    split = [c for c in plan.dims if c.mesh_axis]
    assert split, "the plan splits something"
    for c in split:
        assert c.reason.startswith(f"split over {c.mesh_axis}")
        # Keeping it whole is priced and is no better under the objective.
        whole = next(a for a in c.alternatives if a.mesh_axis is None)
        assert whole.time_s is None or whole.time_s >= plan.cost.time_s
    assert by_name["d_kv"].mesh_axis is None or by_name["heads"].mesh_axis is None


def test_explain_names_unsplittable_and_indivisible_dims() -> None:
    ex = mtf_example(unstack=True)
    plan = mtf.auto_layout(ex.graph, "m1:4,m2:2", [ex.z], objective="memory")
    reasons = {c.name: c.reason for c in plan.dims}
    assert reasons["a"].startswith("kept whole: op unstack")
    assert (
        reasons["b"] == "kept whole: size 5 is divisible by no mesh axis (m1:4, m2:2)"
    )


def test_solver_stats_are_complete(plan: LayoutPlan) -> None:
    s = plan.solver
    assert s.status.value == "optimal"
    assert s.objective_value == pytest.approx(plan.cost.time_s, rel=1e-9)
    assert s.best_bound == pytest.approx(s.objective_value, rel=1e-9)
    assert s.num_variables > 0 and s.num_constraints > 0 and s.num_solves >= 1
    assert s.time_limit_s == DEFAULT_TIME_LIMIT_S and s.seed == 0 and s.verified
    assert s.problem["num_dims"] == 8 and s.problem["num_signatures"] > 0
    assert s.solved_in in ("inprocess", "subprocess")


def test_a_device_count_searches_mesh_shapes_and_puts_the_model_axis_in_a_host() -> (
    None
):
    hosts = HardwareProfile(
        "two-hosts-of-four",
        peak_flops=100e12,
        memory_bytes=80 * 2**30,
        hbm_bandwidth_bytes_per_s=2e12,
        default_link=NVLINK,
        devices_per_host=4,
        intra_host_link=NVLINK,
        inter_host_link=INFINIBAND,
    )
    model = transformer(**MEGATRON_SIZES)
    plan = mtf.auto_layout(model.graph, 8, [model.loss], hosts, top_k=2)
    assert [t.mesh_shape for t in plan.mesh_trials] == ["x:8", "x:4;y:2", "x:2;y:4"]
    assert str(plan.mesh_shape) == "x:2,y:4"
    assert str(plan.layout_rules) == "batch:x;d_ff:y;heads:y;vocab:y"
    best = min(t.objective_value for t in plan.mesh_trials)
    assert plan.solver.objective_value == pytest.approx(best, rel=1e-12)
    assert len(plan.candidates) == 2


def test_factorizations_are_ordered_shortest_first() -> None:
    assert factorizations(8, 3) == [
        (8,),
        (4, 2),
        (2, 4),
        (2, 2, 2),
    ]
    assert factorizations(12, 2, ordered=False) == [(12,), (6, 2), (4, 3)]
    assert factorizations(1, 2) == [(1,)]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"objective": "speed"}, PlannerError, "objective 'speed' is unknown"),
        ({"top_k": 0}, PlannerError, "top_k is 0; expected an integer >= 1"),
        ({"time_limit_s": -1}, PlannerError, "time_limit_s is -1"),
        ({"num_workers": 0}, PlannerError, "num_workers is 0"),
        ({"memory_limit": -5}, PlannerError, "memory_limit is -5"),
        ({"memory_limit": 1e9 + 0.5}, PlannerError, "expected a positive whole"),
        ({"mesh_shape": "x:0"}, PlannerError, "mesh shape 'x:0' is invalid"),
        ({"mesh_shape": ""}, PlannerError, "has no axes"),
        ({"mesh_shape": 0}, PlannerError, "num_devices is 0"),
        ({"hardware": "abacus"}, HardwareError, "unknown hardware 'abacus'"),
    ],
)
def test_bad_requests_raise_errors_naming_the_value(kwargs, error, match) -> None:
    ex = mtf_example()
    args = {"mesh_shape": "x:2", **kwargs}
    with pytest.raises(error, match=match) as info:
        mtf.auto_layout(ex.graph, outputs=[ex.z], **args)
    assert isinstance(info.value, mtf.MtfError) and isinstance(info.value, ValueError)


def test_a_memory_limit_written_as_a_whole_float_is_those_bytes() -> None:
    ex = mtf_example()
    by_float = mtf.auto_layout(ex.graph, "x:2", outputs=[ex.z], memory_limit=1e9)
    by_int = mtf.auto_layout(ex.graph, "x:2", outputs=[ex.z], memory_limit=10**9)
    assert by_float.cost.memory_capacity_bytes == 10**9
    assert by_float.layout_rules == by_int.layout_rules
    assert by_float.cost == by_int.cost


def test_outputs_must_belong_to_the_graph() -> None:
    ex, other = mtf_example(), mtf_example()
    with pytest.raises(PlannerError, match="is not a tensor of this graph"):
        mtf.auto_layout(ex.graph, "x:2", outputs=[other.z])


def test_mtf_core_loads_the_planner_only_when_asked() -> None:
    code = (
        "import sys, mtf_core as mtf\n"
        "assert 'layout_planner' not in sys.modules\n"
        "assert 'ortools' not in sys.modules\n"
        "f = mtf.auto_layout\n"
        "assert 'layout_planner.planner' in sys.modules\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_integer_program_does_not_grow_with_depth() -> None:
    plans = [
        mtf.auto_layout(
            transformer(num_layers=n).graph,
            "x:2;y:4",
            (),
            "cpu-host",
            top_k=1,
            verify=False,
        )
        for n in (1, 4)
    ]
    shallow, deep = (p.solver for p in plans)
    assert deep.problem["num_ops"] > 2.5 * shallow.problem["num_ops"]
    assert deep.num_variables == shallow.num_variables
    assert deep.problem["num_dimsets"] == shallow.problem["num_dimsets"]
    assert deep.problem["num_signatures"] <= shallow.problem["num_signatures"] + 10


def test_explanations_write_times_and_sizes_in_three_digits_never_in_e_notation():
    from layout_planner.plan import fmt_bytes, fmt_s

    assert [fmt_s(s) for s in (0.9996, 0.00099996, 1234.5, -0.0046, 0, 2.5e-8)] == [
        "1 s", "1 ms", "1,234 s", "-4.6 ms", "0 s", "25 ns",
    ]  # fmt: skip
    assert [
        fmt_bytes(n) for n in (1000 * 2**20, 1023 * 2**10, -1020 * 2**20, 5 * 2**40, 12)
    ] == ["0.977 GiB", "0.999 MiB", "-0.996 GiB", "5,120 GiB", "12 B"]
