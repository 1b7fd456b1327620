"""Hardware profiles and alpha-beta collective times (pure Python)."""

from __future__ import annotations

import json

import pytest

from cost_models import (
    PRESETS,
    HardwareError,
    HardwareProfile,
    LinkSpec,
    allgather_time_s,
    allreduce_time_s,
    alltoall_time_s,
    broadcast_time_s,
    collective_time_s,
    get_hardware,
    shift_time_s,
)
from mtf_core.comm import CollectiveSpec

FAST = LinkSpec("fast", 100e9, 1e-6)
SLOW = LinkSpec("slow", 10e9, 5e-6)


def test_presets_carry_the_public_datasheet_numbers() -> None:
    assert {"h100-nvlink-ib", "a100-nvlink-ib", "tpu-v4", "tpu-v5e", "cpu-host"} <= set(
        PRESETS
    )
    h100 = PRESETS["h100-nvlink-ib"]
    assert h100.peak_flops == 989e12
    assert h100.memory_bytes == 80 * 2**30
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.intra_host_link.bandwidth_bytes_per_s == 450e9  # 900 GB/s bidi
    assert h100.inter_host_link.bandwidth_bytes_per_s == 50e9  # NDR 400 Gb/s
    assert PRESETS["a100-nvlink-ib"].peak_flops == 312e12
    assert PRESETS["tpu-v4"].memory_bytes == 32 * 2**30
    assert PRESETS["tpu-v5e"].peak_flops == 197e12


def test_axis_inside_a_host_uses_nvlink_and_across_hosts_infiniband() -> None:
    hw = get_hardware("h100-nvlink-ib")
    # 4 hosts x 8 GPUs: model (stride 1, 8 wide) stays in a host.
    assert hw.link_for_axis("model", "batch:4;model:8").name == "nvlink4"
    assert hw.link_for_axis("batch", "batch:4;model:8").name == "infiniband-ndr"
    # 2 x 4 fits in one host: both axes on NVLink.
    assert hw.link_for_axis("a", "a:2;b:4").name == "nvlink4"
    # b:2 (stride 8) spans two hosts; c (stride 2, span 8) and d stay inside.
    mesh = "b:2;c:4;d:2"
    assert [hw.link_for_axis(a, mesh).name for a in "bcd"] == [
        "infiniband-ndr",
        "nvlink4",
        "nvlink4",
    ]
    # 6 devices fit in one host; with 12, the group {6, 7, 8} straddles two.
    assert hw.link_for_axis("t", "s:2;t:3").name == "nvlink4"
    assert hw.link_for_axis("t", "s:4;t:3").name == "infiniband-ndr"


def test_explicit_axis_links_win_over_the_host_hierarchy() -> None:
    hw = HardwareProfile("custom", 1e12, 2**30, 1e12, FAST, axis_links={"batch": SLOW})
    assert hw.axis_links == (("batch", SLOW),)
    assert hw.link_for_axis("batch", "batch:2;model:2") == SLOW
    assert hw.link_for_axis("model", "batch:2;model:2") == FAST
    pinned = HardwareProfile(
        "pinned",
        1e12,
        2**30,
        1e12,
        FAST,
        axis_links=(("model", SLOW),),
        devices_per_host=8,
        intra_host_link=FAST,
        inter_host_link=SLOW,
    )
    assert pinned.link_for_axis("model", "model:2") == SLOW


def test_profiles_round_trip_through_dicts_and_json_files(tmp_path) -> None:
    for hw in PRESETS.values():
        assert HardwareProfile.from_dict(json.loads(json.dumps(hw.to_dict()))) == hw
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PRESETS["tpu-v4"].to_dict()))
    assert get_hardware(str(path)) == PRESETS["tpu-v4"]
    assert get_hardware(PRESETS["tpu-v4"].to_dict()) == PRESETS["tpu-v4"]
    smaller = PRESETS["tpu-v4"].with_memory(1000)
    assert smaller.memory_bytes == 1000 and smaller.peak_flops == 275e12


