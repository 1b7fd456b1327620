"""Per-device slice variables, and moving full values in and out of them.

Variables are initialized from their full value, made once and sliced, so the
initial model is the same whatever the layout.  ``export``/``import_`` move
full (unsplit) values, which is what checkpoints store: a checkpoint written
under one mesh and layout loads under any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import LoweringError, ShapeError
from mtf_core.graph import Graph, Mesh, Tensor
from mtf_core.lowering.initial_values import default_initializer
from mtf_core.lowering.masters import MasterVariables
from mtf_core.ops.creation import check_full_value


def _variable_op(var: Any) -> Any:
    from mtf_core.ops.variables import Variable

    if isinstance(var, Tensor):
        var = var.operation
    if not isinstance(var, Variable):
        raise LoweringError(f"{var!r} is not an mtf variable")
    return var


class VariableStore:
    """Holds, for each mtf Variable, one ``tf.Variable`` slice per device."""

    def __init__(self, graph: Graph, mesh_to_impl: Mapping[Mesh, Any]) -> None:
        self.graph = graph
        self.mesh_to_impl = dict(mesh_to_impl)
        self._slices: dict[Any, list[tf.Variable]] = {}
        initial = {}
        for var in graph.all_variables:
            if var.mesh not in self.mesh_to_impl:
                continue
            impl = self.mesh_to_impl[var.mesh]
            init = var.initializer or default_initializer(var.name)
            full = init(var.shape.to_integer_list(), tf.as_dtype(var.dtype))
            full = check_full_value(
                tf.convert_to_tensor(full),
                var,
                f"the initializer's value for variable {var.name}",
            )
            full = tf.cast(full, var.dtype)
            laid = impl.import_tf_tensor(full, var.shape)
            self._slices[var] = impl.make_variables(laid, var.name, var.trainable)
            initial[var] = full
        # Mesh TF's master variables: made now in TF1 graph mode, where a
        # Saver built after the lowering must see them; on first use eagerly.
        self.masters = MasterVariables(
            self, initial if not tf.executing_eagerly() else None
        )

    def __contains__(self, var: Any) -> bool:
        return _variable_op(var) in self._slices

    def slices(self, var: Any) -> list[tf.Variable]:
        var = _variable_op(var)
        try:
            return self._slices[var]
        except KeyError:
            raise LoweringError(
                f"variable {var.name} has no slices in this store"
            ) from None

    @property
    def variables(self) -> list[Any]:
        return list(self._slices)

    def export_tensor(self, var: Any) -> Any:
        """The full value of ``var`` as one ``tf.Tensor`` (its slices' dtype)."""
        var = _variable_op(var)
        impl = self.mesh_to_impl[var.mesh]
        return impl.export_to_tf_tensor(
            impl.read_variables(self.slices(var)), var.shape
        )

    def export(self, var: Any) -> np.ndarray:
        """The full value of ``var`` as a NumPy array."""
        var = _variable_op(var)
        impl = self.mesh_to_impl[var.mesh]
        laid = impl.read_variables(self.slices(var))
        full = impl.export_to_tf_tensor(laid, var.shape)
        # Checkpoints hold the master dtype (Mesh TensorFlow's VariableDType).
        value: np.ndarray = tf.cast(full, var.master_dtype).numpy()
        return value

    def import_(self, var: Any, value: Any) -> None:
        """Sets ``var`` from its full value (any layout's export)."""
        var = _variable_op(var)
        value = np.asarray(value)
        if list(value.shape) != var.shape.to_integer_list():
            raise ShapeError(
                f"variable {var.name} has shape [{var.shape}] but the value has shape "
                f"{list(value.shape)}"
            )
        impl = self.mesh_to_impl[var.mesh]
        laid = impl.import_tf_tensor(tf.cast(tf.constant(value), var.dtype), var.shape)
        impl.assign_variables(self.slices(var), laid)

    def to_dict(self) -> dict[str, np.ndarray]:
        return {v.name: self.export(v) for v in self._slices}

    def load_dict(self, values: Mapping[str, Any], strict: bool = True) -> None:
        by_name = {v.name: v for v in self._slices}
        missing = sorted(set(by_name) - set(values))
        if strict and missing:
            raise LoweringError(f"checkpoint lacks variables {missing}")
        for name, value in values.items():
            if name in by_name:
                self.import_(by_name[name], value)
            elif strict:
                raise LoweringError(
                    f"checkpoint has variable {name!r}, which the graph lacks"
                )
