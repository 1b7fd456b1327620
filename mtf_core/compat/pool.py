"""``mtf.PoolOperation``: Mesh TF's pooling op, lowered with TensorFlow's
pooling kernels on each device's slice.

mtf_core's own ``mtf.layers.max_pool2d`` and friends pool by a reshape and a
reduction (any layout splitting a pooled dim into whole windows works);
Mesh TF programs that build ``PoolOperation`` themselves get this op, with
Mesh TF's contract: ``x [batch..., spatial..., channels]`` pooled over its
2 (``*_2D``) or 3 (``*_3D``) spatial dims with "VALID" windows, the spatial
dims unsplittable (a window never straddles devices), the others
splittable.  Its gradient is :class:`PoolBackPropOperation`, TensorFlow's
pooling gradient kernels on each slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.compat.operation import Operation
from mtf_core.errors import ArgumentError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.seams import LoweringContext
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import Dimension, Shape

# pool_fn_string -> (reduction, number of spatial dims)
POOLS: dict[str, tuple[str, int]] = {
    "MAX_2D": ("max", 2),
    "AVG_2D": ("avg", 2),
    "MAX_3D": ("max", 3),
    "AVG_3D": ("avg", 3),
}


def _window(
    what: str, x: Tensor, ksize: Sequence[int], strides: Sequence[int], fn: str
) -> tuple[str, list[int], list[int]]:
    """The reduction, window and strides of pooling ``x`` with ``fn``."""
    if fn not in POOLS:
        raise ArgumentError(
            f"{what}: pool_fn_string {fn!r}; expected one of {sorted(POOLS)}"
        )
    kind, n = POOLS[fn]
    k, s = [int(v) for v in ksize], [int(v) for v in strides]
    if len(k) != n or len(s) != n or min(k + s) < 1:
        raise ArgumentError(
            f"{what}: ksize {list(ksize)} and strides {list(strides)}; {fn} "
            f"expects {n} positive sizes each"
        )
    if x.shape.ndims < n + 1:
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] has no {n} spatial dims before its channels"
        )
    for d, w in zip(x.shape.dims[-1 - n : -1], k):
        if d.size < w:
            raise ShapeError(f"{what}: window {w} is larger than {d} of {x.name}")
    return kind, k, s


def _flat(tf: Any, t: Any, n: int) -> tuple[Any, list[int]]:
    """``t [batch..., spatial(n)..., c]`` as ``[b, spatial..., c]``, and the
    batch dims' sizes."""
    shape = t.shape.as_list()
    return tf.reshape(t, [-1, *shape[-1 - n :]]), shape[: -1 - n]


