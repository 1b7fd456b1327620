"""Strided sums (``outer_reduce_bytes``) and the calibration fit that prices
them: which reductions count, how much, under which layouts; a sweep fit
recovers a rate far above its roofline prior.  No TensorFlow."""

from __future__ import annotations

from dataclasses import replace

import pytest

import mtf_core as mtf
from cost_models.calibration import (
    PRIOR_WEIGHT,
    SWEEP_PRIOR_WEIGHT,
    fit_profile,
    fit_rates,
    predict_s,
    step_features,
)
from cost_models.costs import evaluate, layout_context
from cost_models.hardware import Calibration
from cost_models.op_classes import PAGE_BYTES, STRIDED_ROWS, roofline_rates
from cost_models.profiles import get_hardware
from cost_models.units import cost_units, unit_cost
from mtf_core.lowering.calibration_sweep import sweep_points
from mtf_core.models import MlpConfig, build_mlp_classifier


def _sum_over(rows: int, cols: int, reduced: str) -> tuple[mtf.Graph, mtf.Tensor]:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.get_variable(m, "x", f"rows:{rows},cols:{cols}")
    kept = "cols" if reduced == "rows" else "rows"
    y = mtf.reduce_sum(x, output_shape=f"{kept}:{cols if kept == 'cols' else rows}")
    return g, y


def _outer(graph: mtf.Graph, y: mtf.Tensor, mesh: str, rules: str) -> float:
    return step_features(graph, mesh, rules, [y]).get("outer_reduce_bytes", 0.0)


def test_a_sum_over_rows_of_page_wide_rows_counts_its_bytes() -> None:
    # [4096, 1024] float32: rows of 4 KiB (one page), 4096 >= STRIDED_ROWS rows.
    g, y = _sum_over(4096, 1024, "rows")
    assert _outer(g, y, "m:4", "") == 4096 * 1024 * 4
    # cols split 4: rows of 1 KiB, a quarter of the reads land on a new page.
    assert _outer(g, y, "m:4", "cols:m") == 4096 * 256 * 4 * (1024 / PAGE_BYTES)
    # rows split 4: 1024 rows per walk, half of STRIDED_ROWS.
    assert _outer(g, y, "m:4", "rows:m") == 1024 * 1024 * 4 * (1024 / STRIDED_ROWS)


def test_a_sum_along_the_rows_reads_them_contiguously() -> None:
    g, y = _sum_over(4096, 1024, "cols")
    assert _outer(g, y, "m:4", "") == 0.0
    assert _outer(g, y, "m:4", "cols:m") == 0.0
    # A full reduction includes the innermost dim: contiguous too.
    g2 = mtf.Graph()
    x = mtf.get_variable(mtf.Mesh(g2, "m"), "x", "rows:64,cols:64")
    s = mtf.reduce_sum(x, output_shape=[])
    assert _outer(g2, s, "m:2", "") == 0.0


def test_an_innermost_dim_split_to_one_element_does_not_count() -> None:
    # cols:4 split 4 ways leaves [64, 1] slices: TensorFlow sums a column of
    # 64 contiguous floats, a row reduction.
    g, y = _sum_over(64, 4, "rows")
    assert _outer(g, y, "m:4", "") > 0
    assert _outer(g, y, "m:4", "cols:m") == 0.0


def test_kept_dims_between_form_the_row() -> None:
    # [r, a, c] summed over r keeps a and c: each walk steps a*c elements.
    g = mtf.Graph()
    x = mtf.get_variable(mtf.Mesh(g, "m"), "x", "r:4096,a:8,c:64")
    y = mtf.reduce_sum(x, output_shape="a:8,c:64")
    row = 8 * 64 * 4
    assert _outer(g, y, "m:2", "") == 4096 * row * (row / PAGE_BYTES)


