"""Mesh TF names that mtf_core spells differently, for ``mesh_tensorflow``.

Mesh TF programs (and its tests) build some operations by class, with the
class's constructor arguments: ``mtf.EinsumOperation([x, y], shape)``,
``mtf.ConcatOperation(xs, "concat")``.  Each name here makes the same
mtf_core operation through mtf_core's function for it and returns the
operation, so the result is mtf_core's op with mtf_core's splittability,
gradient and lowering.  ``OVERRIDES`` are names whose Mesh TF meaning is
looser than mtf_core's own (``convert_to_shape(None)`` is ``None`` there); they
apply only under the ``mesh_tensorflow`` name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mtf_core as _m
from mtf_core.compat.coordinates import (
    pnum_to_processor_coordinates,
    processor_coordinates_to_pnum,
)
from mtf_core.compat.operation import (
    ImportLaidOutTensorOperation,
    import_laid_out_tensor,
)
from mtf_core.compat.operation import Operation as CompatOperation
from mtf_core.compat.pool import PoolBackPropOperation, PoolOperation, pool_backprop
from mtf_core.graph import Mesh, Operation, Tensor
from mtf_core.shapes import Shape, convert_to_shape


def _op(t: Tensor | Sequence[Tensor]) -> Operation:
    if isinstance(t, Tensor):
        return t.operation
    return t[0].operation


def EinsumOperation(  # noqa: N802
    inputs: Sequence[Tensor], output_shape: Any, name: str | None = None
) -> Operation:
    return _op(_m.einsum(list(inputs), output_shape=output_shape, name=name))


def ConcatOperation(  # noqa: N802
    xs: Sequence[Tensor], concat_dim_name: str, name: str | None = None
) -> Operation:
    return _op(_m.concat(list(xs), concat_dim_name, name=name))


def SplitOperation(  # noqa: N802
    x: Tensor, split_dim: Any, num_or_size_splits: Any, name: str | None = None
) -> Operation:
    return _op(_m.split(x, split_dim, num_or_size_splits, name=name))


def StackOperation(  # noqa: N802
    xs: Sequence[Tensor], dim_name: str, axis: int, name: str | None = None
) -> Operation:
    return _op(_m.stack(list(xs), dim_name, axis, name=name))


def UnstackOperation(x: Tensor, dim: Any, name: str | None = None) -> Operation:  # noqa: N802
    return _op(_m.unstack(x, dim, name=name))


def ShiftOperation(  # noqa: N802
    x: Tensor, offset: int, dim: Any, wrap: bool, name: str | None = None
) -> Operation:
    return _op(_m.shift(x, offset, dim, wrap, name=name))


def SliceOperation(  # noqa: N802
    x: Tensor, begin: int, size: int, slice_dim_name: str, name: str | None = None
) -> Operation:
    return _op(_m.slice(x, begin, size, slice_dim_name, name=name))


def PadOperation(  # noqa: N802
    x: Tensor, paddings: Sequence[int], dim_name: str, name: str | None = None
) -> Operation:
    return _op(_m.pad(x, paddings, dim_name, name=name))


def OneHotOperation(  # noqa: N802
    indices: Tensor,
    output_dim: Any,
    on_value: Any,
    off_value: Any,
    dtype: Any,
    name: str | None = None,
) -> Operation:
    return _op(
        _m.one_hot(
            indices, output_dim, on_value=on_value, off_value=off_value, dtype=dtype,
            name=name,
        )
    )  # fmt: skip


def BroadcastOperation(  # noqa: N802
    x: Tensor, output_shape: Any, name: str | None = None
) -> Operation:
    from mtf_core.ops.reduce import Broadcast

    return Broadcast(x, convert_to_shape(output_shape), name=name)


_REDUCTIONS: dict[str, Callable[..., Tensor]] = {
    "sum": _m.reduce_sum,
    "max": _m.reduce_max,
    "min": _m.reduce_min,
    "logical_or": _m.reduce_any,
    "logical_and": _m.reduce_all,
}


def ReduceOperation(  # noqa: N802
    x: Tensor, output_shape: Any, reduction_fn_string: str, name: str | None = None
) -> Operation:
    try:
        fn = _REDUCTIONS[reduction_fn_string.lower()]
    except KeyError:
        raise _m.ArgumentError(
            f"ReduceOperation: reduction {reduction_fn_string!r} is unknown; "
            f"expected one of {sorted(_REDUCTIONS)}"
        ) from None
    return _op(fn(x, output_shape=output_shape, name=name))


def ReshapeOperation(  # noqa: N802
    x: Tensor, new_shape: Any, name: str | None = None
) -> Operation:
    return _op(_m.reshape(x, new_shape, name=name))


def ScalarMultiplyOperation(  # noqa: N802
    x: Tensor, scalar: float, name: str | None = None
) -> Operation:
    return _op(x * scalar)


def ScalarAddOperation(  # noqa: N802
    x: Tensor, scalar: float, name: str | None = None
) -> Operation:
    return _op(x + scalar)


def StopGradient(x: Tensor) -> Operation:  # noqa: N802
    return _op(_m.stop_gradient(x))


def ImportOperation(  # noqa: N802
    mesh: Mesh, tf_tensor: Any, shape: Any, name: str | None = None
) -> Operation:
    return _op(_m.import_tf_tensor(mesh, tf_tensor, shape, name=name))


def Conv2dOperation(  # noqa: N802
    conv_input: Tensor,
    conv_filter: Tensor,
    strides: Sequence[int],
    padding: str,
    name: str | None = None,
) -> Operation:
    # Mesh TF gives NHWC strides ([1, sh, sw, 1]); mtf_core's conv2d the two
    # spatial ones.
    spatial = list(strides)[1:3] if len(strides) == 4 else list(strides)
    return _op(_m.conv2d(conv_input, conv_filter, spatial, padding, name=name))


def WhileLoopOperation(  # noqa: N802
    cond_fn: Callable[..., Tensor],
    body_fn: Callable[..., Sequence[Tensor]],
    inputs: Sequence[Tensor],
    tf_kwargs: dict[str, Any] | None = None,
    has_accumulators: bool = False,
    name: str = "while_loop",
) -> Operation:
    return _op(
        _m.while_loop(
            cond_fn, body_fn, list(inputs), has_accumulators=has_accumulators,
            **(tf_kwargs or {}),
        )
    )  # fmt: skip


def BinaryOpWithBroadcasting(  # noqa: N802
    tf_fn: Callable[..., Any],
    x1: Tensor,
    x2: Tensor,
    output_shape: Any,
    output_dtype: Any,
    name: str | None = None,
) -> Operation:
    # Both inputs broadcast to the output's dims, then tf_fn slice by slice.
    shape = convert_to_shape(output_shape)
    xs = [_m.broadcast(x, shape) if x.shape != shape else x for x in (x1, x2)]
    return _op(_m.slicewise(tf_fn, xs, shape, output_dtype, name=name))


def ReadVariable(var: Any, name: str | None = None) -> Operation:  # noqa: N802
    """The op reading ``var`` (Mesh TF reads a variable through one)."""
    return _op(_m.identity(_m.ops.variables.as_variable(var).outputs[0], name=name))


def RandomOperation(  # noqa: N802
    mesh: Mesh, shape: Any, tf_fn: Callable[..., Any], **kwargs: Any
) -> Operation:
    fn_name = getattr(tf_fn, "__name__", str(tf_fn))
    if "uniform" in fn_name:
        return _op(_m.random_uniform(mesh, shape, **kwargs))
    if "normal" in fn_name:
        return _op(_m.random_normal(mesh, shape, **kwargs))
    raise _m.ArgumentError(
        f"RandomOperation: {fn_name!r} is not a uniform or normal distribution, "
        "the two mtf_core draws layout-independently"
    )


def _conv2d_only(conv_dimension: int, is_transpose: bool, what: str) -> None:
    if conv_dimension != 2 or is_transpose:
        raise _m.ArgumentError(
            f"{what}: conv_dimension={conv_dimension}, is_transpose={is_transpose}; "
            "mtf_core has the 2-D, non-transposed convolution's gradients"
        )


def Conv2or3dBackpropInputOperation(  # noqa: N802
    conv_dimension: int,
    is_transpose: bool,
    input_shape: Any,
    conv_filter: Tensor,
    dy: Tensor,
    strides: Sequence[int],
    padding: str,
    name: str | None = None,
) -> Operation:
    from mtf_core.ops.conv import Conv2dBackpropInput

    _conv2d_only(conv_dimension, is_transpose, "Conv2or3dBackpropInputOperation")
    spatial = list(strides)[1:3] if len(strides) == 4 else list(strides)
    return Conv2dBackpropInput(
        dy, conv_filter, convert_to_shape(input_shape), spatial, padding, name
    )


def Conv2or3dBackpropFilterOperation(  # noqa: N802
    conv_dimension: int,
    is_transpose: bool,
    conv_input: Tensor,
    filter_shape: Any,
    dy: Tensor,
    strides: Sequence[int],
    padding: str,
    name: str | None = None,
) -> Operation:
    from mtf_core.ops.conv import Conv2dBackpropFilter

    _conv2d_only(conv_dimension, is_transpose, "Conv2or3dBackpropFilterOperation")
    spatial = list(strides)[1:3] if len(strides) == 4 else list(strides)
    return Conv2dBackpropFilter(
        conv_input, dy, convert_to_shape(filter_shape), spatial, padding, name
    )


def _assign(variables: Any, new_values: Any, name: str | None = None) -> Operation:
    """Mesh TF's ``Assign([vars], [values])`` (one variable per op here)."""
    if isinstance(variables, (list, tuple)):
        if len(variables) != 1 or len(new_values) != 1:
            raise _m.ArgumentError(
                f"Assign: {len(variables)} variables and {len(new_values)} values; "
                "mtf_core assigns one variable per op, use mtf.assign for each"
            )
        variables, new_values = variables[0], new_values[0]
    return _m.Assign(_m.ops.variables.as_variable(variables), new_values, name=name)


