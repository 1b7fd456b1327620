"""calibrate measures the local logical devices and writes a profile the cost
model reads back."""

from __future__ import annotations

import json

import pytest

from cost_models import collective_time_s, get_hardware
from mtf_core.comm import CollectiveSpec

pytestmark = pytest.mark.tf


def test_ring_fit_recovers_bandwidth_and_latency_from_exact_timings() -> None:
    from mtf_core.lowering.calibrate import fit_ring_allreduce

    n, bw, lat = 4, 2e9, 20e-6
    sizes = [1 << 12, 1 << 16, 1 << 20]
    times = [2 * (n - 1) * lat + 2 * (n - 1) / n * b / bw for b in sizes]
    got_bw, got_lat = fit_ring_allreduce(n, sizes, times)
    assert got_bw == pytest.approx(bw, rel=1e-9)
    assert got_lat == pytest.approx(lat, rel=1e-9)


def test_calibrated_profile_loads_and_predicts_its_own_allreduces(
    devices: list[str], tmp_path
) -> None:
    from mtf_core.lowering.calibrate import fit_ring_allreduce, main

    path = tmp_path / "profile.json"
    rc = main(
        [
            "--devices",
            "4",
            "--out",
            str(path),
            "--repeats",
            "3",
            "--sizes",
            "4096,4194304",
            "--matmul-n",
            "128",
            "--sweep",
            "",
        ]
    )
    assert rc == 0
    raw = json.loads(path.read_text())
    hw = get_hardware(str(path))
    assert hw.name == "calibrated-cpux4"
    assert hw.peak_flops > 1e8 and hw.hbm_bandwidth_bytes_per_s > 1e8
    assert hw.memory_bytes > 0
    link = hw.link_for_axis("all", "all:4")
    assert link.bandwidth_bytes_per_s > 0 and link.latency_s > 0
    measured = raw["measured"]
    assert measured["devices"] == devices[:4]
    # The profile's link is the ring fit of its own measurements...
    sizes, seconds = measured["allreduce_bytes"], measured["allreduce_s"]
    bandwidth, latency = fit_ring_allreduce(4, sizes, seconds)
    assert link.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-9)
    assert link.latency_s == pytest.approx(latency, rel=1e-9)
    # ... so where the larger message took longer (as it does unless a loaded
    # host inverts two timings), the line goes through both points.
    if seconds[1] > seconds[0]:
        for nbytes, t in zip(sizes, seconds):
            spec = CollectiveSpec("allreduce", ("all",), nbytes)
            assert collective_time_s(spec, "all:4", hw) == pytest.approx(t, rel=1e-6)


def test_ring_fit_of_inverted_noisy_timings_keeps_both_terms_positive() -> None:
    from mtf_core.lowering.calibrate import fit_ring_allreduce

    # A loaded host timed the 4 MiB allreduce faster than the 4 KiB one.
    bandwidth, latency = fit_ring_allreduce(4, [4096, 4 << 20], [3.9e-3, 3.8e-3])
    assert bandwidth > 0 and latency > 0
    # The slope falls back to its floor, so the time is all latency: what the
    # line through both points gives at zero bytes.
    assert bandwidth == pytest.approx(1e15)
    assert 6 * latency == pytest.approx(3.9e-3 + 0.1e-3 * 4096 / ((4 << 20) - 4096))


def test_calibrate_refuses_a_single_device(devices: list[str]) -> None:
    from mtf_core.errors import LoweringError
    from mtf_core.lowering.calibrate import calibrate

    with pytest.raises(LoweringError, match="at least 2 devices"):
        calibrate(devices[:1])


def test_mtf_planner_calibrate_measures_the_sweep_and_writes_a_fitted_profile(
    devices: list[str], tmp_path
) -> None:
    from api.cli import main
    from cost_models import evaluate
    from cost_models.calibration import Measurement, predict_s

    path = tmp_path / "cpu.json"
    points = "overhead,elementwise-256k,matmul-64x256,allreduce-all-64k"
    rc = main(
        [
            "calibrate",
            "--devices",
            "4",
            "--device",
            "cpu",
            "-o",
            str(path),
            "--repeats",
            "2",
            "--points",
            points,
            "--quiet",
        ]
    )
    assert rc == 0
    raw = json.loads(path.read_text())
    sweep = raw["measured"]["sweep"]
    # Every point on both backends, each with its features and no graph.
    assert sorted((r["backend"], r["point"]) for r in sweep) == sorted(
        (b, p) for b in ("placement", "spmd") for p in points.split(",")
    )
    assert all(r["seconds"] > 0 and r["features"] and "graph" not in r for r in sweep)
    assert raw["measured"]["clock"] == "cpu"
    hw = get_hardware(str(path))
    assert hw.name == "calibrated-cpux4"
    assert {b for b, _ in hw.calibration.coefficients} == {"placement", "spmd"}
    # The allreduce point's collectives are priced by the fitted spmd rates.
    ar = next(r for r in sweep if r["point"] == "allreduce-all-64k")
    feats = Measurement.from_dict(ar).features()
    assert feats["allreduce_steps"] > 0
    rates = hw.for_backend(ar["backend"]).rates
    assert predict_s(feats, rates) > 0
    # A graph prices on it, with the lowering's collectives.
    import mtf_core as mtf

    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "batch:8,d:4")
    w = mtf.zeros(m, "d:4,h:2")
    y = mtf.einsum([x, w], output_shape="batch:8,h:2")
    cost = evaluate(g, "model:4", "d:model", hw, outputs=[y])
    assert [(c.kind, c.bytes_per_device) for c in cost.collectives] == [
        ("allreduce", 64)
    ]
    assert cost.time_s > 0


def test_mtf_planner_calibrate_says_what_was_wrong(tmp_path, capsys) -> None:
    from api.cli import main

    out = str(tmp_path / "x.json")
    assert main(["calibrate", "--devices", "2", "--points", "nope", "-o", out]) == 1
    assert "unknown sweep points ['nope']" in capsys.readouterr().err
    assert main(["calibrate", "--devices", "1", "-o", out]) == 1


def test_calibrate_rejects_unknown_sweep_points(devices: list[str]) -> None:
    from mtf_core.errors import LoweringError
    from mtf_core.lowering.calibrate import select_points

    with pytest.raises(LoweringError, match="unknown sweep points \\['nope'\\]"):
        select_points(4, ["overhead", "nope"])


def test_calibrate_without_a_gpu_says_so_and_auto_uses_the_cpu(
    devices: list[str],
) -> None:
    import tensorflow as tf

    from mtf_core.errors import LoweringError
    from mtf_core.lowering.calibrate import pick_devices

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(LoweringError, match="no GPU is visible"):
        pick_devices(2, "gpu")
    got, kind = pick_devices(2, "auto")
    assert kind == "cpu" and got == devices[:2]
