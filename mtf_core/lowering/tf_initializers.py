"""TensorFlow's initializers for the distributions mtf_core's layers draw
from, as Mesh TensorFlow's layers create them.

:func:`mesh_tf_initializer` is the provider ``mtf_core.compat`` installs with
:func:`mtf_core.layers.set_initializer_provider`, so an unchanged Mesh
TensorFlow program gets the initializers its own layers would make (and that
its tests mock).  TensorFlow is looked up at each call, so a patched
``tf.random_normal_initializer`` is the one used.
"""

from __future__ import annotations

from typing import Any

import tensorflow.compat.v1 as tf1


def mesh_tf_initializer(distribution: str, stddev: float) -> Any:
    """``tf.random_normal_initializer``, ``tf.truncated_normal_initializer``
    or ``tf.random_uniform_initializer`` (of the same variance) for
    ``distribution`` ("normal", "truncated_normal", "uniform"); None for
    another."""
    if distribution == "normal":
        return tf1.random_normal_initializer(stddev=stddev)
    if distribution == "truncated_normal":
        return tf1.truncated_normal_initializer(stddev=stddev)
    if distribution == "uniform":
        limit = stddev * 3.0**0.5
        return tf1.random_uniform_initializer(-limit, limit)
    return None
