"""PlanOptions: the one value type for a plan's parameters, from
``mtf.auto_layout`` through the wire schema to the solve worker."""

from __future__ import annotations

import dataclasses

import pytest
from api_cases import mlp_doc, service_settings

import mtf_core as mtf
from api.cli import _parser
from api.planning import plan_options, plan_spec
from api.schemas import PlanRequest
from cost_models.hardware import PRESETS
from layout_planner import PlannerError
from layout_planner.options import DEFAULT_TIME_LIMIT_S, SERVER_CHOSEN, PlanOptions
from layout_planner.program import Objective


def test_defaults_are_canonical_values() -> None:
    o = PlanOptions()
    assert o.hardware is PRESETS["cpu-host"] and o.objective is Objective.TIME
    assert (o.top_k, o.time_limit_s, o.max_mesh_dims) == (5, DEFAULT_TIME_LIMIT_S, 2)
    assert (o.memory_limit_bytes, o.num_workers, o.seed, o.verify) == (
        None,
        None,
        0,
        True,
    )
    # strings at the edge become objects
    p = PlanOptions(hardware="h100-nvlink-ib", objective="memory", time_limit_s=3)
    assert p.hardware is PRESETS["h100-nvlink-ib"] and p.objective is Objective.MEMORY
    assert p.time_limit_s == 3.0 and isinstance(p.time_limit_s, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.top_k = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("top_k", 0, "top_k is 0; expected an integer >= 1"),
        ("top_k", True, "top_k is True"),
        ("time_limit_s", float("nan"), "time_limit_s is nan; expected seconds > 0"),
        ("time_limit_s", 0, "time_limit_s is 0"),
        ("time_limit_s", "10", "time_limit_s is '10'"),
        (
            "memory_limit_bytes",
            -1,
            "memory_limit is -1; expected a positive whole number",
        ),
        ("memory_limit_bytes", 1.5, "memory_limit is 1.5"),
        ("max_mesh_dims", 0, "max_mesh_dims is 0; expected an integer >= 1"),
        ("num_workers", 0, "num_workers is 0; expected an integer >= 1"),
        ("seed", -1, "seed is -1; expected an integer >= 0"),
        ("verify", "yes", "verify is 'yes'; expected True or False"),
        ("objective", "speed", "objective 'speed' is unknown"),
    ],
)
def test_bad_values_name_the_field_and_value(field, value, message) -> None:
    with pytest.raises(PlannerError, match=message.replace("(", r"\(")) as e:
        PlanOptions(**{field: value})
    assert isinstance(e.value, ValueError)


def test_to_dict_round_trips_and_from_dict_rejects_unknown_keys() -> None:
    o = PlanOptions(
        hardware=PRESETS["h100-nvlink-ib"].with_memory(2**30),
        objective="memory",
        memory_limit_bytes=2**29,
        top_k=3,
        time_limit_s=2.5,
        max_mesh_dims=3,
        num_workers=2,
        seed=7,
        verify=False,
    )
    d = o.to_dict()
    assert PlanOptions.from_dict(d) == o
    assert PlanOptions.from_dict({}) == PlanOptions()
    with pytest.raises(
        PlannerError, match=r"unknown plan option\(s\) \['time_limit'\]"
    ):
        PlanOptions.from_dict({"time_limit": 3})
    wire = o.to_request_dict()
    assert not set(SERVER_CHOSEN) & set(wire)
    assert PlanOptions(hardware="tpu-v5e").to_request_dict()["hardware"] == ("tpu-v5e")
    assert isinstance(wire["hardware"], dict)  # not a preset: the whole profile


def test_the_wire_schema_converts_to_the_same_options(tmp_path) -> None:
    doc = mlp_doc(hidden=16, batch=8)
    # the wire's defaults are the library's
    assert plan_options(PlanRequest(graph=doc, mesh_shape="x:2")) == PlanOptions()
    o = PlanOptions(
        hardware="h100-nvlink-ib", objective="memory", top_k=2, time_limit_s=4.0
    )
    req = PlanRequest(graph=doc, num_devices=4, **o.to_request_dict())
    assert plan_options(req) == o
    spec = plan_spec(req, service_settings(tmp_path))
    assert spec.options == o
    task = spec.task(solver_threads=3)
    assert PlanOptions.from_dict(task["options"]) == o.replace(num_workers=3)
    assert spec.describe()["time_limit_s"] == 4.0
    assert spec.describe()["hardware"] == "h100-nvlink-ib"
    # the server's own choices (threads) do not change the cache key
    assert plan_spec(req, service_settings(tmp_path)).request_hash == spec.request_hash


def test_cli_api_and_library_share_one_default_time_limit() -> None:
    args = _parser().parse_args(["plan", "g.json", "--mesh", "x:2"])
    assert args.time_limit == DEFAULT_TIME_LIMIT_S
    assert PlanRequest.model_fields["time_limit_s"].default == DEFAULT_TIME_LIMIT_S
    import inspect

    from layout_planner.planner import auto_layout

    default = inspect.signature(auto_layout).parameters["time_limit_s"].default
    assert default == DEFAULT_TIME_LIMIT_S


@pytest.mark.solver
def test_auto_layout_takes_options_or_keywords_not_both() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "a:8,b:4")
    y = mtf.reduce_sum(x * 2.0, output_shape="a:8")
    o = PlanOptions(objective="memory", top_k=1)
    by_options = mtf.auto_layout(g, "x:2", [y], options=o)
    by_keywords = mtf.auto_layout(g, "x:2", [y], objective="memory", top_k=1)
    assert by_options.layout_rules == by_keywords.layout_rules
    assert by_options.solver.time_limit_s == DEFAULT_TIME_LIMIT_S
    with pytest.raises(PlannerError, match="not both"):
        mtf.auto_layout(g, "x:2", [y], top_k=2, options=o)
    with pytest.raises(PlannerError, match="is not a PlanOptions"):
        mtf.auto_layout(g, "x:2", [y], options={"top_k": 1})  # type: ignore[arg-type]
