"""Dtypes without TensorFlow.

mtf_core never imports TensorFlow (only ``mtf_core.lowering`` does), yet users
pass TensorFlow dtypes.  Internally a dtype is its canonical name string
(``"float32"``); :func:`as_dtype_name` accepts a ``tf.DType``, a NumPy dtype or
a name.  ``tf.float32 == "float32"`` is true in TensorFlow, so code comparing a
tensor's dtype with ``tf.float32`` keeps working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtf_core.errors import DTypeError

SIZES_BYTES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
}

FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})
INTEGER = frozenset({"int8", "uint8", "int16", "int32", "int64"})

float16 = "float16"
bfloat16 = "bfloat16"
float32 = "float32"
float64 = "float64"
int32 = "int32"
int64 = "int64"
bool_ = "bool"


def as_dtype_name(dtype: Any) -> str:
    """Returns the canonical name of ``dtype`` (a tf.DType, numpy dtype or str).

    >>> as_dtype_name("float32")
    'float32'
    """
    if isinstance(dtype, str):
        name = dtype
    elif hasattr(dtype, "name") and isinstance(dtype.name, str):
        name = dtype.name
    elif isinstance(dtype, type) and hasattr(dtype, "__name__"):
        name = {"float": "float32", "int": "int32", "bool": "bool"}.get(
            dtype.__name__, dtype.__name__
        )
    else:
        raise DTypeError(f"dtype {dtype!r} is not a dtype; expected e.g. tf.float32")
    if name.endswith("_ref"):
        name = name[:-4]
    if name not in SIZES_BYTES:
        raise DTypeError(
            f"dtype {dtype!r} is not supported; expected one of {sorted(SIZES_BYTES)}"
        )
    return name


def size_bytes(dtype: Any) -> int:
    """Bytes per element of ``dtype``."""
    return SIZES_BYTES[as_dtype_name(dtype)]


def is_floating(dtype: Any) -> bool:
    return as_dtype_name(dtype) in FLOATING


@dataclass(frozen=True)
class VariableDType:
    """The three dtypes of a variable (Mesh TensorFlow's ``mtf.VariableDType``).

    * ``master_dtype``: what a checkpoint holds (``VariableStore.export``);
    * ``slice_dtype``: what each device's slice is stored and updated in
      (defaults to ``master_dtype``);
    * ``activation_dtype``: what ``get_variable`` returns, the dtype the model
      computes in (defaults to ``master_dtype``).

    A float32 master with bfloat16 activations keeps the weights and their
    updates in float32 while matmuls run in bfloat16; the cast is an mtf op, so
    its gradient casts back.

    >>> vd = VariableDType("float32", activation_dtype="bfloat16")
    >>> (vd.master_dtype, vd.slice_dtype, vd.activation_dtype)
    ('float32', 'float32', 'bfloat16')
    """

    master_dtype: Any = "float32"
    slice_dtype: Any = None
    activation_dtype: Any = None

    def __post_init__(self) -> None:
        # Canonical names, the unset ones defaulting to the master dtype.
        master = as_dtype_name(self.master_dtype or "float32")
        object.__setattr__(self, "master_dtype", master)
        for field in ("slice_dtype", "activation_dtype"):
            value = getattr(self, field)
            object.__setattr__(
                self, field, master if value is None else as_dtype_name(value)
            )


def as_variable_dtype(
    dtype: Any,
    master_dtype: Any = None,
    slice_dtype: Any = None,
    activation_dtype: Any = None,
) -> VariableDType:
    """``dtype`` (a VariableDType, a dtype, or None) as a VariableDType; the
    separate dtypes, when given, override what a plain ``dtype`` implies (as
    Mesh TensorFlow's deprecated ``master_dtype=...`` arguments do)."""
    if isinstance(dtype, VariableDType):
        return dtype
    if dtype is None:
        return VariableDType(master_dtype, slice_dtype, activation_dtype)
    base = as_dtype_name(dtype)
    return VariableDType(
        master_dtype or base, slice_dtype or base, activation_dtype or base
    )
