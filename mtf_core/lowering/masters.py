"""Mesh TF's master variables, for TF1 graph-mode training loops.

Mesh TensorFlow keeps one full ``tf.Variable`` per mtf variable (the
"master", in the master dtype, named like the mtf variable, on the mesh's
variable placer's device or the CPU) besides the per-device slices the steps
update.  ``tf.compat.v1.train.Saver`` saves the masters;
``Lowering.copy_masters_to_slices`` (after a restore) and
``copy_slices_to_masters`` (before a save) move values between the two.
mtf_core's own loop (``compile_function``, ``VariableStore.export``) needs no
masters; they exist for programs written for Mesh TF.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from mtf_core.lowering.initial_values import default_initializer, outside_all_rewrites
from mtf_core.ops.creation import check_full_value


def _device(var: Any) -> Any:
    placer = getattr(var.mesh, "variable_placer", None)
    # A device function places graph ops only; eagerly the master is on the CPU.
    if placer is None or tf.executing_eagerly():
        return "cpu:0"
    return placer.device_function


def make_master(var: Any, device: Any, value: Any = None) -> tf.Variable:
    """``var``'s master in the default graph (remembered on ``var``), from
    ``value`` or, if None, from the variable's initializer."""
    if value is None:
        init = var.initializer
        if init is None:
            init = default_initializer(var.name)
        value = check_full_value(
            tf.convert_to_tensor(
                init(var.shape.to_integer_list(), tf.as_dtype(var.master_dtype))
            ),
            var,
            f"the initializer's value for variable {var.name}",
        )
    with outside_all_rewrites(), tf.compat.v1.device(device), _top_name_scope():
        master = tf.Variable(
            tf.cast(value, var.master_dtype), name=var.name, trainable=var.trainable
        )
    var.tf_master = master
    return master


def _top_name_scope() -> Any:
    """The top-level TF name scope in graph mode: ``var.name`` holds its
    variable scope already (a placer makes the master inside that scope,
    which would prefix it again: ``encoder/encoder/w``)."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.compat.v1.get_default_graph().name_scope(None)


def _early_master(var: Any) -> Any:
    """A master made by the placer when ``var`` was created, if it belongs to
    the current TF graph."""
    master = getattr(var, "tf_master", None)
    if master is not None and master.graph is tf.compat.v1.get_default_graph():
        return master
    return None


class MasterVariables:
    """The master ``tf.Variable`` of each mtf variable of a VariableStore.

    In graph mode they are made with the store, from the same initial value
    as the slices (one ``global_variables_initializer`` run gives both the
    same values); in eager mode on first use, from the slices' values.
    """

    def __init__(self, store: Any, initial: Mapping[Any, Any] | None = None) -> None:
        self._store = store
        self._masters: dict[Any, tf.Variable] = {}
        for var, value in (initial or {}).items():
            self._make(var, value)

    def _make(self, var: Any, value: Any) -> tf.Variable:
        master = None if tf.executing_eagerly() else _early_master(var)
        if master is None:
            master = make_master(var, _device(var), value)
        self._masters[var] = master
        return master

    def get(self, var: Any) -> tf.Variable:
        """``var``'s master, made from its current value if it has none."""
        if var not in self._masters:
            self._make(var, self._store.export_tensor(var))
        return self._masters[var]

    def __iter__(self) -> Any:
        return iter(self._masters.values())

    def copy_to_slices(self) -> Any:
        """Assigns every variable's slices from its master; a ``tf.group``."""
        ops = []
        for var in self._store.variables:
            impl = self._store.mesh_to_impl[var.mesh]
            full = tf.cast(self.get(var).read_value(), var.dtype)
            laid = impl.import_tf_tensor(full, var.shape)
            ops += impl.assign_variables(self._store.slices(var), laid)
        return self._group(ops)

    def copy_from_slices(self) -> Any:
        """Assigns every master from its variable's slices; a ``tf.group``."""
        ops = []
        for var in self._store.variables:
            master = self.get(var)
            ops.append(
                master.assign(tf.cast(self._store.export_tensor(var), master.dtype))
            )
        return self._group(ops)

    def _group(self, ops: list[Any]) -> Any:
        for impl in self._store.mesh_to_impl.values():
            impl.finish_lowering()  # place what the copies made
        return tf.group(*ops) if not tf.executing_eagerly() else None
