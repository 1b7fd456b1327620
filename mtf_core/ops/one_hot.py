"""``one_hot``: its own module, below :mod:`einsum` (whose one-hot lookups
recognise it, :mod:`onehot_einsum`) and :mod:`indexing` (which re-exports it),
so the op families import one another in one direction only.

Lowering when ``output_dim`` is split over mesh axis ``m`` (``n`` devices, each
holding ``k = size / n`` positions): device ``c`` builds its own block
``[c*k, (c+1)*k)`` from its mesh coordinate; no communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, DTypeError, ShapeError
from mtf_core.graph import Operation, Tensor, check_tensor
from mtf_core.ops.arguments import sized_dim
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension


def check_indices(indices: Tensor, what: str) -> None:
    check_tensor(indices, f"{what}: indices")
    if indices.dtype not in dtypes.INTEGER:
        raise DTypeError(
            f"{what}: indices {indices.name} have dtype {indices.dtype}; expected "
            "an integer dtype such as int32"
        )


def wide_ids(tf: Any, i: Any) -> Any:
    """Ids as int32/int64 (what tf.one_hot and tf.gather take)."""
    return i if i.dtype in (tf.int32, tf.int64) else tf.cast(i, tf.int32)


def _number(value: Any, what: str) -> float:
    """``value`` as the float one_hot fills with; a string is refused, though
    float() would parse "1"."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError(value)
        return float(value)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"one_hot: {what} is {value!r}; expected a number"
        ) from None


class OneHot(Operation):
    """``one_hot(indices, output_dim)``: ``indices.shape + [output_dim]``."""

    op_type = "OneHot"

    def __init__(
        self,
        indices: Tensor,
        output_dim: Dimension,
        on_value: float,
        off_value: float,
        dtype: Any,
        name: str | None = None,
    ) -> None:
        check_indices(indices, "one_hot")
        if output_dim.name in indices.shape.dimension_names:
            raise ShapeError(
                f"one_hot: output dimension {output_dim} is already a dimension of "
                f"{indices.name} [{indices.shape}]; give it another name"
            )
        super().__init__([indices], name=name or "one_hot")
        self.output_dim = output_dim
        self.on_value = _number(on_value, "on_value")
        self.off_value = _number(off_value, "off_value")
        self._add_output(indices.shape + [output_dim], dtypes.as_dtype_name(dtype))

    @property
    def has_gradient(self) -> bool:
        return False

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [None]

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        out = self.outputs[0]
        k = impl.slice_shape(out.shape)[-1]
        dt = out.dtype
        on, off = tf.cast(self.on_value, dt), tf.cast(self.off_value, dt)
        ids = lowering.tensors[self.inputs[0]]
        m = impl.ctx.effective_mesh_axis(self.output_dim.name)

        def local(i: Any, c: Any) -> Any:
            # Ids outside this device's block [c*k, (c+1)*k) become off values.
            i = wide_ids(tf, i)
            return tf.one_hot(i - tf.cast(c * k, i.dtype), k, on, off, dtype=dt)

        coord = 0 if m is None else impl.laid_out_pcoordinate(m)
        res = impl.slicewise(local, ids, coord)
        lowering.set_tensor_lowering(out, res)

    def attrs(self) -> dict[str, Any]:
        return {
            "output_dim": str(self.output_dim),
            "on_value": self.on_value,
            "off_value": self.off_value,
            "dtype": self.outputs[0].dtype,
        }


def one_hot(
    indices: Tensor,
    output_dim: Any,
    on_value: float = 1.0,
    off_value: float = 0.0,
    dtype: Any = "float32",
    name: str | None = None,
) -> Tensor:
    """One-hot encoding along a new dimension ``output_dim``.

    Ids outside ``[0, output_dim.size)`` give a row of ``off_value``.

    >>> # labels [batch] int32 -> [batch, classes] float32
    >>> # onehot = mtf.one_hot(labels, classes_dim, dtype=mtf.float32)
    """
    return OneHot(
        indices, sized_dim(output_dim, "one_hot"), on_value, off_value, dtype, name
    ).outputs[0]
