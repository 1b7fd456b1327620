"""Makes Mesh TensorFlow 0.1.21 (from PyPI) import on TensorFlow 2.21 in v1
graph mode.  It needs two names that moved: ``tf.compat.v1.estimator`` (gone
since TF 2.16; it only uses the session hooks that ``tf.compat.v1.train`` still
has) and ``ops.register_tensor_conversion_function`` (now in
``tensor_conversion_registry``).  Used only by the baseline benchmark venv."""

from __future__ import annotations

import types

import tensorflow.compat.v1 as tf1
from tensorflow.python.framework import ops, tensor_conversion_registry

if not hasattr(ops, "register_tensor_conversion_function"):
    ops.register_tensor_conversion_function = (
        tensor_conversion_registry.register_tensor_conversion_function
    )
if not hasattr(tf1, "estimator"):
    _est = types.ModuleType("estimator")
    for _name in dir(tf1.train):
        if "Hook" in _name or "Listener" in _name or _name.startswith("SessionRun"):
            setattr(_est, _name, getattr(tf1.train, _name))
    tf1.estimator = _est
tf1.disable_v2_behavior()