def test_bad_hardware_names_and_values_get_clear_errors() -> None:
    with pytest.raises(HardwareError, match="unknown hardware 'h200'.*h100-nvlink-ib"):
        get_hardware("h200")
    with pytest.raises(ValueError, match="peak_flops is -1"):
        HardwareProfile("bad", -1, 10, 1.0, FAST)
    with pytest.raises(ValueError, match="latency_s is -1"):
        LinkSpec("bad", 1.0, -1)
    with pytest.raises(HardwareError, match=r"unknown keys \['flops'\]"):
        HardwareProfile.from_dict({**PRESETS["tpu-v4"].to_dict(), "flops": 1})
    with pytest.raises(HardwareError, match=r"missing keys \['peak_flops'\]"):
        d = PRESETS["tpu-v4"].to_dict()
        del d["peak_flops"]
        HardwareProfile.from_dict(d)
    with pytest.raises(HardwareError, match="devices_per_host is 0"):
        HardwareProfile("bad", 1.0, 10, 1.0, FAST, devices_per_host=0)


# -- collectives -----------------------------------------------------------------


def test_ring_allreduce_matches_the_textbook_formula() -> None:
    # 4 devices, 1 MB each, 10 GB/s, 5 us: 2*3/4 * 1e6/1e10 + 6 * 5e-6.
    assert allreduce_time_s(1e6, 4, SLOW) == pytest.approx(150e-6 + 30e-6)
    assert allreduce_time_s(1e6, 1, SLOW) == 0.0


def test_allgather_alltoall_shift_and_broadcast_times() -> None:
    assert allgather_time_s(1e6, 4, SLOW) == pytest.approx(3 * 1e-4 + 3 * 5e-6)
    assert alltoall_time_s(1e6, 4, SLOW) == pytest.approx(0.75e-4 + 3 * 5e-6)
    assert shift_time_s(1e6, SLOW) == pytest.approx(1e-4 + 5e-6)
    assert broadcast_time_s(1e6, 8, SLOW) == pytest.approx(1e-4 + 3 * 5e-6)


def test_multi_axis_allreduce_spans_the_product_at_the_slowest_link() -> None:
    hw = HardwareProfile(
        "two-links", 1e12, 2**30, 1e12, FAST, axis_links={"batch": SLOW}
    )
    spec = CollectiveSpec("allreduce", ("batch", "model"), 1_000_000)
    t = collective_time_s(spec, "batch:2;model:4", hw)
    assert t == pytest.approx(allreduce_time_s(1e6, 8, SLOW))
    assert collective_time_s(
        CollectiveSpec("allconcat", ("model",), 1000), "batch:2;model:4", hw
    ) == pytest.approx(allgather_time_s(1000, 4, FAST))
    with pytest.raises(ValueError, match="'gossip'"):
        collective_time_s(CollectiveSpec("gossip", ("model",), 1), "model:2", hw)
    with pytest.raises(ValueError, match="'rows'"):
        collective_time_s(CollectiveSpec("allreduce", ("rows",), 1), "model:2", hw)


def test_megatron_allreduce_on_nvlink_is_much_cheaper_than_across_hosts() -> None:
    hw = get_hardware("h100-nvlink-ib")
    mesh = "batch:4;model:8"
    nbytes = 64 << 20
    inside = collective_time_s(
        CollectiveSpec("allreduce", ("model",), nbytes), mesh, hw
    )
    across = collective_time_s(
        CollectiveSpec("allreduce", ("batch",), nbytes), mesh, hw
    )
    assert inside == pytest.approx(2 * 7 / 8 * nbytes / 450e9 + 14 * 3e-6)
    assert across == pytest.approx(2 * 3 / 4 * nbytes / 50e9 + 6 * 6e-6)
    assert across > 5 * inside
