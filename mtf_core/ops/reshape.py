"""Reshape, ``rename_dimension`` and ``replace_dimensions``, plus the layout
helpers other op families use to gather a dimension whole and split it again.

Reshape under any pair of layouts
---------------------------------
Row-major, a dimension of a tensor that starts at flat "prefix" ``P`` (the
product of the sizes before it) and is split ``n`` ways puts element ``F`` of
the flattened tensor (of ``T`` elements) on chunk ``floor(F * P * n / T) mod n``,
whatever its own size.  So if every split input dimension is paired with an
output dimension at the *same prefix*, split over the same mesh axis (with
``n`` dividing both sizes), every device already holds exactly the elements of
its output slice, in the same order, and a local ``tf.reshape`` is the whole
job.  :func:`plan_reshape` picks such "working" layouts, per mesh axis ``m``:

1. the input dim on ``m`` and the output dim on ``m`` start at the same
   prefix: keep both (free);
2. else, an unsplit input dim at the output dim's prefix takes ``m``: the
   input moves there first (alltoall from the old dim, or a free allsplit);
3. else, an unsplit output dim at the input dim's prefix takes ``m``: the
   output moves to its own layout afterwards (alltoall or allconcat);
4. else the input dim is gathered (allconcat) before and the output dim split
   (free) after.

Merging ``[a, b] -> [ab]`` with ``b`` split and ``ab`` split on the same axis
is case 2: one alltoall moving the axis from ``b`` to ``a``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext, layout_change_collectives
from mtf_core.errors import ShapeError
from mtf_core.graph import Operation, Tensor, check_tensor
from mtf_core.layout import TensorLayout
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape

# --------------------------------------------------------------------------
# layout helpers shared by the op families
# --------------------------------------------------------------------------


def layout_without(ctx: LayoutContext, shape: Shape, dim_names: Any) -> TensorLayout:
    """The rules' layout of ``shape`` with the dims in ``dim_names`` whole."""
    names = set(dim_names)
    layout = ctx.tensor_layout(shape)
    return TensorLayout(
        tuple(None if d.name in names else m for d, m in zip(shape, layout))
    )


def gather_collectives(
    ctx: LayoutContext, t: Tensor, dim_names: Any
) -> list[CollectiveSpec]:
    """Collectives that make the dims ``dim_names`` of ``t`` whole."""
    return layout_change_collectives(
        ctx,
        t.shape,
        t.dtype,
        ctx.tensor_layout(t.shape),
        layout_without(ctx, t.shape, dim_names),
    )


def lower_gathered(impl: Any, laid: Any, shape: Shape, dim_names: Any) -> Any:
    """Moves a laid-out tensor from its rules' layout to one with ``dim_names``
    whole (allconcat over the axes that split them)."""
    return impl.apply_layout_change(
        laid,
        shape,
        impl.tensor_layout(shape),
        layout_without(impl.ctx, shape, dim_names),
    )


def lower_resplit(impl: Any, laid: Any, shape: Shape, dim_names: Any) -> Any:
    """Inverse of :func:`lower_gathered`: splits ``dim_names`` as the rules say
    (allsplit: local slicing, no communication)."""
    return impl.apply_layout_change(
        laid,
        shape,
        layout_without(impl.ctx, shape, dim_names),
        impl.tensor_layout(shape),
    )


# --------------------------------------------------------------------------
# the reshape plan
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ReshapePlan:
    """Working layouts: the input moves to ``in_work``, is reshaped locally
    into ``out_work``, which then moves to the output's own layout."""

    in_layout: TensorLayout
    in_work: TensorLayout
    out_work: TensorLayout
    out_layout: TensorLayout