def _mesh_impl_base() -> type:
    """Mesh TF's ``MeshImpl``: the backend base class, instantiable (its
    backend methods raise NotImplementedError, as Mesh TF's do)."""
    from mtf_core.lowering.mesh_impl import MeshImpl as Base

    def missing(name: str) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(
                f"MeshImpl.{name}: a MeshImpl is the backend base class; use "
                "PlacementMeshImpl or SimdMeshImpl to lower"
            )

        return method

    body = {n: missing(n) for n in getattr(Base, "__abstractmethods__", ())}
    body["__doc__"] = _mesh_impl_base.__doc__
    return type("MeshImpl", (Base,), body)


def _convert_to_shape(x: Any) -> Shape | None:
    """Mesh TF's ``convert_to_shape``: ``None`` passes through."""
    return None if x is None else convert_to_shape(x)


from mtf_core.ops.slicewise import (  # noqa: E402
    Depend,
    GenericGradOperation,
    PrintOperation,
    SlicewiseOperation,
)

NAMES: dict[str, Any] = {
    "Depend": Depend,
    "GenericGradOperation": GenericGradOperation,
    "PrintOperation": PrintOperation,
    "SlicewiseOperation": SlicewiseOperation,
}
NAMES |= {
    name: value
    for name, value in globals().items()
    if name[:1].isupper() and getattr(value, "__module__", "") == __name__
}

NAMES["list_product"] = math.prod  # Mesh TF's helper
NAMES["pnum_to_processor_coordinates"] = pnum_to_processor_coordinates
NAMES |= {
    "ImportLaidOutTensorOperation": ImportLaidOutTensorOperation,
    "import_laid_out_tensor": import_laid_out_tensor,
    "PoolOperation": PoolOperation,
    "PoolBackPropOperation": PoolBackPropOperation,
    "pool_backprop": pool_backprop,
}
NAMES["processor_coordinates_to_pnum"] = processor_coordinates_to_pnum
# Mesh TF's own spellings of the builtin-shadowing names (mtf.pow etc.).
NAMES |= {"mtf_pow": _m.pow, "mtf_abs": _m.abs, "mtf_slice": _m.slice}

OVERRIDES: dict[str, Any] = {
    "Operation": CompatOperation,
    "MeshImpl": _mesh_impl_base(),
    "convert_to_shape": _convert_to_shape,
    "Assign": _assign,
}
