"""The planner's Python API, probed as a careless user would: bad arguments get
an error naming the value and what was expected, not a traceback from deep
inside (TypeError, KeyError, OverflowError, a CP-SAT error) or a hang."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import mtf_core as mtf
from cost_models.costs import evaluate
from cost_models.hardware import PRESETS, HardwareError, HardwareProfile, LinkSpec
from cost_models.profiles import get_hardware
from layout_planner import PlannerError, auto_mtf
from layout_planner.choices import plan_transformer, price_layout
from layout_planner.options import PlanOptions
from layout_planner.plan import LayoutPlan
from layout_planner.planner import auto_layout
from layout_planner.scale_plan import ScaleChoice, ScaleError
from mtf_core.errors import ConfigError, MtfError
from mtf_core.models import TransformerConfig

CFG = TransformerConfig(
    num_layers=2, d_model=32, heads=4, d_kv=8, d_ff=64, vocab=64, length=16, batch=8
)
CHOICE = ScaleChoice(1, 2, 2, 4, "1f1b", "none", "none")


def _graph() -> tuple[mtf.Graph, mtf.Tensor]:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "a:10,b:5")
    y = mtf.zeros(m, "b:5,c:20")
    return g, mtf.einsum([x, y], "a:10,c:20")


def _profile(**changes: object) -> dict[str, object]:
    d = copy.deepcopy(PRESETS["cpu-host"].to_dict())
    d.update(changes)
    return d


# -- auto_layout and Mesh TF's auto_mtf ---------------------------------------------
@pytest.mark.parametrize("outputs", [None, "tensor"])
def test_auto_layout_outputs_must_be_a_list(outputs: object) -> None:
    g, z = _graph()
    given = z if outputs == "tensor" else outputs
    with pytest.raises(PlannerError, match=r"outputs is (None|Tensor\[einsum)"):
        auto_layout(g, "x:2", given, num_workers=1)  # type: ignore[arg-type]


def test_auto_layout_progress_must_be_callable() -> None:
    g, z = _graph()
    with pytest.raises(PlannerError, match="progress is 1; expected a callable"):
        auto_layout(g, 4, [z], num_workers=1, progress=1)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_auto_layout_refuses_a_device_count_too_large_to_factorize() -> None:
    g, z = _graph()
    with pytest.raises(PlannerError, match=rf"num_devices is {2**70}; expected"):
        auto_layout(g, 2**70, [z], num_workers=1)


def test_auto_layout_takes_a_numpy_device_count() -> None:
    g, z = _graph()
    plan = auto_layout(g, np.int64(4), [z], num_workers=1)  # type: ignore[arg-type]
    assert plan.mesh_shape.size == 4
    assert auto_mtf.layout_and_mesh_shape(g, np.int64(8), [z])[1].size == 8  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field, value",
    [("num_workers", 10**6), ("num_workers", 10**30), ("seed", 2**40)],
)
def test_plan_options_keep_to_cp_sat_bounds(field: str, value: int) -> None:
    with pytest.raises(PlannerError, match=rf"{field} is {value}; expected an integer"):
        PlanOptions(**{field: value})  # type: ignore[arg-type]


def test_plan_options_replace_names_an_unknown_option() -> None:
    with pytest.raises(PlannerError, match=r"unknown plan option\(s\) \['topk'\]"):
        PlanOptions().replace(topk=2)


def test_auto_mtf_checks_its_arguments() -> None:
    g, z = _graph()
    with pytest.raises(PlannerError, match="mtf_outputs is None"):
        auto_mtf.layout(g, "m1:4", None)  # type: ignore[arg-type]
    with pytest.raises(PlannerError, match="max_mesh_shape_dimensions is '2'"):
        auto_mtf.layout_and_mesh_shape(g, 8, [z], "2")  # type: ignore[arg-type]


# -- plan_transformer and price_layout -----------------------------------------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"config": None}, "config is None"),
        ({"stages": [0]}, "stages size 0"),
        ({"tensor": ["2"]}, "tensor size '2'"),
        ({"tensor": 2}, "tensor is 2"),
        ({"sequence": None}, "sequence is None"),
        ({"recompute": [("x", "y")]}, r"recompute option \('x', 'y'\)"),
        ({"recompute": []}, r"recompute is \[\]"),
        ({"time_limit_s": "5"}, "time_limit_s is '5'"),
        ({"workers": 1.5}, "workers is 1.5"),
        ({"optimizer": None}, "optimizer is None"),
        ({"optimizer": "lamb"}, "unknown optimizer 'lamb'"),
        ({"encoder_decoder": "no"}, "encoder_decoder is 'no'"),
        ({"progress": 1}, "progress is 1"),
        ({"memory_limit": math.inf}, "memory_limit is inf"),
        ({"memory_limit": 0}, "memory_limit is 0; expected a positive whole"),
        ({"memory_limit": 1.5}, "memory_limit is 1.5"),
        ({"memory_limit": True}, "memory_limit is True"),
    ],
)
def test_plan_transformer_names_a_bad_argument(
    changes: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"workers": 1, "time_limit_s": 5.0, "verify": False}
    args.update(changes)
    config = args.pop("config", CFG)
    with pytest.raises(MtfError, match=message):
        plan_transformer(config, 4, "cpu-host", **args)  # type: ignore[arg-type]


def test_price_layout_checks_the_choice_and_takes_any_hardware_form() -> None:
    with pytest.raises(ScaleError, match=r"choice is \(1, 2, 2, 4\)"):
        price_layout(CFG, (1, 2, 2, 4), "batch:dp")  # type: ignore[arg-type]
    bad = ScaleChoice(1, 2.0, 2, 4, "1f1b", "none", "none")  # type: ignore[arg-type]
    with pytest.raises(ScaleError, match="choice.data is 2.0"):
        price_layout(CFG, bad, "batch:dp")
    by_dict = price_layout(CFG, CHOICE, "batch:dp", _profile())  # type: ignore[arg-type]
    by_name = price_layout(CFG, CHOICE, "batch:dp", "cpu-host")
    assert by_dict.step_time_s == by_name.step_time_s


# -- hardware profiles ----------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"memory_bytes": math.nan}, "memory_bytes is nan"),
        ({"memory_bytes": math.inf}, "memory_bytes is inf"),
        ({"memory_bytes": 0.5}, "memory_bytes is 0.5"),
        ({"peak_flops": 10**400}, "peak_flops is 1000"),
        (
            {
                "default_link": {
                    "name": "l",
                    "bandwidth_bytes_per_s": 1e9,
                    "latency_s": math.nan,
                }
            },
            "latency_s is nan",
        ),
        (
            {
                "default_link": {
                    "name": "l",
                    "bandwidth_bytes_per_s": 1e9,
                    "latency_s": math.inf,
                }
            },
            "latency_s is inf",
        ),
    ],
)
def test_hardware_profile_refuses_non_finite_values(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(HardwareError, match=message):
        get_hardware(_profile(**changes))


@pytest.mark.parametrize("axis_links", [5, [1]])
def test_hardware_profile_checks_axis_links(axis_links: object) -> None:
    with pytest.raises(HardwareError, match=r"axis_links (entry 1|is 5)"):
        HardwareProfile("a", 1.0, 5, 1.0, LinkSpec("l", 1.0, 0.0), axis_links)  # type: ignore[arg-type]


def test_get_hardware_names_a_profile_file_that_is_not_json(tmp_path: object) -> None:
    path = f"{tmp_path}/bad.json"
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(HardwareError, match=r"bad\.json' is not JSON"):
        get_hardware(path)


def test_a_profile_too_slow_to_count_is_a_planner_error() -> None:
    g, z = _graph()
    hw = _profile(peak_flops=1e-300, hbm_bandwidth_bytes_per_s=1e-300)
    with pytest.raises(PlannerError, match="peak_flops 1e-300"):
        auto_layout(g, "x:2", [z], hardware=hw, num_workers=1)


# -- evaluate and LayoutPlan.from_dict ------------------------------------------------
def test_evaluate_checks_graph_outputs_and_memory() -> None:
    g, z = _graph()
    with pytest.raises(MtfError, match="outputs is None"):
        evaluate(g, "x:2", "a:x", "cpu-host", None)  # type: ignore[arg-type]
    with pytest.raises(MtfError, match="graph None is not an mtf.Graph"):
        evaluate(None, "x:2", "a:x", "cpu-host", [])  # type: ignore[arg-type]
    with pytest.raises(MtfError, match="memory is 5"):
        evaluate(g, "x:2", "a:x", "cpu-host", [z], memory=5)  # type: ignore[arg-type]


def test_layout_plan_from_dict_names_what_is_wrong() -> None:
    g, z = _graph()
    d = auto_layout(g, "x:2", [z], num_workers=1).to_dict()
    with pytest.raises(PlannerError, match="layout plan None is not a mapping"):
        LayoutPlan.from_dict(None)  # type: ignore[arg-type]
    del d["cost"]
    with pytest.raises(PlannerError, match="malformed \\(KeyError: 'cost'\\)"):
        LayoutPlan.from_dict(d)


# -- TransformerConfig ----------------------------------------------------------------
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dropout_rate": "0.1"}, "dropout_rate must be a number, got '0.1'"),
        ({"z_loss": None}, "z_loss must be a number, got None"),
        ({"z_loss": math.nan}, "z_loss must be a finite number >= 0, got nan"),
        ({"z_loss": math.inf}, "z_loss must be a finite number >= 0, got inf"),
        ({"expert_capacity_factor": math.inf}, "expert_capacity_factor .* got inf"),
        ({"activation": ["relu"]}, r"activation must be a string, got \['relu'\]"),
    ],
)
def test_transformer_config_names_a_bad_field(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        TransformerConfig(**changes)  # type: ignore[arg-type]


def test_transformer_config_replace_and_from_dict_check_their_input() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown TransformerConfig field\(s\) \['layers'\]"
    ):
        CFG.replace(layers=4)
    with pytest.raises(ConfigError, match="TransformerConfig data None"):
        TransformerConfig.from_dict(None)  # type: ignore[arg-type]
    # numpy floats stay good numbers
    assert TransformerConfig(dropout_rate=np.float32(0.1)).dropout_rate == np.float32(
        0.1
    )  # type: ignore[arg-type]


# -- numpy numbers, as sizes computed with numpy are ---------------------------------
def test_configs_and_options_take_numpy_numbers_as_plain_ones() -> None:
    cfg = TransformerConfig(
        num_layers=np.int64(2),  # type: ignore[arg-type]
        batch=np.int32(8),  # type: ignore[arg-type]
        experts=np.int8(0),  # type: ignore[arg-type]
        dropout_rate=np.float32(0.5),  # type: ignore[arg-type]
    )
    assert (cfg.num_layers, cfg.batch, cfg.experts) == (2, 8, 0)
    assert type(cfg.num_layers) is int and type(cfg.dropout_rate) is float
    assert cfg == TransformerConfig(num_layers=2, batch=8, dropout_rate=0.5)
    opts = PlanOptions(
        top_k=np.int16(3),  # type: ignore[arg-type]
        num_workers=np.int64(2),  # type: ignore[arg-type]
        time_limit_s=np.float32(1.5),  # type: ignore[arg-type]
        memory_limit_bytes=np.uint64(10**9),  # type: ignore[arg-type]
    )
    assert (opts.top_k, opts.num_workers, opts.memory_limit_bytes) == (3, 2, 10**9)
    assert type(opts.num_workers) is int and opts.time_limit_s == 1.5
    # a numpy float or bool is still no count
    with pytest.raises(
        ConfigError, match=r"num_layers must be .* got np.float64\(2.0\)"
    ):
        TransformerConfig(num_layers=np.float64(2.0))  # type: ignore[arg-type]
    with pytest.raises(PlannerError, match=r"seed is np.True_"):
        PlanOptions(seed=np.bool_(True))  # type: ignore[arg-type]


def test_plan_transformer_and_price_layout_take_numpy_sizes() -> None:
    sizes = iter([np.int64(1), np.int64(2)])  # an iterator is read once
    plan = plan_transformer(
        CFG,
        np.int64(4),  # type: ignore[arg-type]
        "cpu-host",
        stages=sizes,
        tensor=np.array([1, 2]),
        workers=1,
        verify=False,
    )
    assert plan.devices == 4 and type(plan.devices) is int
    assert {t.choice.stages for t in plan.trials} <= {1, 2}
    assert {t.choice.tensor for t in plan.trials} == {1, 2}
    plain = plan_transformer(
        CFG, 4, "cpu-host", stages=[1, 2], tensor=[1, 2], workers=1, verify=False
    )
    assert [t.choice for t in plan.trials] == [t.choice for t in plain.trials]
    numpy_choice = ScaleChoice(
        np.int64(1),
        np.int64(2),
        2,
        np.int32(4),
        "1f1b",
        "none",
        "none",  # type: ignore[arg-type]
    )
    priced = price_layout(CFG, numpy_choice, "batch:dp;heads:tp", "cpu-host")
    assert priced.choice == CHOICE
    assert (
        priced.pipeline
        == price_layout(CFG, CHOICE, "batch:dp;heads:tp", "cpu-host").pipeline
    )
