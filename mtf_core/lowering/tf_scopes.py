"""TensorFlow's variable scopes, which Mesh TensorFlow's layers name their
weights under: :mod:`mtf_core.compat.layers` opens them (through
:mod:`mtf_core.layers.scopes`) for the layers a Mesh TF program calls."""

from __future__ import annotations

from contextlib import AbstractContextManager

import tensorflow.compat.v1 as tf1


def variable_scope(name: str | None, default: str) -> AbstractContextManager[object]:
    """``tf.variable_scope(name, default_name=default)``: a fresh scope per
    call where ``name`` is None (``dense``, ``dense_1``, ...)."""
    return tf1.variable_scope(name, default_name=default)  # type: ignore[no-any-return]
