"""``mesh_tensorflow.layers``: mtf_core's layers, the dense family named as
Mesh TF names it.

Mesh TF's ``dense``, ``get_dense_kernel_weights``, ``dense_product`` and
``dense_relu_dense`` open ``tf.variable_scope(name, default_name=...)`` and
name each weight by its part under it: ``proj/kernel``, and for an unnamed
layer a fresh scope per call (``dense/kernel`` and ``dense_1/bias``, then
``dense_2/kernel``...), so two unnamed layers never share weights.  Called
through this module, mtf_core's own functions do the same
(:mod:`mtf_core.layers.scopes`), in TensorFlow's variable scopes (the
first such call loads TensorFlow, as Mesh TF programs have it).  Every
other name is mtf_core's layer as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import mtf_core.layers as _layers
from mtf_core.layers.scopes import scopes_opened_by

__all__ = list(_layers.__all__)

_F = TypeVar("_F", bound=Callable[..., Any])


def _tf_variable_scope(
    name: str | None, default: str
) -> AbstractContextManager[object]:
    # TensorFlow loads on the first layer call, as the default initializers
    # (TensorFlow's) load it, so no weight of a Mesh TF program is named
    # otherwise.
    from mtf_core.lowering.tf_scopes import variable_scope

    return variable_scope(name, default)


def _in_tf_scopes(fn: _F) -> _F:
    """``fn`` with its layers' weights named under TF variable scopes, as
    Mesh TF's are."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with scopes_opened_by(_tf_variable_scope):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


dense = _in_tf_scopes(_layers.dense)
get_dense_kernel_weights = _in_tf_scopes(_layers.get_dense_kernel_weights)
dense_product = _in_tf_scopes(_layers.dense_product)
dense_relu_dense = _in_tf_scopes(_layers.dense_relu_dense)


def __getattr__(name: str) -> Any:
    return getattr(_layers, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_layers)))
