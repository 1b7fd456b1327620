"""The einsum kernel's transposes: which operands, how many bytes, and the
feature and sweep points that price them."""

from __future__ import annotations

from pathlib import Path

import pytest

import mtf_core as mtf
from cost_models.calibration import step_features
from cost_models.einsum_transposes import kernel_transposes, moved_operands
from cost_models.layout_cache import LayoutSizes
from cost_models.op_classes import op_features, roofline_rates
from cost_models.op_costs import flops_per_device
from cost_models.profiles import get_hardware
from mtf_core.comm import LayoutContext
from mtf_core.graph import Graph
from mtf_core.lowering.calibration_sweep import sweep_points

PROFILES = Path(__file__).resolve().parent.parent / "bench" / "profiles"


def transposes(equation: str) -> tuple[tuple[int, tuple[int, ...]], ...]:
    ins, out = equation.split("->")
    return kernel_transposes(tuple(tuple(n) for n in ins.split(",")), tuple(out))


@pytest.mark.parametrize(
    ("equation", "expected"),
    [
        # Both weight-gradient operands lie as [contract, free]: the flag.
        ("bld,blf->df", ()),
        ("blf,bld->fd", ()),
        # The result is [free of input 0, free of input 1]; asked the other
        # way round, it is transposed.
        ("blf,bld->df", ((2, (1, 0)),)),
        ("bld,blf->fd", ((2, (1, 0)),)),
        # Contracted dims out of their order of first appearance: the input
        # is sorted to [free, contract] (l is numbered before b here).
        ("lbd,blf->df", ((1, (2, 1, 0)),)),
        # A forward product: [batch.., contract] x [contract, free].
        ("bld,df->blf", ()),
        ("blf,df->bld", ()),
        # The weight first: its free dim leads the result.
        ("df,bld->blf", ((2, (1, 2, 0)),)),
        # Batch dims lead the result, by number.
        ("bhqk,bhkv->bhqv", ()),
        ("bhqk,bhkv->hbqv", ((2, (1, 0, 2, 3)),)),
    ],
)
def test_kernel_transposes_follow_the_einsum_kernels_rules(equation, expected):
    assert transposes(equation) == expected


def test_a_transpose_of_dims_of_size_one_moves_nothing():
    names = (tuple("blf"), tuple("bld"))
    out = tuple("df")
    assert moved_operands(names, out, [[1, 64, 4096], [1, 64, 1024], [1024, 4096]]) == [
        2
    ]
    # The output's free dims split down to one row: nothing moves.
    assert moved_operands(names, out, [[1, 64, 4096], [1, 64, 1], [1, 4096]]) == []
    # Input 1 of "lbd,blf->df" is sorted from [b, l, f] to [f, l, b]: l and
    # f change order unless one of them is a single row too.
    lbd = (tuple("lbd"), tuple("blf"))
    assert moved_operands(lbd, out, [[64, 1, 1024], [1, 64, 4096], [1024, 4096]]) == [1]
    assert moved_operands(lbd, out, [[1, 1, 1024], [1, 1, 4096], [1024, 4096]]) == []


def _graph(swap: bool) -> tuple[Graph, mtf.Tensor]:
    g = Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.get_variable(m, "x", "batch:64,d:1024")
    y = mtf.get_variable(m, "y", "batch:64,e:512")
    pair = [y, x] if swap else [x, y]
    return g, mtf.einsum(pair, output_shape="d:1024,e:512")


@pytest.mark.parametrize(
    ("mesh", "rules", "swap", "expected"),
    [
        ("all:8", "d:all", False, 0),
        ("all:8", "d:all", True, 128 * 512 * 4),  # the output slice
        ("all:8", "e:all", True, 1024 * 64 * 4),
        ("all:8", "batch:all", True, 1024 * 512 * 4),  # whole, a pending sum
    ],
)
def test_the_feature_is_the_slice_bytes_the_kernel_transposes(
    mesh, rules, swap, expected
):
    _, out = _graph(swap)
    op = out.operation
    ctx = LayoutContext.make(mesh, rules)
    sizes = LayoutSizes(ctx)
    feats = dict(op_features(op, ctx, sizes, flops_per_device(op, ctx, sizes, None)))
    assert feats.get("transpose_bytes", 0.0) == expected


def test_only_two_input_products_count():
    """tf.einsum splits a product of three into pairs of its own choosing:
    no copies are counted for it."""
    g = Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.get_variable(m, "x", "batch:64,d:256")
    y = mtf.get_variable(m, "y", "batch:64,e:128")
    z = mtf.get_variable(m, "z", "batch:64,f:32")
    op = mtf.einsum([z, y, x], output_shape="d:256,e:128,f:32").operation
    ctx = LayoutContext.make("all:8", "d:all")
    sizes = LayoutSizes(ctx)
    feats = dict(op_features(op, ctx, sizes, flops_per_device(op, ctx, sizes, None)))
    assert "matmul_flops" in feats and "transpose_bytes" not in feats


def test_sweep_points_separate_transposes_from_the_matmul():
    """The sweep measures the same weight gradients with and without the
    result's transpose: the rate is fitted from the difference."""
    points = {p.name: p for p in sweep_points(8)}
    moved = {}
    for name in ("wgrad-64x512", "wgrad-transposed-64x512"):
        p = points[name]
        g, outputs, _ = p.build(8)
        moved[name] = step_features(g, p.mesh(8), p.rules, outputs)
    plain, swapped = moved["wgrad-64x512"], moved["wgrad-transposed-64x512"]
    assert plain.get("transpose_bytes", 0.0) == 0.0
    assert swapped["transpose_bytes"] == 6 * 512 * 512 * 4  # six [512, 512] slices
    assert {f: v for f, v in swapped.items() if f != "transpose_bytes"} == plain


def test_profiles_price_transposes():
    """The roofline prior reads a transpose as a copy; the calibrated host
    profile prices it from its sweep, and a profile calibrated before the
    feature existed prices it at zero (its predictions are unchanged)."""
    h100 = get_hardware("h100-nvlink-ib")
    assert roofline_rates(h100)["transpose_bytes"] == pytest.approx(
        1.0 / h100.hbm_bandwidth_bytes_per_s
    )
    host = get_hardware(str(PROFILES / "epyc-host-cpu8.json"))
    for backend in ("placement", "spmd"):
        rates = host.for_backend(backend).rates
        assert rates is not None and rates["transpose_bytes"] > rates["matmul_bytes"]
    old = get_hardware(str(PROFILES / "ci-host-cpu8.json")).rates
    assert old is not None and "transpose_bytes" not in old