def plan_reshape(ctx: LayoutContext, in_shape: Shape, out_shape: Shape) -> ReshapePlan:
    """Chooses working layouts for reshaping ``in_shape`` to ``out_shape``
    (see the module docstring for the rules)."""
    in_layout = ctx.tensor_layout(in_shape)
    out_layout = ctx.tensor_layout(out_shape)
    # Each dim's flat prefix: the product of the sizes before it.
    in_pre, out_pre = in_shape.cumprod, out_shape.cumprod
    in_work: list[int | None] = [None] * len(in_shape)
    out_work: list[int | None] = [None] * len(out_shape)
    in_m2t = in_layout.mesh_axis_to_tensor_axis(ctx.ndims)
    out_m2t = out_layout.mesh_axis_to_tensor_axis(ctx.ndims)

    def partner(
        prefix: int,
        shape: Shape,
        prefixes: Sequence[int],
        n: int,
        layout: TensorLayout,
        work: list[int | None],
    ) -> int | None:
        # Only dims unsplit in their own layout: an alltoall onto a dim that
        # another axis still splits would interleave the chunks wrongly.
        for i, d in enumerate(shape):
            if (
                prefixes[i] == prefix
                and d.size % n == 0
                and ctx.live_axis(layout[i]) is None
                and work[i] is None
            ):
                return i
        return None

    for m in range(ctx.ndims):
        n = ctx.mesh_shape[m].size
        if n == 1:
            continue
        a, b = in_m2t[m], out_m2t[m]
        if a is not None and b is not None and in_pre[a] == out_pre[b]:
            in_work[a], out_work[b] = m, m
            continue
        if b is not None:
            p = partner(out_pre[b], in_shape, in_pre, n, in_layout, in_work)
            if p is not None:
                in_work[p], out_work[b] = m, m
                continue
        if a is not None:
            q = partner(in_pre[a], out_shape, out_pre, n, out_layout, out_work)
            if q is not None:
                in_work[a], out_work[q] = m, m
    return ReshapePlan(
        in_layout,
        TensorLayout(tuple(in_work)),
        TensorLayout(tuple(out_work)),
        out_layout,
    )


# --------------------------------------------------------------------------
# ops
# --------------------------------------------------------------------------


class Reshape(Operation):
    """``reshape(x, new_shape)``: same elements (row-major), new named shape."""

    op_type = "Reshape"

    def __init__(self, x: Tensor, new_shape: Shape, name: str | None = None) -> None:
        if new_shape.size != x.shape.size:
            raise ShapeError(
                f"reshape: {x.name} [{x.shape}] has {x.shape.size} elements but the "
                f"new shape [{new_shape}] has {new_shape.size}; sizes must match"
            )
        super().__init__([x], name=name or "reshape")
        self._add_output(new_shape, x.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        return [None if dy is None else reshape(dy, self.inputs[0].shape)]

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        x, out = self.inputs[0], self.outputs[0]
        plan = plan_reshape(ctx, x.shape, out.shape)
        return layout_change_collectives(
            ctx, x.shape, x.dtype, plan.in_layout, plan.in_work
        ) + layout_change_collectives(
            ctx, out.shape, out.dtype, plan.out_work, plan.out_layout
        )

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x, out = self.inputs[0], self.outputs[0]
        plan = plan_reshape(impl.ctx, x.shape, out.shape)
        laid = impl.apply_layout_change(
            lowering.tensors[x], x.shape, plan.in_layout, plan.in_work
        )
        new_local = impl.ctx.local_shape(out.shape, plan.out_work)
        laid = impl.slicewise(lambda s: tf.reshape(s, new_local), laid)
        laid = impl.apply_layout_change(laid, out.shape, plan.out_work, plan.out_layout)
        lowering.set_tensor_lowering(out, laid)

    def attrs(self) -> dict[str, Any]:
        return {"new_shape": str(self.outputs[0].shape)}


def reshape(x: Tensor, new_shape: Any, name: str | None = None) -> Tensor:
    """Reshapes ``x`` (row-major order) to ``new_shape``; works under any layouts
    of input and output, communicating only where the layouts require it.

    >>> # [batch, seq, d_model] -> [batch, seq, heads, d_head]
    >>> # y = mtf.reshape(x, "batch:8,seq:16,heads:4,d_head:32")
    """
    if not isinstance(x, Tensor):
        raise ShapeError(f"reshape: {x!r} is not an mtf.Tensor")
    new_shape = convert_to_shape(new_shape)
    if new_shape == x.shape:
        return x
    return Reshape(x, new_shape, name).outputs[0]


def rename_dimension(
    x: Tensor, old_name: str, new_name: str, name: str | None = None
) -> Tensor:
    """Renames dimension ``old_name`` of ``x`` to ``new_name`` (a reshape, so a
    layout change when the two names map to different mesh axes)."""
    check_tensor(x, "rename_dimension:")
    if old_name not in x.shape.dimension_names:
        raise ShapeError(
            f"rename_dimension: {x.name} [{x.shape}] has no dimension {old_name!r}; "
            f"expected one of {x.shape.dimension_names}"
        )
    if new_name != old_name and new_name in x.shape.dimension_names:
        raise ShapeError(
            f"rename_dimension: {x.name} [{x.shape}] already has a dimension "
            f"{new_name!r}"
        )
    return reshape(x, x.shape.rename_dimension(old_name, new_name), name=name)


def _dim_list(v: Any, what: str) -> list[Dimension]:
    if isinstance(v, (Dimension, str)) or (
        isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], int)
    ):
        v = [v]
    if isinstance(v, Shape):
        v = list(v.dims)
    if not isinstance(v, (list, tuple)):
        raise ShapeError(
            f"replace_dimensions: {what} {v!r} is not a Dimension or list of them"
        )
    out = []
    for d in v:
        cd = convert_to_dimension(d)
        if cd is None:
            raise ShapeError(f"replace_dimensions: {what} contains None")
        out.append(cd)
    return out


