"""Ops that make tensors: imported TF tensors, placeholders and constants."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from mtf_core import dtypes
from mtf_core.errors import DTypeError, GraphError, LoweringError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor, check_tensor
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape, convert_to_shape


class ImportTensor(Operation):
    """Brings a full TensorFlow value into the mesh, sliced by the layout.

    With no value it is a placeholder, fed at lowering time
    (``Lowering(feeds={tensor: value})`` or a compiled step's arguments).
    """

    op_type = "ImportTensor"

    def __init__(
        self,
        mesh: Mesh,
        value: Any,
        shape: Any,
        dtype: Any = None,
        name: str | None = None,
    ) -> None:
        super().__init__([], mesh=mesh, name=name or "import")
        shape = convert_to_shape(shape)
        self.value = value
        if value is not None:
            vshape = list(getattr(value, "shape", np.shape(value)))
            if [
                int(s) if s is not None else -1 for s in vshape
            ] != shape.to_integer_list():
                raise GraphError(
                    f"import_tf_tensor: value of shape {vshape} does not match shape "
                    f"[{shape}] ({shape.to_integer_list()})"
                )
            if dtype is None:
                dtype = getattr(value, "dtype", None)
            if dtype is None:
                # A Python list or number converts as TensorFlow converts it
                # (ints to int32, floats to float32), not as NumPy would.
                kind = np.asarray(value).dtype.kind
                dtype = {"i": "int32", "u": "int32", "f": "float32"}.get(
                    kind, np.asarray(value).dtype
                )
        self._add_output(shape, dtype or "float32")

    @property
    def is_placeholder(self) -> bool:
        return self.value is None

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Any) -> list[Tensor | None]:
        return []

    def lower(self, lowering: LoweringContext) -> None:
        out = self.outputs[0]
        if out in lowering.feeds:
            value = lowering.feeds[out]
        elif self.value is not None:
            value = self.value
        else:
            raise LoweringError(
                f"placeholder {self.name} [{out.shape}] was not fed; pass "
                "feeds={tensor: value} to Lowering"
            )
        tf = lowering.tf
        what = f"the value fed for placeholder {out.name}"
        if out not in lowering.feeds:
            what = f"the value of {out.name}"
        value = fed_value(tf, value, out, what)
        lowering.set_tensor_lowering(
            out, lowering.mesh_impl(self).import_tf_tensor(value, out.shape)
        )

    def attrs(self) -> dict[str, Any]:
        return {"placeholder": self.is_placeholder}


def check_full_value(value: Any, like: Any, what: str) -> Any:
    """``value`` (a ``tf.Tensor``) if its shape can be ``like``'s (a Tensor or
    Variable; dims TensorFlow does not know pass) and it holds numbers: a
    backend would slice a value of another shape without a word, and give a
    tensor other sizes than its dims say."""
    sizes = like.shape.to_integer_list()
    if not value.shape.is_compatible_with(sizes):
        raise ShapeError(
            f"{what} has shape {value.shape.as_list()}; expected [{like.shape}] "
            f"({sizes})"
        )
    dt = value.dtype
    if not (dt.is_floating or dt.is_integer or dt.is_bool):
        raise DTypeError(f"{what} has dtype {dt.name}; expected numbers ({like.dtype})")
    return value


def fed_value(tf: Any, value: Any, like: Any, what: str) -> Any:
    """``value`` as a ``tf.Tensor`` of ``like``'s dtype, checked as
    :func:`check_full_value` checks it and, for an integer dtype, holding
    whole numbers that fit it (where its numbers can be read: eagerly): a
    cast would truncate 0.7 to 0 and wrap 2**40 round in an int32."""
    t = check_full_value(tf.convert_to_tensor(value), like, what)
    want = tf.as_dtype(like.dtype)
    if t.dtype == want:
        return t
    if want.is_integer and not t.dtype.is_bool and tf.executing_eagerly():
        problem = integer_problem(t.numpy(), want.name)
        if problem is not None:
            raise DTypeError(f"{what} {problem}")
    return tf.cast(t, want)


def integer_problem(arr: np.ndarray, dtype: str) -> str | None:
    """Why the numbers of ``arr`` (an int or float array) do not fit the
    integer ``dtype`` as they are, or None if they do."""
    if not arr.size or arr.dtype.kind == "b":
        return None
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr % 1 == 0)):
        return (
            f"has a fraction or is not finite; a {dtype} holds whole numbers "
            "(cast to a float dtype, or round)"
        )
    info = np.iinfo(dtype)
    if arr.min() < info.min or arr.max() > info.max:
        return f"does not fit {dtype} ([{info.min}, {info.max}])"
    return None


def import_tf_tensor(
    mesh: Mesh, tf_tensor: Any, shape: Any = None, name: str | None = None
) -> Tensor:
    """Imports a full ``tf.Tensor`` (or array) as an mtf tensor of ``shape``."""
    if shape is None:
        raise GraphError("import_tf_tensor needs the named shape of the tensor")
    return ImportTensor(mesh, tf_tensor, shape, name=name).outputs[0]


def placeholder(
    mesh: Mesh, shape: Any, dtype: Any = "float32", name: str | None = None
) -> Tensor:
    """A tensor fed with a new full value at each lowering / compiled call."""
    return ImportTensor(
        mesh, None, shape, dtype=dtype, name=name or "placeholder"
    ).outputs[0]


class Constant(Operation):
    """A tensor filled with one scalar value (or an array) known at build time.

    ``value`` may also be a function of no arguments that makes the array:
    it is called when the value is first needed (lowering, serializing), so
    graphs that are only planned never make it (a causal attention bias at
    length 4096 is 64 MiB)."""

    op_type = "Constant"

    def __init__(
        self, mesh: Mesh, value: Any, shape: Any, dtype: Any, name: str | None = None
    ) -> None:
        super().__init__([], mesh=mesh, name=name or "constant")
        shape = convert_to_shape(shape)
        self._make: Callable[[], Any] | None = None
        self._value: np.ndarray | None = None
        dtype = dtypes.as_dtype_name(dtype)
        if callable(value):
            self._make = value
        else:
            self._value = _checked_value(value, shape, dtype)
        self._add_output(shape, dtype)

    @property
    def value(self) -> np.ndarray:
        if self._value is None:
            assert self._make is not None
            out = self.outputs[0]
            self._value = _checked_value(self._make(), out.shape, out.dtype)
            self._make = None
        return self._value

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Any) -> list[Tensor | None]:
        return []

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        out = self.outputs[0]
        impl = lowering.mesh_impl(self)
        if self.value.ndim == 0:
            local = impl.slice_shape(out.shape)
            v = self.value.item()
            if out.dtype == "bool":
                v = bool(v)  # TF will not make a bool from the integer 1
            if local:
                laid = impl.slicewise(lambda: tf.fill(local, tf.constant(v, out.dtype)))
            else:  # a scalar: one Const per device, shared by equal scalars
                laid = lowering.memoized(
                    ("scalar", id(impl), out.dtype, repr(v)),
                    lambda: impl.slicewise(lambda: tf.constant(v, out.dtype)),
                )
        else:
            laid = impl.import_tf_tensor(tf.constant(self.value, out.dtype), out.shape)
        lowering.set_tensor_lowering(out, laid)

    def attrs(self) -> dict[str, Any]:
        return {"value": self.value.tolist()}


class CausalBias(Constant):
    """``[length, memory_length]``: 0 where the key position is at most the
    query position, -1e9 elsewhere (added to attention logits).

    A constant made from its shape alone, so the graph format writes no
    array for it: as a ``Constant`` a model at length 2048 wrote 4,194,304
    numbers (42 MB of JSON), over what a reader accepts."""

    op_type = "CausalBias"

    def __init__(
        self,
        mesh: Mesh,
        length_dim: Dimension,
        memory_length_dim: Dimension,
        name: str | None = None,
    ) -> None:
        values = functools.partial(
            causal_bias_values, length_dim.size, memory_length_dim.size
        )
        shape = Shape([length_dim, memory_length_dim])
        super().__init__(mesh, values, shape, "float32", name or "causal_bias")

    def attrs(self) -> dict[str, Any]:
        return {}


@functools.lru_cache(maxsize=8)
def causal_bias_values(length: int, memory_length: int) -> np.ndarray:
    """The causal bias values, made once per size and shared, read-only, by
    every graph that asks (a planner builds dozens of stage graphs: at length
    4096 each array is 64 MiB and took a third of a graph's build time)."""
    q = np.arange(length)[:, None]
    k = np.arange(memory_length)[None, :]
    bias = np.where(k <= q, np.float32(0.0), np.float32(-1e9))
    bias.flags.writeable = False
    return bias


def _checked_value(value: Any, shape: Shape, dtype: str) -> np.ndarray:
    """``value`` as an array, if its numbers fit ``dtype`` as they are:
    TensorFlow would wrap 2**40 round in an int32 and truncate 0.5 to 0
    in an array (a scalar 0.5 it refuses, at lowering)."""
    arr = np.asarray(value)
    if arr.ndim and list(arr.shape) != shape.to_integer_list():
        raise GraphError(
            f"constant: value of shape {list(arr.shape)} does not match [{shape}]"
        )
    if arr.dtype.kind not in "biuf":
        if isinstance(value, int):  # past int64: NumPy holds it as an object
            raise DTypeError(f"constant: value {value} does not fit {dtype}")
        raise DTypeError(
            f"constant: value {_short(value)} is not a number; expected a number, "
            "a bool or an array of them"
        )
    if dtype in dtypes.INTEGER:
        problem = integer_problem(arr, dtype)
        if problem is not None:
            raise DTypeError(f"constant: value {_short(value)} {problem}")
    return arr


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def constant(
    mesh: Mesh,
    value: Any,
    shape: Any = (),
    dtype: Any = "float32",
    name: str | None = None,
) -> Tensor:
    return Constant(mesh, value, shape, dtype, name).outputs[0]


def zeros(
    mesh: Mesh, shape: Any, dtype: Any = "float32", name: str | None = None
) -> Tensor:
    return Constant(mesh, 0, shape, dtype, name or "zeros").outputs[0]


def ones(
    mesh: Mesh, shape: Any, dtype: Any = "float32", name: str | None = None
) -> Tensor:
    return Constant(mesh, 1, shape, dtype, name or "ones").outputs[0]


def zeros_like(t: Tensor) -> Tensor:
    check_tensor(t, "zeros_like:")
    return zeros(t.mesh, t.shape, t.dtype)


def ones_like(t: Tensor) -> Tensor:
    check_tensor(t, "ones_like:")
    return ones(t.mesh, t.shape, t.dtype)


def fill(mesh: Mesh, shape: Any, value: Any, dtype: Any = "float32") -> Tensor:
    return constant(mesh, value, shape, dtype)


def import_fully_replicated(
    mesh: Mesh, tf_tensor: Any, shape: Any, name: str | None = None
) -> Tensor:
    """Imports a full value that every device holds whole (Mesh TensorFlow's
    name); the lowering keeps each device's slice of it under ``shape``'s
    layout, exactly as :func:`import_tf_tensor` does."""
    return import_tf_tensor(mesh, tf_tensor, shape, name)
