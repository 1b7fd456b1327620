"""Dtypes without TensorFlow.

mtf_core never imports TensorFlow (only ``mtf_core.lowering`` does), yet users
pass TensorFlow dtypes.  Internally a dtype is its canonical name string
(``"float32"``); :func:`as_dtype_name` accepts a ``tf.DType``, a NumPy dtype or
a name.  ``tf.float32 == "float32"`` is true in TensorFlow, so code comparing a
tensor's dtype with ``tf.float32`` keeps working.
"""

from __future__ import annotations

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