class PoolOperation(Operation):
    """Max or average pooling of ``x``'s spatial dims (see the module)."""

    op_type = "Pool"

    def __init__(
        self,
        x: Tensor,
        ksize: Sequence[int],
        strides: Sequence[int],
        pool_fn_string: str,
        name: str | None = None,
    ) -> None:
        super().__init__([x], name=name or "pool")
        self.kind, self.ksize, self.strides = _window(
            f"PoolOperation {self.name}", x, ksize, strides, pool_fn_string
        )
        self.pool_fn_string = pool_fn_string
        n = len(self.ksize)
        dims = list(x.shape.dims)
        spatial = dims[-1 - n : -1]
        pooled = [
            Dimension(d.name, (d.size - k) // s + 1)
            for d, k, s in zip(spatial, self.ksize, self.strides)
        ]
        self._add_output(Shape(dims[: -1 - n] + pooled + dims[-1:]), x.dtype)
        self._splittable_dims, self._unsplittable_dims = (
            self._initialize_splittable_and_unsplittable_dims(
                "splittable", [d.name for d in spatial]
            )
        )

    def flops(self) -> float:
        """One per window element of each output."""
        window = 1
        for k in self.ksize:
            window *= k
        return float(self.outputs[0].size * window)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        x, y = self.inputs[0], self.outputs[0]
        op = PoolBackPropOperation(
            x, y, dy, self.ksize, self.strides, self.pool_fn_string
        )
        return [op.outputs[0]]

    def lower(self, lowering: LoweringContext) -> None:
        tf, n = lowering.tf, len(self.ksize)
        pool = tf.nn.max_pool if self.kind == "max" else tf.nn.avg_pool

        def fn(t: Any) -> Any:
            flat, batch = _flat(tf, t, n)
            y = pool(flat, self.ksize, self.strides, "VALID")
            return tf.reshape(y, [*batch, *y.shape.as_list()[1:]])

        x = lowering.tensors[self.inputs[0]]
        lowering.set_tensor_lowering(
            self.outputs[0], lowering.mesh_impl(self).slicewise(fn, x)
        )

    def attrs(self) -> dict[str, Any]:
        return {
            "ksize": self.ksize,
            "strides": self.strides,
            "pool_fn_string": self.pool_fn_string,
        }


class PoolBackPropOperation(Operation):
    """The gradient of :class:`PoolOperation` with respect to its input
    ``x``, given its output ``y`` and that output's gradient ``dy``
    (TensorFlow's ``MaxPoolGrad``/``AvgPoolGrad`` kernels and their 3-D
    forms: a max window's gradient goes to one maximal element)."""

    op_type = "PoolBackProp"

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        dy: Tensor,
        ksize: Sequence[int],
        strides: Sequence[int],
        pool_fn_string: str,
        name: str | None = None,
    ) -> None:
        super().__init__([x, y, dy], name=name or "pool_backprop")
        what = f"PoolBackPropOperation {self.name}"
        self.kind, self.ksize, self.strides = _window(
            what, x, ksize, strides, pool_fn_string
        )
        if y.shape != dy.shape:
            raise ShapeError(f"{what}: y [{y.shape}] and dy [{dy.shape}] differ")
        self.pool_fn_string = pool_fn_string
        self._add_output(x.shape, dy.dtype)
        n = len(self.ksize)
        self._splittable_dims, self._unsplittable_dims = (
            self._initialize_splittable_and_unsplittable_dims(
                "splittable", [d.name for d in x.shape.dims[-1 - n : -1]]
            )
        )

    @property
    def has_gradient(self) -> bool:
        return False

    def flops(self) -> float:
        return float(self.outputs[0].size)

    def lower(self, lowering: LoweringContext) -> None:
        tf, n = lowering.tf, len(self.ksize)
        window = [1, *self.ksize, 1]
        strides = [1, *self.strides, 1]
        raw = tf.raw_ops
        grad_of_max = raw.MaxPoolGrad if n == 2 else raw.MaxPool3DGrad
        grad_of_avg = raw.AvgPoolGrad if n == 2 else raw.AvgPool3DGrad

        def fn(x: Any, y: Any, dy: Any) -> Any:
            flat_x, batch = _flat(tf, x, n)
            flat_y, flat_dy = _flat(tf, y, n)[0], _flat(tf, dy, n)[0]
            if self.kind == "max":
                dx = grad_of_max(
                    orig_input=flat_x, orig_output=flat_y, grad=flat_dy,
                    ksize=window, strides=strides, padding="VALID",
                )  # fmt: skip
            else:
                dx = grad_of_avg(
                    orig_input_shape=tf.shape(flat_x), grad=flat_dy,
                    ksize=window, strides=strides, padding="VALID",
                )  # fmt: skip
            return tf.reshape(dx, x.shape.as_list())

        impl = lowering.mesh_impl(self)
        laid = [lowering.tensors[t] for t in self.inputs]
        lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(fn, *laid))

    def attrs(self) -> dict[str, Any]:
        return {
            "ksize": self.ksize,
            "strides": self.strides,
            "pool_fn_string": self.pool_fn_string,
        }


def pool_backprop(
    x: Tensor,
    y: Tensor,
    dy: Tensor,
    ksize: Sequence[int],
    strides: Sequence[int],
    pool_fn_string: str,
    name: str | None = None,
) -> Tensor:
    """Mesh TF's ``mtf.pool_backprop``: see :class:`PoolBackPropOperation`."""
    return PoolBackPropOperation(
        x, y, dy, ksize, strides, pool_fn_string, name
    ).outputs[0]


@register(PoolOperation)
def _pool_from_document(spec: OpSpec) -> PoolOperation:
    spec.expect_inputs(1)
    return PoolOperation(
        spec.inputs[0],
        spec.attrs.get_int_list("ksize", minimum=1),
        spec.attrs.get_int_list("strides", minimum=1),
        spec.attrs.get_str("pool_fn_string"),
        name=spec.name,
    )


@register(PoolBackPropOperation)
def _pool_backprop_from_document(spec: OpSpec) -> PoolBackPropOperation:
    spec.expect_inputs(3)
    x, y, dy = spec.inputs
    return PoolBackPropOperation(
        x,
        y,
        dy,
        spec.attrs.get_int_list("ksize", minimum=1),
        spec.attrs.get_int_list("strides", minimum=1),
        spec.attrs.get_str("pool_fn_string"),
        name=spec.name,
    )
