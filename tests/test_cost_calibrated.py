"""The calibrated cost model: per-op-class rates priced exactly, counts unchanged,
least-squares fits that recover known rates, refits that move towards what
was measured.  No TensorFlow."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import mtf_core as mtf
from cost_models import evaluate, get_hardware
from cost_models.calibration import (
    Measurement,
    fit_profile,
    fit_rates,
    predict_s,
    refit,
    step_features,
)
from cost_models.feature_names import FEATURES
from cost_models.hardware import Calibration, HardwareError
from cost_models.op_classes import op_class, roofline_rates
from cost_models.units import cost_units, unit_cost
from mtf_core.liveness import step_operations
from mtf_core.models import MlpConfig, TransformerConfig, build_lm, build_mlp_classifier
from mtf_core.serialization import graph_to_dict


def _rates(scale: float = 1.0) -> dict[str, float]:
    # Distinct, made-up rates: each feature's contribution can be told apart.
    return {f: scale * (i + 1) * 1e-9 for i, f in enumerate(FEATURES)}


def _calibrated(rates: dict[str, float], spmd: dict[str, float] | None = None):
    coefs = {"placement": rates, "spmd": spmd or {k: 2 * v for k, v in rates.items()}}
    return replace(
        get_hardware("cpu-host"),
        name="test-calibrated",
        calibration=Calibration("placement", tuple(coefs.items())),
    )


@pytest.fixture(scope="module")
def lm():
    cfg = TransformerConfig(
        num_layers=1, d_model=32, heads=4, d_kv=8, d_ff=64, vocab=64, batch=8, length=16
    )
    return build_lm(cfg, optimizer="adam", learning_rate=1e-3)


LAYOUTS = ["", "batch:x", "batch:x;d_ff:y;heads:y", "length:y;vocab:x", "d_model:x"]


@pytest.mark.parametrize("rules", LAYOUTS)
def test_calibrated_time_is_the_rates_times_the_step_features(lm, rules) -> None:
    hw = _calibrated(_rates())
    cost = evaluate(lm.graph, "x:2;y:2", rules, hw, outputs=[lm.loss])
    feats = step_features(lm.graph, "x:2;y:2", rules, [lm.loss])
    assert cost.time_s == pytest.approx(predict_s(feats, hw.rates), rel=1e-9)
    # The spmd rates are twice the placement ones: so is the time.
    spmd = evaluate(lm.graph, "x:2;y:2", rules, hw.for_backend("spmd"), [lm.loss])
    assert spmd.time_s == pytest.approx(2 * cost.time_s, rel=1e-9)


@pytest.mark.parametrize("rules", LAYOUTS)
def test_calibration_leaves_collectives_flops_and_memory_unchanged(lm, rules) -> None:
    plain = evaluate(lm.graph, "x:2;y:2", rules, "cpu-host", outputs=[lm.loss])
    cal = evaluate(lm.graph, "x:2;y:2", rules, _calibrated(_rates()), [lm.loss])
    assert cal.collectives == plain.collectives
    assert cal.collective_ops == plain.collective_ops
    assert cal.flops_per_device == plain.flops_per_device
    assert cal.peak_memory_bytes == plain.peak_memory_bytes
    assert [k for k, _ in cal.comm_s_by_axis] == [k for k, _ in plain.comm_s_by_axis]


def test_step_features_count_the_collectives_the_evaluator_lists(lm) -> None:
    rules = "batch:x;d_ff:y;heads:y"
    cost = evaluate(lm.graph, "x:2;y:2", rules, "cpu-host", outputs=[lm.loss])
    feats = step_features(lm.graph, "x:2;y:2", rules, [lm.loss])
    n_allreduce = sum(c.kind == "allreduce" for c in cost.collectives)
    assert n_allreduce > 0
    # Each allreduce over a group of 2 has 2(n-1) = 2 latency steps.
    assert feats["allreduce_steps"] == 2 * n_allreduce
    ring = sum(c.bytes_per_device for c in cost.collectives if c.kind == "allreduce")
    assert feats["allreduce_bytes"] == pytest.approx(ring)  # 2(n-1)/n = 1 at n=2


def test_units_sum_to_the_evaluator_under_a_calibrated_profile(lm) -> None:
    hw = _calibrated(_rates())
    ctx_rules = "batch:x;d_ff:y"
    cost = evaluate(lm.graph, "x:2;y:2", ctx_rules, hw, outputs=[lm.loss])
    from cost_models.costs import layout_context

    ctx = layout_context(lm.graph, "x:2;y:2", ctx_rules)
    units = cost_units(lm.graph, [lm.loss])
    total = sum(
        unit_cost(u, ctx, hw).compute_s + unit_cost(u, ctx, hw).comm_s for u in units
    )
    assert total == pytest.approx(cost.time_s, rel=1e-9)


def test_roofline_rates_reproduce_the_alpha_beta_collective_times(lm) -> None:
    hw = get_hardware("cpu-host")
    rules = "batch:x;d_ff:y;heads:y"
    plain = evaluate(lm.graph, "x:2;y:2", rules, hw, outputs=[lm.loss])
    rates = roofline_rates(hw)
    feats = step_features(lm.graph, "x:2;y:2", rules, [lm.loss])
    comm = sum(rates[f] * x for f, x in feats.items() if f.startswith("all"))
    assert comm == pytest.approx(plain.comm_s, rel=1e-9)


def test_op_classes_of_a_transformer(lm) -> None:
    classes = {op_class(op) for op in lm.graph.operations}
    assert {"matmul", "elementwise", "transcendental", "reduce", "gather"} <= classes
    onehot_einsums = [
        op
        for op in lm.graph.operations
        if op.op_type == "Einsum" and op.onehot_plan is not None
    ]
    assert onehot_einsums and {op_class(op) for op in onehot_einsums} == {"gather"}


def test_fit_recovers_known_rates_from_exact_rows() -> None:
    true = {"ops": 2e-6, "matmul_flops": 5e-12, "elementwise_bytes": 3e-10}
    rows = [
        ({"ops": 100.0, "matmul_flops": 1e9}, 100 * 2e-6 + 1e9 * 5e-12),
        ({"ops": 40.0, "elementwise_bytes": 1e7}, 40 * 2e-6 + 1e7 * 3e-10),
        (
            {"ops": 10.0, "matmul_flops": 4e10, "elementwise_bytes": 1e6},
            10 * 2e-6 + 4e10 * 5e-12 + 1e6 * 3e-10,
        ),
        ({"ops": 500.0}, 500 * 2e-6),
    ]
    prior = {"ops": 1e-6, "matmul_flops": 1e-11, "elementwise_bytes": 1e-9}
    got = fit_rates(rows, prior, prior_weight=1e-9)
    for f, v in true.items():
        assert got[f] == pytest.approx(v, rel=1e-4)


def test_fit_moves_an_unexercised_feature_only_by_the_common_factor() -> None:
    prior = {"ops": 1e-6, "random_bytes": 7e-10}
    got = fit_rates([({"ops": 10.0}, 1e-4)], prior)
    assert got["ops"] == pytest.approx(1e-5, rel=1e-6)
    # No row says anything about random draws: they keep their ratio to the
    # rest of the prior (the machine is 10x slower than the prior said).
    assert got["random_bytes"] == pytest.approx(7e-9, rel=1e-6)


def test_row_weights_decide_which_rows_an_inconsistent_fit_follows() -> None:
    # One rate cannot fit both rows: 1 us per op in the first, 3 us in the
    # second.  Equal weights meet in between; a heavy row wins.
    rows = [({"ops": 100.0}, 1e-4), ({"ops": 100.0}, 3e-4)]
    prior = {"ops": 1e-6}
    even = fit_rates(rows, prior, prior_weight=1e-12)["ops"]
    assert 1e-6 < even < 3e-6
    first = fit_rates(rows, prior, prior_weight=1e-12, weights=[1000.0, 1.0])["ops"]
    second = fit_rates(rows, prior, prior_weight=1e-12, weights=[1.0, 1000.0])["ops"]
    assert first == pytest.approx(1e-6, rel=1e-2)
    assert second == pytest.approx(3e-6, rel=1e-2)
    # Equal weights, whatever their scale, are the unweighted fit.
    same = fit_rates(rows, prior, prior_weight=1e-12, weights=[5.0, 5.0])["ops"]
    assert same == pytest.approx(even, rel=1e-12)
    # A zero weight drops its row.
    only = fit_rates(rows, prior, prior_weight=1e-12, weights=[0.0, 2.0])["ops"]
    assert only == pytest.approx(3e-6, rel=1e-6)


@pytest.mark.parametrize(
    "weights, match",
    [
        ([1.0], "1 weights for 2 rows"),
        ([1.0, -1.0], "row weight -1.0"),
        ([1.0, float("nan")], "row weight nan"),
        ([1.0, "2"], "row weight '2'"),
        ([0.0, 0.0], "all 0"),
    ],
)
def test_fit_rejects_bad_row_weights(weights, match) -> None:
    from cost_models.hardware import CostModelError

    rows = [({"ops": 1.0}, 1e-6), ({"ops": 2.0}, 2e-6)]
    with pytest.raises(CostModelError, match=match):
        fit_rates(rows, {"ops": 1e-6}, weights=weights)


def test_fit_rejects_bad_seconds() -> None:
    from cost_models.hardware import CostModelError

    with pytest.raises(CostModelError, match="expected > 0"):
        fit_rates([({"ops": 1.0}, 0.0)], {"ops": 1e-6})
    with pytest.raises(CostModelError, match="no prior rate"):
        fit_rates([({"bogus": 1.0}, 1.0)], {"ops": 1e-6})


def _measured(model, mesh, rules, seconds, backend="placement"):
    doc = graph_to_dict(model.graph, outputs=[model.loss])
    return {
        "graph": doc,
        "mesh_shape": mesh,
        "layout_rules": rules,
        "backend": backend,
        "seconds": seconds,
    }


def test_refit_moves_the_prediction_to_the_measurement() -> None:
    mlp = build_mlp_classifier(
        MlpConfig(batch=64, features=32, hidden=64, classes=4),
        optimizer="sgd",
        learning_rate=0.1,
    )
    hw = get_hardware("cpu-host")
    before = evaluate(mlp.graph, "x:4", "batch:x", hw, outputs=[mlp.loss]).time_s
    measured = 3.0 * before
    fitted = refit(hw, [_measured(mlp, "x:4", "batch:x", measured)])
    after = evaluate(mlp.graph, "x:4", "batch:x", fitted, outputs=[mlp.loss]).time_s
    assert abs(after - measured) < 0.01 * measured
    # Another layout of the same graph moves the same way (shared rates).
    other0 = evaluate(mlp.graph, "x:4", "hidden:x", hw, outputs=[mlp.loss]).time_s
    other1 = evaluate(mlp.graph, "x:4", "hidden:x", fitted, outputs=[mlp.loss]).time_s
    assert other1 > other0
    # Collectives are still exactly the lowering's.
    assert evaluate(mlp.graph, "x:4", "hidden:x", fitted, [mlp.loss]).collectives == (
        evaluate(mlp.graph, "x:4", "hidden:x", hw, [mlp.loss]).collectives
    )


def test_get_hardware_fits_a_raw_profile_with_a_sweep(tmp_path) -> None:
    mlp = build_mlp_classifier(MlpConfig(batch=64, features=32, hidden=64, classes=4))
    raw = get_hardware("cpu-host").to_dict() | {"name": "raw"}
    raw["measured"] = {
        "sweep": [
            _measured(mlp, "x:4", "batch:x", 2e-3),
            _measured(mlp, "x:4", "hidden:x", 5e-3),
            _measured(mlp, "x:4", "batch:x", 4e-3, backend="spmd"),
        ]
    }
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    hw = get_hardware(str(path))
    assert hw.calibration is not None and hw.calibration.backend == "placement"
    assert {b for b, _ in hw.calibration.coefficients} == {"placement", "spmd"}
    fitted = fit_profile(raw)
    # Features are kept and graphs dropped: the profile stays small.
    assert all("graph" not in r and r["features"] for r in fitted["measured"]["sweep"])
    assert fitted["measured"]["fit"]["placement"]["rows"] == 2
    # The fitted profile reads back and predicts its own rows closely.
    again = get_hardware(fitted)
    for rec in fitted["measured"]["sweep"]:
        m = Measurement.from_dict(rec)
        rates = again.for_backend(m.backend).rates
        assert predict_s(m.features(), rates) == pytest.approx(m.seconds, rel=0.1)


def test_calibration_round_trips_and_checks_its_values() -> None:
    hw = _calibrated(_rates())
    assert get_hardware(json.loads(json.dumps(hw.to_dict()))) == hw
    assert hash(hw) == hash(get_hardware(hw.to_dict()))
    with pytest.raises(HardwareError, match="backend 'gpu'"):
        Calibration("placement", (("gpu", (("ops", 1.0),)),))
    with pytest.raises(HardwareError, match="finite number >= 0"):
        Calibration("placement", (("placement", (("ops", -1.0),)),))
    with pytest.raises(HardwareError, match="has no coefficients"):
        Calibration("spmd", (("placement", (("ops", 1.0),)),))
    # A misspelt feature would be priced at nothing: refused, naming it.
    with pytest.raises(HardwareError, match=r"rate for 'matmul_flop', which is no"):
        get_hardware(
            {
                **hw.to_dict(),
                "calibration": {
                    "backend": "placement",
                    "coefficients": {"placement": {"matmul_flop": 1e-12}},
                },
            }
        )
    # Uncalibrated profiles ignore the backend: the roofline cannot tell.
    assert get_hardware("h100-nvlink-ib").for_backend("spmd") == get_hardware(
        "h100-nvlink-ib"
    )


def test_uncalibrated_presets_price_as_before(lm) -> None:
    # The roofline: compute is max(flops / peak, bytes / bandwidth) per op.
    hw = get_hardware("h100-nvlink-ib")
    assert hw.rates is None
    cost = evaluate(lm.graph, "x:2;y:2", "batch:x", hw, outputs=[lm.loss])
    assert cost.compute_s > 0 and cost.time_s == cost.compute_s + cost.comm_s


def test_layouts_never_change_the_graph_features_mtf_counts(lm) -> None:
    # flops on one device times the devices splitting them is the op's flops
    feats = step_features(lm.graph, "x:2;y:2", "", [lm.loss])
    assert "allreduce_bytes" not in feats  # nothing split, nothing reduced
    # one per op the step runs (not the gradients no update reads)
    ops = step_operations(lm.graph, [lm.loss])
    assert feats["ops"] == sum(op_class(op) is not None for op in ops)
    assert len(ops) < len(lm.graph.operations)
    assert mtf.Graph  # the language is importable without TensorFlow
