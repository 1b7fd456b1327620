"""Builders for the indexing family (one_hot, range, gather, top_k/argmax,
cumsum) and random numbers."""

from __future__ import annotations

from mtf_core.errors import SerializationError
from mtf_core.graph import Operation
from mtf_core.ops import indexing as ix
from mtf_core.ops.cumsum import Cumsum
from mtf_core.ops.random import DISTRIBUTIONS, RandomOp
from mtf_core.ops.top_k import TopK
from mtf_core.serialization import schema
from mtf_core.serialization.registry import OpSpec, register


def _dtype(spec: OpSpec) -> str:
    return schema.parse_dtype(spec.attrs.raw("dtype"), f"{spec.attrs.path}.dtype")


@register(ix.OneHot)
def _one_hot(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    return ix.OneHot(
        spec.inputs[0],
        spec.attrs.get_dim("output_dim"),
        spec.attrs.get_number("on_value", 1.0),
        spec.attrs.get_number("off_value", 0.0),
        _dtype(spec),
        name=spec.name,
    )


@register(ix.Range)
def _range(spec: OpSpec) -> Operation:
    spec.expect_inputs(0)
    return ix.Range(spec.mesh, spec.attrs.get_dim("dim"), _dtype(spec), name=spec.name)


@register(ix.Gather)
def _gather(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    weights, indices = spec.inputs
    dim = spec.input_dim("dim", spec.attrs.get_dim("dim"))
    return ix.Gather(weights, indices, dim, name=spec.name)


@register(TopK)
def _top_k(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    x = spec.inputs[0]
    reduced = spec.input_dim("reduced_dim", spec.attrs.get_dim("reduced_dim"))
    k_dim = None if spec.attrs.raw("k_dim") is None else spec.attrs.get_dim("k_dim")
    return TopK(x, reduced, k_dim, name=spec.name)


@register(Cumsum)
def _cumsum(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    x = spec.inputs[0]
    dim = spec.input_dim("dim")
    exclusive = spec.attrs.get_bool("exclusive", False)
    reverse = spec.attrs.get_bool("reverse", False)
    return Cumsum(x, dim, exclusive, reverse, name=spec.name)


@register(RandomOp)
def _random(spec: OpSpec) -> Operation:
    # The seed is kept, so the rebuilt op draws the same numbers.
    spec.expect_inputs(0)
    distribution = spec.attrs.get_choice("distribution", DISTRIBUTIONS)
    path = f"{spec.attrs.path}.params"
    params = schema.expect_list(spec.attrs.raw("params"), path)
    if len(params) != 2:
        raise SerializationError(
            f"{path}: expected two numbers (minval, maxval or mean, stddev), got "
            f"{len(params)}"
        )
    # ints stay ints: integer dtypes need integer bounds
    a, b = (
        p
        if isinstance(p, int) and not isinstance(p, bool)
        else schema.expect_number(p, f"{path}[{i}]")
        for i, p in enumerate(params)
    )
    seed = spec.attrs.get_int("seed")
    return RandomOp(
        spec.mesh,
        spec.output_shape(),
        distribution,
        (a, b),
        _dtype(spec),
        seed,
        name=spec.name,
    )
