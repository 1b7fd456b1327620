"""A ``tf`` for lowering code that makes the common ops directly in the graph.

Lowering creates thousands of small TF ops (one per op per device).  Through
``tf.math.multiply`` and friends each costs ~0.2 ms of Python: dispatch,
argument conversion, attribute inference, name and graph scopes.  While a
graph is being built, :data:`FAST_TF` makes the same op with
``Graph._create_op_internal`` and precomputed attributes, ~2.5x faster.  It
takes the fast road only when the arguments are plainly what the op takes
(graph tensors of one float or integer dtype, Python int lists for shapes and
axes); anything else, and eager execution, goes to TensorFlow's own function,
so the result is always the op TensorFlow would make.  The fast road is a
private TensorFlow API (:mod:`tf_private`): on the public road (an unchecked
TensorFlow version, or ``MTF_TF_PUBLIC_ONLY=1``) every call is TensorFlow's.

Lowering code reaches TensorFlow as ``lowering.tf``, which is :data:`FAST_TF`;
every name it does not speed up is TensorFlow's own (``FAST_TF.concat is
tf.concat``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import tensorflow as tf

from mtf_core.lowering import tf_private

_AttrValue = tf.compat.v1.AttrValue

_FLOATS = frozenset({tf.float16, tf.bfloat16, tf.float32, tf.float64})
_NUMBERS = _FLOATS | {tf.int32, tf.int64}
_INT32 = _AttrValue(type=tf.int32.as_datatype_enum)
_TRUE = _AttrValue(b=True)
_FALSE = _AttrValue(b=False)
_type_attrs: dict[Any, Any] = {}
_n_attrs: dict[int, Any] = {}
_str_attrs: dict[str, Any] = {}
_int_list_values: dict[tuple[int, ...], Any] = {}


def _type(dtype: Any) -> Any:
    a = _type_attrs.get(dtype)
    if a is None:
        a = _type_attrs[dtype] = _AttrValue(type=dtype.as_datatype_enum)
    return a


def _n(n: int) -> Any:
    a = _n_attrs.get(n)
    if a is None:
        a = _n_attrs[n] = _AttrValue(i=n)
    return a


def _s(s: str) -> Any:
    a = _str_attrs.get(s)
    if a is None:
        a = _str_attrs[s] = _AttrValue(s=s.encode())
    return a


def _graph(xs: Sequence[Any], dtypes: frozenset[Any]) -> Any:
    """The graph being built when every ``x`` is a symbolic tensor of one dtype
    in ``dtypes`` and the private road is open; else None (take TensorFlow's
    road)."""
    if tf.executing_eagerly() or not tf_private.private_road():
        return None
    dtype = None
    for x in xs:
        if not isinstance(x, tf.Tensor) or not hasattr(x, "graph"):
            return None
        if dtype is None:
            dtype = x.dtype
            if dtype not in dtypes:
                return None
        elif x.dtype != dtype:
            return None
    return tf.compat.v1.get_default_graph()


def _out(graph: Any, op_type: str, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    return tf_private.create_op(graph, op_type, inputs, attrs).outputs[0]


#: ``(graph, {values: Const tensor})`` of the device whose ops are being made
#: (set by :meth:`mtf_core.lowering.placing.DeferredPlacement.on`): shapes and
#: axes repeat, so each device gets one Const per distinct list.
CONST_SCOPE: ContextVar[tuple[Any, dict[tuple[int, ...], Any]] | None] = ContextVar(
    "mtf_const_scope", default=None
)


def _int_list(graph: Any, values: Sequence[int]) -> Any:
    """An int32 Const of ``values`` (Python ints) in ``graph``."""
    key = tuple(values)
    scope = CONST_SCOPE.get()
    if scope is not None and scope[0] is graph:
        hit = scope[1].get(key)
        if hit is not None:
            return hit
    value = _int_list_values.get(key)
    if value is None:
        value = _int_list_values[key] = _AttrValue(
            tensor=tf.make_tensor_proto(list(key), tf.int32)
        )
    const = _out(graph, "Const", [], {"value": value, "dtype": _INT32})
    if scope is not None and scope[0] is graph:
        scope[1][key] = const
    return const


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list | tuple) and all(
        type(i) is int
        for i in v  # not bool, not numpy
    )


def _binary(op_type: str, slow: Callable[..., Any], dtypes: frozenset[Any]) -> Any:
    def fn(x: Any, y: Any, name: str | None = None) -> Any:
        g = _graph((x, y), dtypes) if name is None else None
        if g is None:
            return slow(x, y, name=name)
        return _out(g, op_type, [x, y], {"T": _type(x.dtype)})

    fn.__name__ = slow.__name__
    return fn


def _unary(op_type: str, slow: Callable[..., Any]) -> Any:
    def fn(x: Any, name: str | None = None) -> Any:
        g = _graph((x,), _FLOATS) if name is None else None
        if g is None:
            return slow(x, name=name)
        return _out(g, op_type, [x], {"T": _type(x.dtype)})

    fn.__name__ = slow.__name__
    return fn


def _reduction(op_type: str, slow: Callable[..., Any]) -> Any:
    def fn(x: Any, axis: Any = None, keepdims: bool = False, **kw: Any) -> Any:
        g = _graph((x,), _NUMBERS) if not kw and _is_int_list(axis) else None
        if g is None:
            return slow(x, axis=axis, keepdims=keepdims, **kw)
        attrs = {
            "T": _type(x.dtype),
            "Tidx": _INT32,
            "keep_dims": _TRUE if keepdims else _FALSE,
        }
        return _out(g, op_type, [x, _int_list(g, axis)], attrs)

    fn.__name__ = slow.__name__
    return fn


def einsum(equation: str, *inputs: Any, **kw: Any) -> Any:
    # The Einsum kernel takes one or two inputs; tf.einsum splits longer
    # products into pairs, and handles ellipses and implicit outputs.
    g = (
        _graph(inputs, _FLOATS)
        if not kw and len(inputs) in (1, 2) and "." not in equation and "->" in equation
        else None
    )
    if g is None:
        return tf.einsum(equation, *inputs, **kw)
    attrs = {
        "T": _type(inputs[0].dtype),
        "N": _n(len(inputs)),
        "equation": _s(equation),
    }
    return _out(g, "Einsum", list(inputs), attrs)


def add_n(inputs: Sequence[Any], name: str | None = None) -> Any:
    inputs = list(inputs)
    g = _graph(inputs, _NUMBERS) if inputs and name is None else None
    if g is None:
        return tf.add_n(inputs, name=name)
    return _out(g, "AddN", inputs, {"N": _n(len(inputs)), "T": _type(inputs[0].dtype)})


def reshape(x: Any, shape: Any, name: str | None = None) -> Any:
    g = _graph((x,), _NUMBERS) if name is None and _is_int_list(shape) else None
    if g is None:
        return tf.reshape(x, shape, name=name)
    attrs = {"T": _type(x.dtype), "Tshape": _INT32}
    return _out(g, "Reshape", [x, _int_list(g, shape)], attrs)


def transpose(x: Any, perm: Any = None, **kw: Any) -> Any:
    g = _graph((x,), _NUMBERS) if not kw and _is_int_list(perm) else None
    if g is None:
        return tf.transpose(x, perm, **kw)
    attrs = {"T": _type(x.dtype), "Tperm": _INT32}
    return _out(g, "Transpose", [x, _int_list(g, perm)], attrs)


def identity(x: Any, name: str | None = None) -> Any:
    g = _graph((x,), _NUMBERS) if name is None else None
    if g is None:
        return tf.identity(x, name=name)
    return _out(g, "Identity", [x], {"T": _type(x.dtype)})


def read_variable(variable: Any) -> Any:
    """The bare ``ReadVariableOp`` of a resource variable (``read_value()``
    adds an identity per read)."""
    if tf.executing_eagerly():
        return variable.value()
    if not tf_private.private_road():
        return tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype)
    g = tf.compat.v1.get_default_graph()
    return _out(
        g, "ReadVariableOp", [variable.handle], {"dtype": _type(variable.dtype)}
    )


_ASSIGN_OPS = {
    "assign": "AssignVariableOp",
    "add": "AssignAddVariableOp",
    "sub": "AssignSubVariableOp",
}


def assign_variable(variable: Any, value: Any, mode: str = "assign") -> Any:
    """Assigns (or adds, or subtracts) ``value`` to ``variable``; returns the
    op in a graph, the variable's new value eagerly."""
    if mode not in _ASSIGN_OPS:
        raise ValueError(f"assign mode {mode!r}: expected one of {sorted(_ASSIGN_OPS)}")
    if tf.executing_eagerly() or _graph((value,), _NUMBERS) is None:
        fn = {"assign": variable.assign, "add": variable.assign_add}
        fn = fn.get(mode, variable.assign_sub)
        if tf.executing_eagerly():
            return fn(value)
        return fn(value, read_value=False)  # the op, as the fast road returns
    g = tf.compat.v1.get_default_graph()
    attrs = {"dtype": _type(variable.dtype)}
    if mode == "assign":
        attrs["validate_shape"] = _FALSE
    return tf_private.create_op(g, _ASSIGN_OPS[mode], [variable.handle, value], attrs)