def replace_dimensions(
    tensor_or_shape: Tensor | Shape | Any, old_dim_or_dims: Any, new_dim_or_dims: Any
) -> Any:
    """Replaces consecutive dims ``old_dim_or_dims`` by ``new_dim_or_dims``.

    On a Shape it returns the new Shape; on a Tensor, the reshaped tensor.
    """
    if isinstance(tensor_or_shape, Tensor):
        t = tensor_or_shape
        return reshape(t, replace_dimensions(t.shape, old_dim_or_dims, new_dim_or_dims))
    shape = convert_to_shape(tensor_or_shape)
    old = _dim_list(old_dim_or_dims, "old_dim_or_dims")
    new = _dim_list(new_dim_or_dims, "new_dim_or_dims")
    if not old:
        raise ShapeError("replace_dimensions: old_dim_or_dims is empty")
    dims = list(shape.dims)
    try:
        positions = [dims.index(d) for d in old]
    except ValueError:
        positions = []
    pos = positions[0] if positions else -1
    if not positions or positions != list(range(pos, pos + len(old))):
        raise ShapeError(
            f"replace_dimensions: [{', '.join(map(str, old))}] is not a run of "
            f"consecutive dimensions of [{shape}]"
        )
    return Shape(dims[:pos] + new + dims[pos + len(old) :])


def anonymous_shape(shape: Any) -> Shape:
    """``shape`` with its dims renamed ``_anonymous_0``, ``_anonymous_1``, ...:
    names no layout rule mentions, so a tensor of it is replicated."""
    return Shape(
        [
            Dimension(f"_anonymous_{i}", d.size)
            for i, d in enumerate(convert_to_shape(shape))
        ]
    )


def is_anonymous(shape: Any) -> bool:
    """Whether every dim of ``shape`` is named as :func:`anonymous_shape` names it."""
    return all(
        d.name == f"_anonymous_{i}" for i, d in enumerate(convert_to_shape(shape))
    )


def anonymize(x: Tensor) -> Tensor:
    """``x`` reshaped to :func:`anonymous_shape`, i.e. gathered whole on every
    device (what a split tensor costs to replicate)."""
    return reshape(x, anonymous_shape(x.shape), name="anonymize")
