"""How a variable's first value is made, in TensorFlow: the default
initializer of a variable that names none, and building it outside any
control dependencies.

Both the per-device slices (:mod:`mtf_core.lowering.variables`) and Mesh TF's
master variables (:mod:`mtf_core.lowering.masters`) start from these.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf


def default_initializer(name: str) -> Any:
    """Glorot-uniform with a seed derived from the variable's name (deterministic)."""
    seed = zlib.crc32(name.encode()) & 0x7FFFFFFF

    def init(shape: list[int], dtype: Any) -> Any:
        if len(shape) == 0:
            return tf.zeros([], dtype)
        fan_out = shape[-1]
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
        return tf.random.stateless_uniform(
            shape, [seed, 0], -limit, limit, dtype=tf.float32
        )

    return init


@contextlib.contextmanager
def outside_all_rewrites() -> Iterator[None]:
    """Builds ops outside any enclosing control dependencies (Mesh TF uses it
    to create variables from inside a ``while_loop`` or a ``cond``)."""
    with tf.control_dependencies(None):
        yield
