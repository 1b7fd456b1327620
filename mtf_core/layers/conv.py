"""Convolution layers.

``conv2d``/``conv3d`` (and ``conv1d``, a conv2d over a height of 1) and the
transposed convolutions run the ``mtf_core.ops.conv`` ops on whole images per
device: spatial dims stay whole, batch and channel dims may be split; the
``*_with_blocks`` forms cut the spatial dims into blocks that may be split,
with halo exchanges (the transposed ones need none).  ``separable_conv1d`` is shifts and per-channel products
(so its length may be split: shifts become neighbour exchanges).  Pooling is
in :mod:`.pooling`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ShapeError
from mtf_core.graph import Tensor
from mtf_core.layers.dense import dense
from mtf_core.layers.initializers import (
    DenseInitializer,
    VarianceScalingInitializer,
    named_initializer,
    normal_initializer,
    zeros_initializer,
)
from mtf_core.ops.arguments import sized_dim
from mtf_core.ops.reshape import reshape
from mtf_core.ops.shift import shift
from mtf_core.ops.variables import get_variable
from mtf_core.shapes import Dimension, Shape

_FILTER_DIMS = ("filter_depth", "filter_height", "filter_width")


def _variable_dtype(x: Tensor, variable_dtype: Any) -> dtypes.VariableDType:
    """A conv layer's variable dtypes: as given, else ``x``'s dtype."""
    if variable_dtype is None:
        return dtypes.VariableDType(activation_dtype=x.dtype)
    return dtypes.as_variable_dtype(variable_dtype)


def _conv_layer(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int],
    strides: Sequence[int],
    padding: str,
    filter_initializer: Any,
    variable_dtype: Any,
    name: str,
    use_bias: bool,
) -> Tensor:
    from mtf_core.ops.conv import conv2d as conv2d_op
    from mtf_core.ops.conv import conv3d as conv3d_op

    n = len(filter_size)
    what = f"conv{n}d {name!r}"
    out = sized_dim(output_dim, what)
    if x.shape.ndims < n + 1:
        space = "h, w" if n == 2 else "d, h, w"
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] must be [batch..., {space}, channels]"
        )
    cin = x.shape.dims[-1]
    sizes = [int(s) for s in filter_size]
    names = _FILTER_DIMS[-n:]
    fshape = Shape([*(Dimension(a, k) for a, k in zip(names, sizes)), cin, out])
    fname = f"{name}_filters"
    init = filter_initializer
    if isinstance(init, DenseInitializer):
        init = init(list(fshape.dims[: n + 1]), [out])
    if init is None:
        fan_in = cin.size
        for k in sizes:
            fan_in *= k
        init = normal_initializer(fan_in**-0.5, fname)
    vd = _variable_dtype(x, variable_dtype)
    w = get_variable(
        x.mesh, fname, fshape, vd, initializer=named_initializer(init, fname)
    )
    op = conv2d_op if n == 2 else conv3d_op
    y = op(x, w, tuple(int(s) for s in strides), padding)
    if use_bias:
        b = get_variable(
            x.mesh, f"{name}_bias", Shape([out]), vd, initializer=zeros_initializer()
        )
        y = y + b
    return y


def conv2d(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (3, 3),
    strides: Sequence[int] = (1, 1),
    padding: str = "SAME",
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
    *,
    use_bias: bool = False,
) -> Tensor:
    """A learned 2-D convolution of ``x [batch..., h, w, in_channels]`` to
    ``[batch..., h', w', output_dim]`` (Mesh TensorFlow's signature; no bias
    unless ``use_bias``).

    The filter ``{name}_filters`` is ``[filter_height, filter_width,
    in_channels, output_dim]``, by default normal with stddev
    ``1/sqrt(fan_in)``; ``h``, ``w`` and the filter's spatial dims cannot be
    split (each device convolves whole images), batch and channel dims can.
    """
    if len(filter_size) != 2:
        raise ShapeError(f"conv2d: filter_size {filter_size!r} is not (h, w)")
    return _conv_layer(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name or "conv2d",
        use_bias,
    )


def conv3d(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (3, 3, 3),
    strides: Sequence[int] = (1, 1, 1),
    padding: str = "SAME",
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
    *,
    use_bias: bool = False,
) -> Tensor:
    """A learned 3-D convolution of ``x [batch..., d, h, w, in_channels]``
    (filter ``[filter_depth, filter_height, filter_width, in_channels,
    output_dim]``); as :func:`conv2d` otherwise."""
    if len(filter_size) != 3:
        raise ShapeError(f"conv3d: filter_size {filter_size!r} is not (d, h, w)")
    return _conv_layer(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name or "conv3d",
        use_bias,
    )


def _conv_transpose_layer(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int],
    strides: Sequence[int],
    padding: str,
    filter_initializer: Any,
    variable_dtype: Any,
    name: str,
) -> Tensor:
    from mtf_core.ops.conv import conv_transpose

    n = len(filter_size)
    what = f"conv{n}d_transpose {name!r}"
    out = sized_dim(output_dim, what)
    if x.shape.ndims < n + 1 or len(strides) != n:
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] must have {n} spatial dims and channels, "
            f"with {n} strides (got {tuple(strides)})"
        )
    cin = x.shape.dims[-1]
    sizes = [int(k) for k in filter_size]
    fshape = Shape(
        [*(Dimension(a, k) for a, k in zip(_FILTER_DIMS[-n:], sizes)), out, cin]
    )
    fname = f"{name}_filters"
    init = filter_initializer
    if isinstance(init, DenseInitializer):
        init = init([cin], list(fshape.dims[: n + 1]))
    if init is None:
        init = normal_initializer(cin.size**-0.5, fname)
    vd = _variable_dtype(x, variable_dtype)
    w = get_variable(
        x.mesh, fname, fshape, vd, initializer=named_initializer(init, fname)
    )
    space = []
    for d, k, st in zip(x.shape.dims[-(n + 1) : -1], sizes, strides):
        size = d.size * int(st) if padding == "SAME" else (d.size - 1) * int(st) + k
        space.append(Dimension(d.name, size))
    out_shape = Shape([*x.shape.dims[: -(n + 1)], *space, out])
    return conv_transpose(x, w, out_shape, strides, padding)


def conv2d_transpose(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (2, 2),
    strides: Sequence[int] = (2, 2),
    padding: str = "SAME",
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """A learned transposed 2-D convolution (upsampling): ``x [batch..., h,
    w, in_channels]`` to ``[batch..., h * stride, w * stride, output_dim]``
    ("SAME"; "VALID" gives ``(h - 1) * stride + filter``).  The filter is
    ``[filter_height, filter_width, output_dim, in_channels]``."""
    return _conv_transpose_layer(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name or "conv2d_transpose",
    )


def conv3d_transpose(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (2, 2, 2),
    strides: Sequence[int] = (2, 2, 2),
    padding: str = "SAME",
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """:func:`conv2d_transpose` with three spatial dims ``d, h, w``."""
    return _conv_transpose_layer(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name or "conv3d_transpose",
    )


def _halo_blocks(
    x: Tensor, filter_size: Sequence[int], blocks_dims: Sequence[Any], what: str
) -> Tensor:
    """Gives each block of the spatial dims the margins its (odd) filter
    needs: a halo exchange along a blocks dim, zero padding without one."""
    from mtf_core.ops.halo import halo_exchange
    from mtf_core.ops.slicing import pad

    n = len(filter_size)
    if any(int(k) % 2 == 0 for k in filter_size):
        raise ShapeError(f"{what}: needs odd filter sizes, got {tuple(filter_size)}")
    space = x.shape.dims[-(n + 1) : -1]
    for blocks, size, k in zip(blocks_dims, space, filter_size):
        halo = int(k) // 2
        if not halo:
            continue
        if blocks is None:
            x = pad(x, [halo, halo], size.name)
        else:
            x = halo_exchange(x, blocks, size, halo)
    return x


def conv2d_with_blocks(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (3, 3),
    strides: Sequence[int] = (1, 1),
    padding: str = "SAME",
    h_blocks_dim: Any = None,
    w_blocks_dim: Any = None,
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """:func:`conv2d` of an image cut into blocks: ``x [batch...,
    h_blocks, w_blocks, h, w, channels]`` (the blocks dims may be split over
    mesh axes, spatial partitioning).  Each block gets the margins its
    filter needs from its neighbours by a :func:`halo_exchange` (zeros at the
    image's edges), then convolves with "VALID" padding; the result is the
    "SAME" convolution of the whole image, blocked the same way.  Odd filter
    sizes and "SAME" padding only, as in Mesh TensorFlow.
    """
    if h_blocks_dim is None and w_blocks_dim is None:
        return conv2d(
            x,
            output_dim,
            filter_size,
            strides,
            padding,
            filter_initializer,
            variable_dtype,
            name,
        )
    if padding != "SAME":
        raise ShapeError(
            f"conv2d_with_blocks: needs padding 'SAME' and odd filter sizes, got "
            f"{padding!r}"
        )
    x = _halo_blocks(x, filter_size, [h_blocks_dim, w_blocks_dim], "conv2d_with_blocks")
    return conv2d(
        x,
        output_dim,
        filter_size,
        strides,
        "VALID",
        filter_initializer,
        variable_dtype,
        name,
    )


def conv3d_with_blocks(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (3, 3, 3),
    strides: Sequence[int] = (1, 1, 1),
    padding: str = "SAME",
    d_blocks_dim: Any = None,
    h_blocks_dim: Any = None,
    w_blocks_dim: Any = None,
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """:func:`conv3d` of a volume cut into blocks (``x [batch...,
    d_blocks, h_blocks, w_blocks, d, h, w, channels]``), as
    :func:`conv2d_with_blocks` does for images."""
    blocks = [d_blocks_dim, h_blocks_dim, w_blocks_dim]
    if all(b is None for b in blocks):
        return conv3d(
            x,
            output_dim,
            filter_size,
            strides,
            padding,
            filter_initializer,
            variable_dtype,
            name,
        )
    if padding != "SAME":
        raise ShapeError(
            f"conv3d_with_blocks: needs padding 'SAME' and odd filter sizes, got "
            f"{padding!r}"
        )
    x = _halo_blocks(x, filter_size, blocks, "conv3d_with_blocks")
    return conv3d(
        x,
        output_dim,
        filter_size,
        strides,
        "VALID",
        filter_initializer,
        variable_dtype,
        name,
    )


def _transpose_blocks_check(
    what: str, filter_size: Sequence[int], strides: Sequence[int], padding: str
) -> None:
    """Blocks transpose independently only when each input position's output
    patch is its own (``filter_size == strides``): then no halo is needed and
    the blocked result is the whole image's.  Mesh TF's halo for larger even
    filters (``filter // 2 - 1``) changes the output size, so it is refused."""
    if padding != "SAME":
        raise ShapeError(f"{what}: needs padding 'SAME', got {padding!r}")
    if [int(k) for k in filter_size] != [int(st) for st in strides]:
        raise ShapeError(
            f"{what}: filter_size {tuple(filter_size)} differs from strides "
            f"{tuple(strides)}; blocks transpose independently only when they "
            "are equal (each input position fills its own output patch)"
        )


def conv2d_transpose_with_blocks(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (2, 2),
    strides: Sequence[int] = (2, 2),
    padding: str = "SAME",
    h_blocks_dim: Any = None,
    w_blocks_dim: Any = None,
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """:func:`conv2d_transpose` of an image cut into blocks: ``x [batch...,
    h_blocks, w_blocks, h, w, channels]`` to ``[batch..., h_blocks,
    w_blocks, h * stride, w * stride, output_dim]``, the blocks dims split
    freely.  With ``filter_size == strides`` (Mesh TF's (2, 2), what its
    U-Net uses) each block upsamples on its own, with no communication, and
    the result is the whole image's transposed convolution, blocked."""
    if h_blocks_dim is not None or w_blocks_dim is not None:
        _transpose_blocks_check(
            "conv2d_transpose_with_blocks", filter_size, strides, padding
        )
    return conv2d_transpose(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name,
    )


def conv3d_transpose_with_blocks(
    x: Tensor,
    output_dim: Any,
    filter_size: Sequence[int] = (2, 2, 2),
    strides: Sequence[int] = (2, 2, 2),
    padding: str = "SAME",
    d_blocks_dim: Any = None,
    h_blocks_dim: Any = None,
    filter_initializer: Any = None,
    variable_dtype: Any = None,
    name: str | None = None,
) -> Tensor:
    """:func:`conv2d_transpose_with_blocks` with three spatial dims: ``x
    [batch..., d_blocks, h_blocks, w_blocks, d, h, w, channels]``."""
    if d_blocks_dim is not None or h_blocks_dim is not None:
        _transpose_blocks_check(
            "conv3d_transpose_with_blocks", filter_size, strides, padding
        )
    return conv3d_transpose(
        x,
        output_dim,
        filter_size,
        strides,
        padding,
        filter_initializer,
        variable_dtype,
        name,
    )


def conv1d(
    x: Tensor, output_dim: Any, filter_size: int = 3, stride: int = 1, **kw_args: Any
) -> Tensor:
    """A 1-D convolution of ``x [batch..., length, channels]`` to ``[batch...,
    length', output_dim]`` (``padding`` "SAME" keeps the length): a
    :func:`conv2d` over a height of 1; ``kw_args`` go to it."""
    out = sized_dim(output_dim, "conv1d")
    fake = Dimension("fake_height", 1)
    d = x.shape.dims
    y = conv2d(
        reshape(x, Shape([*d[:-2], fake, *d[-2:]])),
        out,
        filter_size=(1, filter_size),
        strides=(1, stride),
        **kw_args,
    )
    yd = y.shape.dims
    return reshape(y, Shape([*yd[:-3], yd[-2], out]))


def separable_conv1d(
    x: Tensor,
    output_dim: Any,
    min_relative_pos: int = -1,
    max_relative_pos: int = 1,
    depthwise_filter_initializer_scale: float = 1.0,
    pointwise_filter_initializer_scale: float = 1.0,
    name: str | None = None,
    use_bias: bool = True,
    kernel_depth_weights: Sequence[Tensor] | None = None,
) -> Tensor:
    """A depthwise 1-D convolution over ``x [batch..., length, depth]``
    (positions ``min_relative_pos .. max_relative_pos`` around each, zeros
    past the ends), then a pointwise dense layer to ``output_dim``.

    Each tap is a shift along the length and a per-channel product, so the
    length may be split (shifts exchange the edge with the neighbours).
    ``kernel_depth_weights`` gives the taps' ``[depth]`` weights instead of
    variables.
    """
    name = name or "separable_conv1d"
    out = sized_dim(output_dim, f"separable_conv1d {name!r}")
    depth, length = x.shape.dims[-1], x.shape.dims[-2]
    taps = max_relative_pos - min_relative_pos + 1
    if taps < 1:
        raise ShapeError(
            f"separable_conv1d {name!r}: max_relative_pos {max_relative_pos} is "
            f"below min_relative_pos {min_relative_pos}"
        )
    total: Tensor | None = None
    for i in range(taps):
        rel = min_relative_pos + i
        tap = dense(
            shift(x, -rel, length, wrap=False),
            new_dims=[],
            reduced_dims=[],
            expert_dims=[depth],
            kernel_weights=None
            if kernel_depth_weights is None
            else kernel_depth_weights[i],
            use_bias=use_bias and i == 0,
            kernel_initializer=VarianceScalingInitializer(
                scale=depthwise_filter_initializer_scale / taps
            ),
            name=f"{name}_depthwise_dense_{i}",
        )
        total = tap if total is None else total + tap
    assert total is not None
    return dense(
        total,
        new_dims=[out],
        reduced_dims=[depth],
        use_bias=use_bias,
        kernel_initializer=VarianceScalingInitializer(
            scale=pointwise_filter_initializer_scale
        ),
        name=f"{name}_pointwise_dense",
    )