def test_the_feature_moves_the_price_and_nothing_else() -> None:
    mlp = build_mlp_classifier(
        MlpConfig(batch=4096, features=64, hidden=1024, classes=4),
        optimizer="sgd",
        learning_rate=0.1,
    )
    base = get_hardware("cpu-host")
    rates = dict(roofline_rates(base), outer_reduce_bytes=0.0)
    without = replace(
        base,
        calibration=Calibration("placement", (("placement", tuple(rates.items())),)),
    )
    rates["outer_reduce_bytes"] = 1e-9
    with_rate = replace(
        base,
        calibration=Calibration("placement", (("placement", tuple(rates.items())),)),
    )
    for rules in ("batch:x", "hidden:x", ""):
        a = evaluate(mlp.graph, "x:4", rules, without, [mlp.loss])
        b = evaluate(mlp.graph, "x:4", rules, with_rate, [mlp.loss])
        outer = step_features(mlp.graph, "x:4", rules, [mlp.loss])["outer_reduce_bytes"]
        assert b.compute_s - a.compute_s == pytest.approx(outer * 1e-9, rel=1e-9)
        assert (a.collectives, a.flops_per_device, a.peak_memory_bytes) == (
            b.collectives,
            b.flops_per_device,
            b.peak_memory_bytes,
        )
        # The planner's units add up to the same compute.
        units = cost_units(mlp.graph, [mlp.loss])
        ctx = layout_context(mlp.graph, "x:4", rules)
        total = sum(unit_cost(u, ctx, with_rate).compute_s for u in units)
        assert total == pytest.approx(b.compute_s, rel=1e-9)
    # Replicated bias gradients of 4096 x 1024 sum page-wide rows on every
    # device; data-parallel ones walk 1024 rows.
    rep = step_features(mlp.graph, "x:4", "", [mlp.loss])["outer_reduce_bytes"]
    dp = step_features(mlp.graph, "x:4", "batch:x", [mlp.loss])["outer_reduce_bytes"]
    assert rep == 8 * dp


def test_the_sweep_measures_strided_sums_of_three_shapes() -> None:
    points = {p.name: p for p in sweep_points(8)}
    want = {
        "reduce-outer-2m": 6 * 512 * 1024 * 4 * (512 / STRIDED_ROWS),
        "reduce-outer-4m": 4 * 4096 * 256 * 4 * (1024 / PAGE_BYTES),
        "reduce-outer-16m": 4 * 4096 * 1024 * 4,
    }
    for name, outer in want.items():
        p = points[name]
        graph, outputs, _ = p.build(8)
        feats = step_features(graph, p.mesh(8), p.rules, outputs)
        assert feats["outer_reduce_bytes"] == outer
        # d is split: the sums need no allreduce but the final scalar's.
        assert feats["allreduce_bytes"] == pytest.approx(2 * 7 / 8 * 4)


def test_a_sweep_fit_recovers_a_rate_far_above_its_prior() -> None:
    # Exact rows whose strided-sum rate is 40 times the roofline's prior.
    hw = get_hardware("cpu-host")
    roof = roofline_rates(hw)
    true = dict(roof, outer_reduce_bytes=40 * roof["outer_reduce_bytes"])
    rows = [
        ({"ops": 10.0, "reduce_bytes": 4e6}, 0.0),
        ({"ops": 10.0, "reduce_bytes": 4e6, "outer_reduce_bytes": 4e6}, 0.0),
        ({"ops": 10.0, "reduce_bytes": 4e7, "outer_reduce_bytes": 4e7}, 0.0),
        ({"ops": 50.0, "elementwise_bytes": 1e6}, 0.0),
        ({"ops": 500.0}, 0.0),
    ]
    rows = [(f, predict_s(f, true)) for f, _ in rows]
    swept = fit_rates(rows, roof, SWEEP_PRIOR_WEIGHT)
    assert swept["outer_reduce_bytes"] == pytest.approx(
        true["outer_reduce_bytes"], rel=0.02
    )
    # The pull a refit from a few runs keeps holds it well short.
    held = fit_rates(rows, roof, PRIOR_WEIGHT)
    assert held["outer_reduce_bytes"] < 0.8 * true["outer_reduce_bytes"]
    # fit_profile fits a sweep with the sweep's weight.
    profile = hw.to_dict() | {
        "measured": {
            "sweep": [
                {
                    "point": f"p{i}",
                    "backend": "placement",
                    "mesh_shape": "x:8",
                    "layout_rules": "",
                    "features": f,
                    "seconds": s,
                }
                for i, (f, s) in enumerate(rows)
            ]
        }
    }
    fitted = fit_profile(profile)["calibration"]["coefficients"]["placement"]
    assert fitted["outer_reduce_bytes"] == pytest.approx(swept["outer_reduce_bytes"])
