"""Per-device state of the SPMD backend, found by name from the traced program.

A variable slice lives in its device's resource manager under a name that is
the same on every device.  The one traced replica program opens it with
``VarHandleOp(shared_name=...)``, which resolves to the slice of whichever
device runs the program, so variables need not be passed in: the launcher
hands each device its pnum and its collective ordering token, and its size
stays O(devices), not O(devices x variables).  (``tf.Variable`` cannot do this:
in eager mode its resources are anonymous.)

The token is also what lets the per-device calls run at the same time:
automatic control dependencies run stateful calls that share no resource in
program order, so calls without a resource of their own would run one after
another, and the first would wait in its first collective for ever.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from mtf_core.errors import LoweringError

TOKEN_NAME = "mtf_spmd/collective_order"

_lock = threading.Lock()
_names = itertools.count()
_tokens: dict[str, Any] = {}


class SliceVariable:
    """One device's slice of an mtf variable, in a named resource.

    Reads and assignments outside a replica program work like ``tf.Variable``'s;
    inside one, :meth:`open` returns the running device's slice.
    """

    def __init__(self, value: Any, shared_name: str, device: str) -> None:
        value = tf.convert_to_tensor(value)
        self.shared_name = shared_name
        self.device = device
        self.dtype = value.dtype
        self.shape = value.shape
        with tf.init_scope(), tf.device(device):
            self.handle = _var_handle(shared_name, self.dtype, self.shape)
            tf.raw_ops.AssignVariableOp(resource=self.handle, value=value)

    @property
    def name(self) -> str:
        return self.shared_name

    def open(self) -> Any:
        """The slice of the device running the program being traced."""
        return _var_handle(self.shared_name, self.dtype, self.shape)

    def read_value(self) -> Any:
        with tf.device(self.device):
            value = tf.raw_ops.ReadVariableOp(resource=self.handle, dtype=self.dtype)
        value.set_shape(self.shape)
        return value

    def numpy(self) -> Any:
        return self.read_value().numpy()

    def _update(self, op: Any, value: Any) -> Any:
        with tf.device(self.device):
            return op(resource=self.handle, value=tf.cast(value, self.dtype))

    def assign(self, value: Any) -> Any:
        return self._update(tf.raw_ops.AssignVariableOp, value)

    def assign_add(self, value: Any) -> Any:
        return self._update(tf.raw_ops.AssignAddVariableOp, value)

    def assign_sub(self, value: Any) -> Any:
        return self._update(tf.raw_ops.AssignSubVariableOp, value)

    def __del__(self) -> None:
        # The resource is named, so nothing frees it but an explicit destroy.
        try:
            if tf.executing_eagerly():
                with tf.device(self.device):
                    tf.raw_ops.DestroyResourceOp(
                        resource=self.handle, ignore_lookup_error=True
                    )
        except Exception:  # interpreter shutdown: nothing left to free
            pass

    def __repr__(self) -> str:
        return f"SliceVariable({self.shared_name!r} on {self.device}, {self.shape})"


def _var_handle(shared_name: str, dtype: Any, shape: Any) -> Any:
    return tf.raw_ops.VarHandleOp(
        dtype=dtype, shape=shape, shared_name=shared_name, container=""
    )


def slice_variables(
    slices: Sequence[Any], devices: Sequence[str], name: str
) -> list[SliceVariable | None]:
    """One :class:`SliceVariable` per device that has a slice (None elsewhere),
    all under one fresh name."""
    with _lock:
        shared = f"mtf_spmd/{next(_names)}/{name}"
    return [
        None if s is None else SliceVariable(s, shared, d)
        for s, d in zip(slices, devices)
    ]


def first(variables: Sequence[Any]) -> SliceVariable:
    """The first slice this process holds (every slice has the same name)."""
    for v in variables:
        if isinstance(v, SliceVariable):
            return v
    raise LoweringError(
        f"{list(variables)!r} are not SPMD variable slices; make the VariableStore "
        "with the SimdMeshImpl that lowers the graph"
    )


def ordering_token(device: str) -> Any:
    """The resource handle of ``device``'s collective ordering token (made
    once per process, outside any trace)."""
    with _lock:
        if device not in _tokens:
            with tf.init_scope(), tf.device(device):
                handle = _var_handle(TOKEN_NAME, tf.float32, [])
                tf.raw_ops.AssignVariableOp(resource=handle, value=tf.constant(0.0))
            _tokens[device] = handle
        return _tokens[device]
