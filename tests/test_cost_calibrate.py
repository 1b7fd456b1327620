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
    from mtf_core.lowering.calibrate import main

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
    # With two points the line goes through both: the model reproduces them.
    for nbytes, seconds in zip(measured["allreduce_bytes"], measured["allreduce_s"]):
        spec = CollectiveSpec("allreduce", ("all",), nbytes)
        assert collective_time_s(spec, "all:4", hw) == pytest.approx(seconds, rel=1e-6)


def test_calibrate_refuses_a_single_device(devices: list[str]) -> None:
    from mtf_core.errors import LoweringError
    from mtf_core.lowering.calibrate import calibrate

    with pytest.raises(LoweringError, match="at least 2 devices"):
        calibrate(devices[:1])
