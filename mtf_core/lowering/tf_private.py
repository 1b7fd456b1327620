"""Every private TensorFlow API the lowering uses, in one place, behind a
version guard, with a public road beside each.

The lowering makes thousands of small TF ops, and a few private calls make
that several times cheaper (docs/architecture.md, "The lowering"):

* ``Graph._create_op_internal``: make an op with precomputed attributes
  (:mod:`fast_tf`; public road: TensorFlow's own ``tf.*`` functions);
* ``Operation._set_device``: place the ops of a device in one pass
  (:mod:`placing`; public road: ``with tf.device(...)`` per op);
* ``Graph._control_dependencies_stack`` and ``_get_control_flow_context``:
  whether a shape constant may be shared (public road: never shared);
* ``Operation._add_control_inputs``: order each assignment after the step's
  read of its variable (:mod:`compiled`; public road: the step is traced with
  ``tf.function``, whose automatic control dependencies order them);
* ``tensorflow.python.eager.context``: run a step without TensorFlow's graph
  optimizer (public road: the optimizer stays on).

Private APIs change without notice, so they are used only on TensorFlow
versions they were checked on (:data:`KNOWN_GOOD_TF`; tests/test_tf_private.py
fails loudly on any other, saying what to check).  On another version, or
when the environment variable :data:`PUBLIC_ENV` is ``1``, the public road is
taken: the same values and collectives, lowered more slowly.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import tensorflow as tf

#: TensorFlow ``major.minor`` versions the private road was checked on: the
#: whole test suite passes on both roads (tests/test_tf_private.py compares
#: them).  Add a version only after running it there.
KNOWN_GOOD_TF = ("2.21",)

#: ``MTF_TF_PUBLIC_ONLY=1`` takes the public road on any TensorFlow version.
PUBLIC_ENV = "MTF_TF_PUBLIC_ONLY"

_warned: set[str] = set()


@functools.cache
def tf_version() -> str:
    """The running TensorFlow's ``major.minor``."""
    return ".".join(tf.__version__.split(".")[:2])


def version_checked() -> bool:
    """Whether the running TensorFlow is one the private road was checked on."""
    return tf_version() in KNOWN_GOOD_TF


def private_road() -> bool:
    """Whether to use TensorFlow's private APIs now: not when
    ``MTF_TF_PUBLIC_ONLY=1``, and not on an unchecked TensorFlow version
    (which warns once)."""
    if os.environ.get(PUBLIC_ENV, "") == "1":
        return False
    if version_checked():
        return True
    version = tf_version()
    if version not in _warned:
        _warned.add(version)
        warnings.warn(
            f"TensorFlow {tf.__version__} is not among the versions mtf_core's "
            f"private TF calls were checked on ({', '.join(KNOWN_GOOD_TF)}); "
            "lowering takes the public road (slower, same results)",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


def create_op(graph: Any, op_type: str, inputs: Sequence[Any], attrs: Any) -> Any:
    """``graph``'s new op ``op_type`` with ``attrs`` (AttrValue protos) exactly
    as given: no dispatch, no inference, no name scope work."""
    return graph._create_op_internal(op_type, list(inputs), attrs=attrs)


def set_device(op: Any, device: str) -> None:
    """Sets ``op``'s device after it was made."""
    op._set_device(device)


def may_share_constants(graph: Any) -> bool:
    """Whether an op made now in ``graph`` gets no control inputs or
    control-flow context from an enclosing scope (so it may be shared)."""
    return (
        not graph._control_dependencies_stack
        and graph._get_control_flow_context() is None
    )


def add_control_inputs(op: Any, before: Sequence[Any]) -> None:
    """Makes ``op`` (already in the graph) wait for the ops ``before``."""
    op._add_control_inputs(list(before))


@contextmanager
def graph_optimizer_off() -> Iterator[None]:
    """Function calls made inside run without TensorFlow's graph optimizer
    (grappler): TF's function call options, which only its private eager
    context sets per call."""
    from tensorflow.python.eager import context as tf_context

    ctx = tf_context.context()
    saved = ctx.function_call_options
    config = tf.compat.v1.ConfigProto()
    if saved.config_proto_serialized:
        config.ParseFromString(saved.config_proto_serialized)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    ctx.function_call_options = tf_context.FunctionCallOptions(
        executor_type=saved.executor_type, config_proto=config
    )
    try:
        yield
    finally:
        ctx.function_call_options = saved
