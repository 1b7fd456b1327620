"""Shared by the lowering tests: the standard layouts and eager lower-and-export.

Every op family is checked under the same four layouts of 8 logical CPUs (one
device, batch split, model split, a 2-D split), whose dims are named ``batch``
(split on ``data``) and ``hidden`` (split on ``model``).  Tests build tensors
with those dims so each layout really splits something.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import mtf_core as mtf

# float32 sums in a different order (per-slice partial sums, then an allreduce)
# differ from one device by a few ulps of the largest partial sum.
RTOL = 2e-5
ATOL = 2e-5


@dataclass(frozen=True)
class LayoutCase:
    """A mesh shape and layout rules to lower a graph under."""

    name: str
    mesh_shape: str
    rules: str

    @property
    def n_devices(self) -> int:
        return mtf.convert_to_shape(self.mesh_shape).size

    def impl(self, devices: Sequence[str]) -> Any:
        return mtf.PlacementMeshImpl(
            self.mesh_shape, self.rules, devices[: self.n_devices]
        )


ONE_DEVICE = LayoutCase("one_device", "all:1", "")
BATCH_SPLIT = LayoutCase("batch_split", "data:4", "batch:data")
MODEL_SPLIT = LayoutCase("model_split", "model:4", "hidden:model")
SPLIT_2D = LayoutCase("split_2d", "data:2;model:4", "batch:data;hidden:model")
LAYOUTS = (ONE_DEVICE, BATCH_SPLIT, MODEL_SPLIT, SPLIT_2D)
LAYOUT_IDS = [c.name for c in LAYOUTS]


def lower(
    graph: mtf.Graph,
    mesh: mtf.Mesh,
    case: LayoutCase,
    devices: Sequence[str],
    outputs: Sequence[mtf.Tensor],
    feeds: Mapping[mtf.Tensor, Any] | None = None,
) -> tuple[list[np.ndarray], Any]:
    """Lowers ``graph`` eagerly under ``case``; returns the outputs' full values
    and the Lowering (for its counters)."""
    lowering = mtf.Lowering(
        graph, {mesh: case.impl(devices)}, feeds=feeds, targets=list(outputs)
    )
    values = [lowering.export_to_tf_tensor(t).numpy() for t in outputs]
    return values, lowering


def collective_specs(collectives: Sequence[Any]) -> list[tuple[Any, ...]]:
    r"""``(kind, mesh_axes, bytes_per_device)`` of recorded collectives or of
    :class:`mtf_core.comm.CollectiveSpec`\ s, to compare the two."""
    return [(c.kind, c.mesh_axes, c.bytes_per_device) for c in collectives]


def assert_communication_as_recorded(
    devices: Sequence[str],
    build: Callable[[], tuple[mtf.Graph, mtf.Mesh, Any]],
    cases: Sequence[LayoutCase] = LAYOUTS,
) -> dict[str, list[tuple[Any, ...]]]:
    """For each layout: lowers ``build()`` (a graph, its mesh and the output
    tensor or tensors) and asserts that every lowered op's
    ``communication(ctx)`` lists exactly the collectives recorded against it,
    in order; returns all recorded collectives per layout."""
    from mtf_core.lowering.lowering import needed_operations

    out = {}
    for case in cases:
        graph, mesh, ys = build()
        ys = ys if isinstance(ys, list) else [ys]
        ctx = case.impl(devices).ctx
        _, lowering = lower(graph, mesh, case, devices, ys)
        records = lowering.counters.collectives
        for op in needed_operations(graph, ys):
            mine = collective_specs([r for r in records if r.op_name == op.name])
            assert mine == collective_specs(op.communication(ctx)), (
                case.name,
                op.name,
            )
        out[case.name] = collective_specs(records)
    return out


def assert_same_under_layouts(
    graph: mtf.Graph,
    mesh: mtf.Mesh,
    devices: Sequence[str],
    outputs: Sequence[mtf.Tensor],
    feeds: Mapping[mtf.Tensor, Any] | None = None,
    layouts: Sequence[LayoutCase] = LAYOUTS,
) -> list[np.ndarray]:
    """Lowers under every layout, asserts each equals the first (one device)
    and returns the first layout's values."""
    reference, _ = lower(graph, mesh, layouts[0], devices, outputs, feeds)
    for case in layouts[1:]:
        values, _ = lower(graph, mesh, case, devices, outputs, feeds)
        for t, want, got in zip(outputs, reference, values):
            msg = f"{t.name} under {case.name} differs from {layouts[0].name}"
            assert_close(got, want, err_msg=msg)
    return reference


