"""Indexing ops: ``range`` and ``gather`` (``one_hot`` lives in
:mod:`mtf_core.ops.one_hot`, ``top_k``/``argmax`` in :mod:`mtf_core.ops.top_k`,
``cumsum`` in :mod:`mtf_core.ops.cumsum`; all are re-exported here).

How each lowers when the dimension it indexes is split over mesh axis ``m``
(``n`` devices along ``m``, each holding ``k = size / n`` positions):

* ``one_hot`` / ``range``: device ``c`` builds its own block ``[c*k, (c+1)*k)``
  from its mesh coordinate; no communication.
* ``gather``: each device looks up the ids in its own block, zeroes the rest,
  and the partial results are summed over ``m`` (a pending allreduce, like
  einsum's, so sums of lookups reduce once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext, allreduce_collectives
from mtf_core.errors import ShapeError
from mtf_core.graph import Mesh, Operation, Tensor, check_same_mesh
from mtf_core.lazy_sum import LazyAllreduceSum
from mtf_core.ops._local import masked_gather, maybe_transpose
from mtf_core.ops.arguments import check_mesh, dim_of, sized_dim

# Re-exported: these were defined here first.
from mtf_core.ops.cumsum import Cumsum as Cumsum
from mtf_core.ops.cumsum import cumsum as cumsum
from mtf_core.ops.einsum import einsum
from mtf_core.ops.one_hot import OneHot as OneHot
from mtf_core.ops.one_hot import check_indices
from mtf_core.ops.one_hot import one_hot as one_hot
from mtf_core.ops.top_k import TopK as TopK
from mtf_core.ops.top_k import argmax as argmax
from mtf_core.ops.top_k import top_k as top_k
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Dimension, convert_to_shape

# --------------------------------------------------------------------------
# range
# --------------------------------------------------------------------------


class Range(Operation):
    """``range(mesh, dim)``: the values ``0 .. dim.size - 1`` along ``dim``."""

    op_type = "Range"

    def __init__(
        self, mesh: Mesh, dim: Dimension, dtype: Any, name: str | None = None
    ) -> None:
        super().__init__([], mesh=mesh, name=name or "range")
        self.dim = dim
        self._add_output([dim], dtypes.as_dtype_name(dtype))

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return []

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        out = self.outputs[0]
        (k,) = impl.slice_shape(out.shape)
        dt = out.dtype
        m = impl.ctx.effective_mesh_axis(self.dim.name)
        if m is None:
            res = impl.slicewise(lambda: tf.cast(tf.range(k), dt))
        else:
            res = impl.slicewise(
                lambda c: tf.cast(tf.range(k) + c * k, dt),
                impl.laid_out_pcoordinate(m),
            )
        lowering.set_tensor_lowering(out, res)

    def attrs(self) -> dict[str, Any]:
        return {"dim": str(self.dim), "dtype": self.outputs[0].dtype}


def mtf_range(
    mesh: Mesh, dim: Any, dtype: Any = "int32", name: str | None = None
) -> Tensor:
    """``mtf.range``: a 1-D tensor ``[dim]`` holding ``0, 1, ..., dim.size - 1``.

    Each device makes its own piece from its mesh coordinate (no communication).
    """
    mesh = check_mesh(mesh, "range")
    return Range(mesh, sized_dim(dim, "range"), dtype, name).outputs[0]


# --------------------------------------------------------------------------
# gather
# --------------------------------------------------------------------------


class Gather(Operation):
    """``gather(weights, indices, dim)``: rows of ``weights`` along ``dim``.

    Output: ``indices.shape`` then the dims of ``weights`` other than ``dim``
    and those shared with ``indices`` (shared dims act as batch dims).  Ids
    outside ``[0, dim.size)`` give zeros, as Mesh TensorFlow's one-hot einsum.
    """

    op_type = "Gather"

    def __init__(
        self, weights: Tensor, indices: Tensor, dim: Dimension, name: str | None = None
    ) -> None:
        check_same_mesh([weights, indices])
        check_indices(indices, "gather")
        if dim.name in indices.shape.dimension_names:
            raise ShapeError(
                f"gather: indices {indices.name} [{indices.shape}] must not have the "
                f"gathered dimension {dim.name!r}"
            )
        for d in indices.shape:
            if d.name in weights.shape.dimension_names and d not in weights.shape.dims:
                raise ShapeError(
                    f"gather: dimension {d} of {indices.name} has another size in "
                    f"{weights.name} [{weights.shape}]"
                )
        super().__init__([weights, indices], name=name or "gather")
        self.dim = dim
        rest = [
            d
            for d in weights.shape
            if d.name != dim.name and d.name not in indices.shape.dimension_names
        ]
        self._add_output(indices.shape + rest, weights.dtype)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None, None]
        weights, indices = self.inputs
        hot = one_hot(indices, self.dim, dtype=weights.dtype)
        return [einsum([hot, dy], output_shape=weights.shape), None]

    def _check(self, ctx: LayoutContext) -> int | None:
        ctx.check_op(self)
        return ctx.effective_mesh_axis(self.dim.name)

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        m = self._check(ctx)
        out = self.outputs[0]
        return allreduce_collectives(
            ctx, out.shape, out.dtype, [] if m is None else [m]
        )

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        m = self._check(impl.ctx)
        weights, indices = self.inputs
        out = self.outputs[0]
        w_names = weights.shape.dimension_names
        i_names = indices.shape.dimension_names
        batch = [n for n in i_names if n in w_names]
        w_rest = [n for n in w_names if n != self.dim.name and n not in batch]
        i_rest = [n for n in i_names if n not in batch]
        w_perm = [w_names.index(n) for n in batch + [self.dim.name] + w_rest]
        i_perm = [i_names.index(n) for n in batch + i_rest]
        g_names = batch + i_rest + w_rest
        o_perm = [g_names.index(n) for n in out.shape.dimension_names]
        kv = impl.slice_shape(weights.shape)[w_names.index(self.dim.name)]
        nb = len(batch)

        def local(w: Any, i: Any, c: Any) -> Any:
            w = maybe_transpose(tf, w, w_perm)
            g = masked_gather(tf, w, maybe_transpose(tf, i, i_perm), c, kv, nb)
            return maybe_transpose(tf, g, o_perm)

        coord = 0 if m is None else impl.laid_out_pcoordinate(m)
        res = impl.slicewise(
            local, lowering.tensors[weights], lowering.tensors[indices], coord
        )
        if m is not None:
            # Each device found only the ids in its block; the sum over the
            # axis completes the lookup (pending, so sums of lookups fuse).
            res = LazyAllreduceSum(impl, res, [m], self)
        lowering.set_tensor_lowering(out, res)

    def attrs(self) -> dict[str, Any]:
        return {"dim": str(self.dim)}


def gather(
    weights: Tensor,
    indices: Any,
    dim: Any,
    output_shape: Any = None,
    name: str | None = None,
) -> Tensor:
    """Embedding lookup: ``weights`` rows along ``dim`` picked by ``indices``
    (a Tensor, or a Python int for one position).  ``output_shape``, as in
    Mesh TensorFlow, orders the result's dims.

    >>> # emb [vocab, d_model], ids [batch, seq] -> [batch, seq, d_model]
    >>> # x = mtf.gather(emb, ids, vocab_dim)
    """
    from mtf_core.ops.creation import constant
    from mtf_core.ops.reduce import broadcast

    if not isinstance(indices, Tensor):
        indices = constant(weights.mesh, indices, (), "int32")
    d = dim_of(weights, dim, "gather")
    if weights.dtype == "bool":
        from mtf_core.ops.elementwise import cast

        as_float = gather(cast(weights, "float32"), indices, d, output_shape, name)
        return cast(as_float, "bool")
    if d.name in indices.shape.dimension_names:
        # Positions along a dim named like the gathered one (Mesh TensorFlow
        # allows it): gather under a temporary name, then take the name back.
        from mtf_core.ops.reshape import rename_dimension

        tmp = f"_{d.name}_gathered"
        op = Gather(weights, rename_dimension(indices, d.name, tmp), d, name)
        out = rename_dimension(op.outputs[0], tmp, d.name)
    else:
        out = Gather(weights, indices, d, name).outputs[0]
    if output_shape is None:
        return out
    shape = convert_to_shape(output_shape)
    if shape == out.shape:
        return out
    if not set(out.shape.dimension_names) <= set(shape.dimension_names):
        raise ShapeError(
            f"gather: output_shape [{shape}] does not have the result's dims "
            f"[{out.shape}]"
        )
    # Other dims order the result; new ones broadcast it (as Mesh
    # TensorFlow's einsum-based gather does).
    return broadcast(out, shape)
