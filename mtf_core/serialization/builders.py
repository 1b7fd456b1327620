"""Builders for the core op families: creation, variables, einsum, elementwise,
reductions and autodiff's custom gradients.

Each builder calls the op class's constructor; see :mod:`.registry` for the
contract.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mtf_core import dtypes
from mtf_core.autodiff import CustomGradientOp
from mtf_core.errors import GraphError, MtfError, SerializationError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops.creation import CausalBias, Constant, ImportTensor
from mtf_core.ops.einsum import Einsum
from mtf_core.ops.reduce import REDUCTIONS, Broadcast, Reduce
from mtf_core.ops.variables import ASSIGN_MODES, Assign, Variable
from mtf_core.serialization import schema
from mtf_core.serialization.registry import OpSpec, register

# -- creation ------------------------------------------------------------------


@register(ImportTensor)
def _import_tensor(spec: OpSpec) -> Operation:
    # Values are not serialized: every import comes back as a placeholder.
    spec.expect_inputs(0)
    if "placeholder" in spec.attrs:
        spec.attrs.get_bool("placeholder")
    return ImportTensor(
        spec.mesh, None, spec.output_shape(), spec.output_dtype(), name=spec.name
    )


def _decode_value(value: Any, path: str) -> Any:
    """Undoes :func:`schema.json_safe` for a constant's (nested) value."""
    if isinstance(value, list):
        return [_decode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        if value not in schema.NON_FINITE:
            raise SerializationError(
                f"{path}: string {value!r} is not a number; only "
                f"{sorted(schema.NON_FINITE)} stand for non-finite floats"
            )
        return schema.NON_FINITE[value]
    if value is None or isinstance(value, dict):
        raise SerializationError(
            f"{path}: expected a number, boolean or array, got "
            f"{schema.type_name(value)}"
        )
    return value


@register(Constant)
def _constant(spec: OpSpec) -> Operation:
    spec.expect_inputs(0)
    path = f"{spec.attrs.path}.value"
    if "value" not in spec.attrs:
        raise SerializationError(f"{spec.attrs.path}: missing required attr 'value'")
    value = _decode_value(spec.attrs.raw("value"), path)
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nesting
        raise SerializationError(f"{path}: not a rectangular array ({e})") from None
    if arr.dtype == object:
        raise SerializationError(f"{path}: not a rectangular array of numbers")
    schema.check_limit(
        spec.limits, "max_constant_elements", int(arr.size), path, "element count"
    )
    dtype = spec.output_dtype()
    if not dtypes.is_floating(dtype) and arr.size and not np.all(np.isfinite(arr)):
        raise SerializationError(
            f"{path}: non-finite values cannot be held by a {dtype} constant"
        )
    return Constant(spec.mesh, arr, spec.output_shape(), dtype, name=spec.name)


@register(CausalBias)
def _causal_bias(spec: OpSpec) -> Operation:
    # Its values follow from its shape; the dtype is checked against the
    # declared one like every op's.
    spec.expect_inputs(0)
    shape = spec.output_shape()
    if len(shape) != 2:
        raise SerializationError(
            f"{spec.path}.outputs[0].shape: a CausalBias has the shape [length, "
            f"memory_length], got [{shape}]"
        )
    return CausalBias(spec.mesh, shape[0], shape[1], name=spec.name)


# -- variables -----------------------------------------------------------------


@register(Variable)
def _variable(spec: OpSpec) -> Operation:
    # The initializer is not serialized: the lowering's default one is used.
    spec.expect_inputs(0)
    trainable = spec.attrs.get_bool("trainable", True)
    return Variable(
        spec.mesh,
        spec.name,
        spec.output_shape(),
        _variable_dtype(spec),
        initializer=None,
        trainable=trainable,
    )


def _variable_dtype(spec: OpSpec) -> dtypes.VariableDType:
    """The optional ``variable_dtype`` attr ``[master, slice, activation]``;
    the slice dtype must be the declared output's."""
    stored = spec.output_dtype()
    raw = spec.attrs.raw("variable_dtype")
    if raw is None:
        return dtypes.VariableDType(stored)
    path = f"{spec.attrs.path}.variable_dtype"
    if not (isinstance(raw, list) and len(raw) == 3):
        raise SerializationError(
            f"{path}: expected [master, slice, activation] dtype names, got {raw!r}"
        )
    try:
        vd = dtypes.VariableDType(*raw)
    except MtfError as e:
        raise SerializationError(f"{path}: {e}") from None
    if vd.slice_dtype != stored:
        raise SerializationError(
            f"{path}: slice dtype {vd.slice_dtype} disagrees with the output's "
            f"dtype {stored}"
        )
    return vd


@register(Assign)
def _assign(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    var_t, value = spec.inputs
    var = var_t.operation
    if not isinstance(var, Variable):
        raise SerializationError(
            f"{spec.path}.inputs[0]: {var_t.name} is not a variable's value tensor "
            f"(it comes from a {var.op_type}); Assign's first input must be one"
        )
    named = spec.attrs.raw("variable")
    if named is not None and named != var.name:
        raise SerializationError(
            f"{spec.attrs.path}.variable: {named!r} disagrees with inputs[0], which "
            f"is variable {var.name!r}"
        )
    if value.dtype != var.dtype:
        raise SerializationError(
            f"{spec.path}.inputs[1]: {value.name} is {value.dtype} but variable "
            f"{var.name!r} is {var.dtype}; add a Cast op"
        )
    mode = spec.attrs.get_choice("mode", ASSIGN_MODES, "assign")
    return Assign(var, value, mode, name=spec.name)


# -- einsum, elementwise -------------------------------------------------------


@register(Einsum)
def _einsum(spec: OpSpec) -> Operation:
    spec.expect_min_inputs(1)
    return Einsum(spec.inputs, spec.output_shape(), name=spec.name)


@register(ew.UnaryOp)
def _unary(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    fn = spec.attrs.get_choice("fn", ew.UNARY)
    return ew.UnaryOp(fn, spec.inputs[0], name=spec.name)


@register(ew.BinaryOp)
def _binary(spec: OpSpec) -> Operation:
    spec.expect_inputs(2)
    fn = spec.attrs.get_choice("fn", ew.BINARY)
    x, y = spec.inputs
    shape = spec.ordered_like_output(ew.broadcast_shape([x.shape, y.shape]))
    return ew.BinaryOp(fn, x, y, output_shape=shape, name=spec.name)


@register(ew.WhereOp)
def _where(spec: OpSpec) -> Operation:
    spec.expect_inputs(3)
    c, x, y = spec.inputs
    shape = spec.ordered_like_output(ew.broadcast_shape([c.shape, x.shape, y.shape]))
    return ew.WhereOp(c, x, y, output_shape=shape, name=spec.name)


@register(ew.AddN)
def _add_n(spec: OpSpec) -> Operation:
    spec.expect_min_inputs(1)
    return ew.AddN(spec.inputs, name=spec.name)


@register(ew.CastOp)
def _cast(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    dtype = schema.parse_dtype(spec.attrs.raw("dtype"), f"{spec.attrs.path}.dtype")
    return ew.CastOp(spec.inputs[0], dtype, name=spec.name)


@register(ew.Identity)
def _identity(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    stop = spec.attrs.get_bool("stop", False)
    return ew.Identity(spec.inputs[0], stop=stop, name=spec.name)


# -- reductions ----------------------------------------------------------------


@register(Reduce)
def _reduce(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    reduction = spec.attrs.get_choice("reduction", REDUCTIONS, "SUM")
    return Reduce(spec.inputs[0], spec.output_shape(), reduction, name=spec.name)


@register(Broadcast)
def _broadcast(spec: OpSpec) -> Operation:
    spec.expect_inputs(1)
    return Broadcast(spec.inputs[0], spec.output_shape(), name=spec.name)


# -- autodiff ------------------------------------------------------------------


def _gradient_not_serialized(
    ins: Any, outs: Any, gys: Any, needed: Any
) -> list[Tensor | None]:
    raise GraphError(
        "this custom_gradient op was read from a serialized graph; its gradient "
        "function is Python code and is not serialized, so gradients cannot be "
        "taken through it (serialize the graph after calling mtf.gradients)"
    )


@register(CustomGradientOp)
def _custom_gradient(spec: OpSpec) -> Operation:
    # inputs = the function's inputs, then its outputs (one per op output);
    # the op forwards the latter.  Its gradient function is not kept.
    n_out = len(spec.outputs)
    n_in = len(spec.inputs) - n_out
    if n_in < 0:
        raise SerializationError(
            f"{spec.path}.inputs: CustomGradient with {n_out} output(s) needs at "
            f"least {n_out} inputs (the forwarded outputs come last), got "
            f"{len(spec.inputs)}"
        )
    return CustomGradientOp(
        list(spec.inputs[n_in:]),
        list(spec.inputs[:n_in]),
        _gradient_not_serialized,
        name=spec.name,
    )