def upstream_for(y: mtf.Tensor, rng: np.random.RandomState) -> np.ndarray:
    """Random weights for :func:`weighted_sum`: every element of ``y`` gets a
    different upstream gradient (a plain sum would hide transposed gradients)."""
    return rng.uniform(0.5, 1.5, y.shape.to_integer_list()).astype(np.float32)


def weighted_sum(y: mtf.Tensor, upstream: np.ndarray) -> mtf.Tensor:
    """``sum(y * upstream)``: a scalar loss whose gradient wrt ``y`` is ``upstream``."""
    return mtf.reduce_sum(y * mtf.constant(y.mesh, upstream, y.shape, y.dtype))


def assert_close(got: np.ndarray, want: np.ndarray, err_msg: str = "") -> None:
    """float32 tolerance for floats; exact for integers and booleans."""
    if np.asarray(want).dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=err_msg)
    else:
        np.testing.assert_array_equal(got, want, err_msg=err_msg)


def tf_reference(
    fn: Callable[..., Any],
    inputs: Sequence[np.ndarray],
    upstream: np.ndarray | None,
    wrt: Sequence[int] = (),
) -> list[np.ndarray]:
    """``fn(*inputs)`` in plain TensorFlow on one device, then the gradients of
    ``sum(fn(*inputs) * upstream)`` with respect to ``inputs[i]`` for ``i`` in
    ``wrt`` (tf.GradientTape): an independent check of values and of our own
    autodiff."""
    import tensorflow as tf

    xs = [tf.constant(x) for x in inputs]
    with tf.GradientTape() as tape:
        for i in wrt:
            tape.watch(xs[i])
        y = fn(*xs)
        loss = None if upstream is None else tf.reduce_sum(y * upstream)
    if not wrt:
        return [np.asarray(y)]
    grads = tape.gradient(loss, [xs[i] for i in wrt])
    return [np.asarray(y)] + [g.numpy() for g in grads]


def check_op(
    devices: Sequence[str],
    shapes: Sequence[str],
    mtf_fn: Callable[..., mtf.Tensor],
    tf_fn: Callable[..., Any],
    values: Sequence[np.ndarray] | None = None,
    grads: bool = True,
    seed: int = 0,
) -> list[np.ndarray]:
    """Checks one op (and its gradient) under every layout against TensorFlow.

    ``mtf_fn`` maps placeholders of ``shapes`` to a tensor; ``tf_fn`` computes
    the same on full tf tensors, with the output's dims in the same order.
    Inputs are random normals unless ``values`` are given; gradients are taken
    with respect to every floating input.  Returns ``[y, *gradients]`` from
    one device.
    """
    rng = np.random.RandomState(seed)
    if values is None:
        values = [
            rng.randn(*mtf.convert_to_shape(s).to_integer_list()).astype(np.float32)
            for s in shapes
        ]
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xs = [mtf.placeholder(mesh, s, dtype=v.dtype.name) for s, v in zip(shapes, values)]
    y = mtf_fn(*xs)
    outputs = [y]
    wrt = [i for i, v in enumerate(values) if v.dtype.kind == "f"] if grads else []
    upstream = upstream_for(y, rng) if wrt else None
    if wrt:
        outputs += mtf.gradients([weighted_sum(y, upstream)], [xs[i] for i in wrt])
    got = assert_same_under_layouts(
        graph, mesh, devices, outputs, dict(zip(xs, values))
    )
    want = tf_reference(tf_fn, values, upstream, wrt)
    names = ["value"] + [f"gradient wrt input {i}" for i in wrt]
    for name, g, w in zip(names, got, want):
        assert_close(g, w, err_msg=f"{name} differs from TensorFlow")
    return got