class _Namespace:
    """``tf.<module>`` with some functions replaced; the rest are TF's own."""

    def __init__(self, base: Any, **fast: Any) -> None:
        self._base = base
        self.__dict__.update(fast)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


_MATH = _Namespace(
    tf.math,
    add=_binary("AddV2", tf.math.add, _NUMBERS),
    subtract=_binary("Sub", tf.math.subtract, _NUMBERS),
    multiply=_binary("Mul", tf.math.multiply, _NUMBERS),
    divide=_binary("RealDiv", tf.math.divide, _FLOATS),
    maximum=_binary("Maximum", tf.math.maximum, _NUMBERS),
    minimum=_binary("Minimum", tf.math.minimum, _NUMBERS),
    pow=_binary("Pow", tf.math.pow, _FLOATS),
    less=_binary("Less", tf.math.less, _NUMBERS),
    less_equal=_binary("LessEqual", tf.math.less_equal, _NUMBERS),
    greater=_binary("Greater", tf.math.greater, _NUMBERS),
    greater_equal=_binary("GreaterEqual", tf.math.greater_equal, _NUMBERS),
    exp=_unary("Exp", tf.math.exp),
    log=_unary("Log", tf.math.log),
    negative=_unary("Neg", tf.math.negative),
    square=_unary("Square", tf.math.square),
    sqrt=_unary("Sqrt", tf.math.sqrt),
    rsqrt=_unary("Rsqrt", tf.math.rsqrt),
    tanh=_unary("Tanh", tf.math.tanh),
    sigmoid=_unary("Sigmoid", tf.math.sigmoid),
    reduce_sum=_reduction("Sum", tf.math.reduce_sum),
    reduce_max=_reduction("Max", tf.math.reduce_max),
    reduce_min=_reduction("Min", tf.math.reduce_min),
    add_n=add_n,
)

#: The ``tf`` that lowering code uses (``lowering.tf``).
FAST_TF = _Namespace(
    tf,
    math=_MATH,
    nn=_Namespace(tf.nn, relu=_unary("Relu", tf.nn.relu)),
    einsum=einsum,
    add_n=add_n,
    reshape=reshape,
    transpose=transpose,
    identity=identity,
    reduce_sum=_MATH.reduce_sum,
    reduce_max=_MATH.reduce_max,
    reduce_min=_MATH.reduce_min,
    multiply=_MATH.multiply,
    add=_MATH.add,
    subtract=_MATH.subtract,
    exp=_MATH.exp,
)
