"""Property: layouts never change results.

Hypothesis draws small random programs (einsums, unary and binary elementwise
ops, reductions over dims from a small pool) and random valid layouts on
random meshes of at most 8 devices; every tensor of the program and the
gradients of a loss with respect to its inputs must equal the one-device
result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from layout_cases import ONE_DEVICE, LayoutCase, lower, upstream_for, weighted_sum

import mtf_core as mtf

pytestmark = pytest.mark.tf

DIMS = {"a": 4, "b": 2, "c": 8, "d": 4}
MESHES = [
    "m:2",
    "m:4",
    "m:8",
    "x:2;y:2",
    "x:2;y:4",
    "x:4;y:2",
    "x:1;y:4",
    "x:2;y:2;z:2",
]
UNARY = ["tanh", "sigmoid", "sin"]
BINARY = ["add", "sub", "multiply", "maximum"]
REDUCE = ["reduce_sum", "reduce_max", "reduce_mean", "reduce_logsumexp"]


def _dims_subset(draw: Any, pool: list[str], min_size: int = 1) -> list[str]:
    """A random non-empty subset of ``pool`` in random order."""
    return draw(st.permutations(pool))[: draw(st.integers(min_size, len(pool)))]


@st.composite
def programs(draw: Any) -> dict[str, Any]:
    """A program as plain data, so hypothesis can shrink and print it."""
    names = sorted(DIMS)
    inputs = [_dims_subset(draw, names) for _ in range(2)]
    shapes = [list(s) for s in inputs]
    steps: list[tuple] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["einsum", "unary", "binary", "reduce"]))
        i = draw(st.integers(0, len(shapes) - 1))
        j = draw(st.integers(0, len(shapes) - 1))
        union = list(dict.fromkeys(shapes[i] + shapes[j]))
        if kind == "einsum":
            out = _dims_subset(draw, union, min_size=0)
            steps.append(("einsum", i, j, out))
        elif kind == "unary":
            out = shapes[i]
            steps.append(("unary", draw(st.sampled_from(UNARY)), i))
        elif kind == "binary":
            out = union
            steps.append(("binary", draw(st.sampled_from(BINARY)), i, j))
        else:
            out = _dims_subset(draw, shapes[i], min_size=0)[: len(shapes[i]) - 1]
            steps.append(("reduce", draw(st.sampled_from(REDUCE)), i, out))
        shapes.append(list(out))
    return {"inputs": inputs, "steps": steps}


@st.composite
def layouts(draw: Any) -> LayoutCase:
    """A valid layout: each dim on at most one mesh axis, each axis splitting at
    most one dim (so no op can put two of its dims on one axis), sizes divisible."""
    mesh = mtf.convert_to_shape(draw(st.sampled_from(MESHES)))
    rules = []
    for axis in mesh:
        candidates = [
            n
            for n, size in DIMS.items()
            if size % axis.size == 0 and n not in {t for t, _ in rules}
        ]
        # one axis in four stays unused, so most draws really split something
        if candidates and draw(st.integers(0, 3)):
            rules.append((draw(st.sampled_from(candidates)), axis.name))
    return LayoutCase("drawn", str(mesh).replace(",", ";"), str(mtf.LayoutRules(rules)))


def _shape(names: list[str]) -> mtf.Shape:
    return mtf.Shape([(n, DIMS[n]) for n in names])


def _build(program: dict[str, Any], seed: int) -> tuple:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    rng = np.random.RandomState(seed)
    xs = [mtf.placeholder(mesh, _shape(s)) for s in program["inputs"]]
    feeds = {x: rng.randn(*x.shape.to_integer_list()).astype(np.float32) for x in xs}
    ts = list(xs)
    for step in program["steps"]:
        if step[0] == "einsum":
            _, i, j, out = step
            inputs = [ts[i]] if i == j else [ts[i], ts[j]]
            ts.append(mtf.einsum(inputs, output_shape=_shape(out)))
        elif step[0] == "unary":
            ts.append(getattr(mtf, step[1])(ts[step[2]]))
        elif step[0] == "binary":
            ts.append(getattr(mtf, step[1])(ts[step[2]], ts[step[3]]))
        else:
            _, fn, i, out = step
            ts.append(getattr(mtf, fn)(ts[i], output_shape=_shape(out)))
    loss = weighted_sum(ts[-1], upstream_for(ts[-1], rng))
    grads = mtf.gradients([loss], xs)
    outputs = ts[len(xs) :] + [g for g in grads if g is not None]
    return graph, mesh, outputs, feeds


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(program=programs(), case=layouts(), seed=st.integers(0, 2**16))
def test_random_programs_give_one_device_results_under_random_layouts(
    devices: list[str], program: dict[str, Any], case: LayoutCase, seed: int
) -> None:
    graph, mesh, outputs, feeds = _build(program, seed)
    want, _ = lower(graph, mesh, ONE_DEVICE, devices, outputs, feeds)
    got, _ = lower(graph, mesh, case, devices, outputs, feeds)
    for t, a, b in zip(outputs, got, want):
        # einsums sum up to 256 products: scale the tolerance with the values
        atol = 1e-5 * (1.0 + float(np.max(np.abs(b), initial=0.0)))
        np.testing.assert_allclose(
            a, b, rtol=1e-5, atol=atol, err_msg=f"{t.name} [{t.shape}] under {case}"
        )
