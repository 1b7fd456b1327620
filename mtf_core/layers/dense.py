"""Dense layers: ``dense`` (Mesh TensorFlow's signature), its kernel, products
of dense layers (gated linear units), the feed-forward block, and the
unit-scaling convention.

Weights are named after the layer (``{name}_kernel``, ``{name}_bias``;
called from a Mesh TF program, Mesh TF's scoped names instead:
:mod:`mtf_core.layers.scopes`) and drawn from a seed derived from that
name, so a model starts from the same values under every layout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ConfigError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.layers._dims import dim_in, dim_refs, dims
from mtf_core.layers.initializers import (
    DenseInitializer,
    named_initializer,
    normal_initializer,
    provided_or,
    unit_scaling_convention,
    zeros_initializer,
)
from mtf_core.layers.scopes import layer_scope
from mtf_core.ops import elementwise as ew
from mtf_core.ops import unary
from mtf_core.ops.einsum import einsum
from mtf_core.ops.reshape import rename_dimension
from mtf_core.ops.variables import get_variable, scoped_name
from mtf_core.shapes import Dimension, Shape


def us_einsum(xs: Sequence[Tensor], *args: Any, **kwargs: Any) -> Tensor:
    """``einsum``, divided by ``sqrt`` of the contracted dims' size when the
    unit-scaling convention is on."""
    y = einsum(list(xs), *args, **kwargs)
    if unit_scaling_convention():
        kept = set(y.shape.dimension_names)
        reduced = {d for x in xs for d in x.shape if d.name not in kept}
        y = y * (math.prod(d.size for d in reduced) ** -0.5)
    return y


def _variable_dtype(
    x: Tensor, variable_dtype: Any, master_dtype: Any, slice_dtype: Any
) -> dtypes.VariableDType:
    if variable_dtype is not None:
        return dtypes.as_variable_dtype(variable_dtype)
    return dtypes.VariableDType(master_dtype, slice_dtype, x.dtype)


def get_dense_kernel_weights(
    x: Tensor,
    new_dims: Sequence[Dimension],
    reduced_dims: Sequence[Dimension],
    expert_dims: Sequence[Dimension] = (),
    kernel_initializer: Any = None,
    name: str | None = None,
    variable_dtype: Any = None,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
) -> Tensor:
    """The ``[expert_dims, reduced_dims, new_dims]`` kernel of :func:`dense`,
    in ``x``'s dtype.

    ``kernel_initializer``: a :class:`DenseInitializer` (called with the
    reduced and new dims), any ``callable(shape, dtype)``, or None for a normal
    of stddev ``1/sqrt(size of reduced_dims)`` (1 under the unit-scaling
    convention), clipped at 2 sigma.
    """
    vd = _variable_dtype(x, variable_dtype, master_dtype, slice_dtype)
    init = kernel_initializer
    if isinstance(init, DenseInitializer):
        init = init(list(reduced_dims), list(new_dims))
    shape = Shape([*expert_dims, *reduced_dims, *new_dims])
    with layer_scope(name, "dense") as weight:
        kname = weight("kernel")
        seed = scoped_name(kname)  # the stored name: one seed per variable
        if init is None:
            fan_in = (
                1
                if unit_scaling_convention()
                else math.prod(d.size for d in reduced_dims)
            )
            stddev = max(1, fan_in) ** -0.5
            # Mesh TF's default is VarianceScalingInitializer(): a truncated
            # normal
            init = provided_or(
                "truncated_normal", stddev, normal_initializer(stddev, seed)
            )
        w = get_variable(
            x.mesh, kname, shape, vd, initializer=named_initializer(init, seed)
        )
    return ew.cast(w, x.dtype)


def dense(
    x: Tensor,
    new_dims: Any = None,
    reduced_dims: Any = None,
    expert_dims: Any = None,
    use_bias: bool = True,
    activation: Callable[[Tensor], Tensor] | None = None,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    variable_dtype: Any = None,
    kernel_initializer: Any = None,
    kernel_weights: Tensor | None = None,
    name: str | None = None,
    output_dim: Any = None,
) -> Tensor:
    """``activation(x @ kernel + bias)`` (Mesh TensorFlow's ``layers.dense``).

    Reduces ``reduced_dims`` (default: ``x``'s last dim) and adds ``new_dims``
    (``output_dim`` is an older name for it); ``expert_dims``, dims of ``x``,
    give each expert its own weights.  The kernel is ``[expert_dims,
    reduced_dims, new_dims]`` (or ``kernel_weights``); the bias
    ``[expert_dims, new_dims]``.  A new dim named like a reduced one is
    allowed: the input's dim is renamed ``_name`` first.  Variables are
    stored as ``variable_dtype`` (default: float32 master and slices,
    ``x``'s dtype as activations).
    """
    label = name or "dense"
    new = dims(new_dims if new_dims is not None else output_dim)
    if new_dims is None and output_dim is None:
        raise ShapeError(f"dense {label!r}: give new_dims (the output dimensions)")
    experts = [dim_in(x, d, f"dense {label!r}") for d in dim_refs(expert_dims)]
    reduced = (
        [dim_in(x, d, f"dense {label!r}") for d in dim_refs(reduced_dims)]
        if reduced_dims is not None
        else [x.shape.dims[-1]]
    )
    new_names = {n.name for n in new}
    for i, d in enumerate(reduced):
        if d.name in new_names:
            # Same name in and out: rename the input's, so the kernel's two
            # dims differ (Mesh TensorFlow does the same).
            reduced[i] = Dimension(f"_{d.name}", d.size)
            x = rename_dimension(x, d.name, reduced[i].name)
    for d in new:
        if d.name in x.shape.dimension_names and d not in reduced:
            raise ShapeError(
                f"dense {label!r}: new dimension {d} is already a dimension of "
                f"{x.name} [{x.shape}] and is not reduced"
            )
    vd = _variable_dtype(x, variable_dtype, master_dtype, slice_dtype)
    if kernel_weights is None:
        kernel_weights = get_dense_kernel_weights(
            x, new, reduced, experts, kernel_initializer, name, vd
        )
    out_shape = Shape([d for d in x.shape if d not in reduced] + new)
    y = us_einsum([x, kernel_weights], output_shape=out_shape)
    # Mesh TF opens a second scope, for the bias, with a bias or without
    # (an unnamed layer's kernel is ``dense/kernel``, its bias
    # ``dense_1/bias``, and the next layer's kernel ``dense_2/kernel``).
    with layer_scope(name, "dense") as weight:
        if use_bias:
            b = get_variable(
                x.mesh,
                weight("bias"),
                Shape([*experts, *new]),
                vd,
                initializer=zeros_initializer(),
            )
            y = y + ew.cast(b, y.dtype)
    if activation is not None:
        y = activation(y)
    return y


#: Activations by their mtf function name (Mesh TF resolves the name on the
#: ``mtf`` module): the unary math and activations and the elementwise
#: one-argument functions beside them.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    **{name: getattr(unary, name) for name in unary.UNARY},
    "swish": unary.swish,
    "squared_relu": unary.squared_relu,
    "leaky_relu": ew.leaky_relu,
    "identity": ew.identity,
    "stop_gradient": ew.stop_gradient,
    "to_float": ew.to_float,
    "to_bfloat16": ew.to_bfloat16,
    "to_int32": ew.to_int32,
}


def _activation(fn: Any) -> Callable[[Tensor], Tensor] | None:
    """An activation given as a callable, an mtf function name (one of
    :data:`ACTIVATIONS`), or None/``"linear"`` for none."""
    if fn is None or fn == "linear":
        return None
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    found = ACTIVATIONS.get(str(fn))
    if found is None:
        raise ConfigError(
            f"dense_product: activation {fn!r} is not an mtf activation name; "
            f"expected one of {sorted(ACTIVATIONS)}, 'linear' or a callable"
        )
    return found


def dense_product(
    x: Tensor,
    reduced_dims: Any,
    new_dims: Any,
    activation_functions: Any = None,
    name: str = "dense_product",
    **kwargs: Any,
) -> Tensor:
    """The elementwise product of one :func:`dense` per activation function
    (each a callable, an mtf function name, or None/``"linear"``);
    ``["linear", "sigmoid"]`` is a gated linear unit.  ``kwargs`` go to
    :func:`dense`."""
    fns = (
        activation_functions
        if isinstance(activation_functions, list)
        else [activation_functions]
    )
    factors = [
        dense(
            x,
            new_dims=new_dims,
            reduced_dims=reduced_dims,
            activation=_activation(fn),
            name=f"{name}_{i}" if len(fns) > 1 else name,
            **kwargs,
        )
        for i, fn in enumerate(fns)
    ]
    return functools.reduce(ew.multiply, factors)


def dense_relu_dense(
    x: Tensor,
    hidden_channels: Any,
    is_training: bool = True,
    dropout: float = 0.0,
    dropout_broadcast_dims: Any = None,
    master_dtype: Any = "float32",
    slice_dtype: Any = "float32",
    name: str | None = None,
    *,
    output_dim: Any = None,
    dropout_rate: float | None = None,
    activation: Callable[[Tensor], Tensor] = ew.relu,
    use_bias: bool = False,
) -> Tensor:
    """Transformer feed-forward: ``dense(dropout(activation(dense(x,
    hidden_channels))), output_dim)`` without biases (Mesh TensorFlow's
    signature; ``dropout_rate`` is mtf_core's name for ``dropout``).

    ``output_dim`` defaults to x's last dim.  Under a split of the hidden dim
    the first einsum needs no communication and the second ends in one
    allreduce.
    """
    from mtf_core.ops.random import dropout as random_dropout

    hidden = dims(hidden_channels)
    if len(hidden) != 1:
        raise ShapeError(
            f"dense_relu_dense {name or 'dense_relu_dense'!r}: hidden_channels "
            f"{hidden_channels!r} must be one sized dimension"
        )
    rate = dropout if dropout_rate is None else dropout_rate
    io = x.shape.dims[-1] if output_dim is None else dims(output_dim)[0]
    vd = dtypes.VariableDType(master_dtype, slice_dtype, x.dtype)
    with layer_scope(name, "dense_relu_dense") as weight:
        h = dense(
            x,
            hidden,
            reduced_dims=[x.shape.dims[-1]],
            use_bias=use_bias,
            activation=activation,
            variable_dtype=vd,
            name=weight("wi"),
        )
        if rate:
            broadcast = dims(dropout_broadcast_dims)
            h = random_dropout(
                h, is_training, rate=rate, noise_shape=h.shape - broadcast
            )
        return dense(
            h,
            io,
            reduced_dims=hidden,
            use_bias=use_bias,
            variable_dtype=vd,
            name=weight("wo"),
        )
