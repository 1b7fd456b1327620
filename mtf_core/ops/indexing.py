"""Indexing ops: ``one_hot``, ``range``, ``gather``, ``top_k``/``argmax`` and
``cumsum``.

How each lowers when the dimension it indexes is split over mesh axis ``m``
(``n`` devices along ``m``, each holding ``k = size / n`` positions):

* ``one_hot`` / ``range``: device ``c`` builds its own block ``[c*k, (c+1)*k)``
  from its mesh coordinate; no communication.
* ``gather``: each device looks up the ids in its own block, zeroes the rest,
  and the partial results are summed over ``m`` (a pending allreduce, like
  einsum's, so sums of lookups reduce once).
* ``top_k`` / ``argmax``: each device takes its local top k (values and global
  indices), the ``n * k`` candidates are allconcatenated over ``m`` and the top
  k of those is the answer.  Ties resolve to the lowest index, as on one device.
* ``cumsum``: a local cumsum plus the sum of the blocks before (after, when
  reversed) this device's, from an allconcat of the ``n`` block totals.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import DTypeError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor, check_same_mesh
from mtf_core.lowering.lazy import LazyAllreduceSum
from mtf_core.shapes import Dimension, Shape, convert_to_dimension

_brange = builtins.range


def _as_dim(dim: Any, what: str) -> Dimension:
    if isinstance(dim, str) and ":" not in dim:
        raise ShapeError(
            f"{what}: dimension {dim!r} has no size; expected a Dimension or 'name:size'"
        )
    d = convert_to_dimension(dim)
    if d is None:
        raise ShapeError(f"{what}: dimension is None; expected a Dimension")
    return d


def _dim_of(x: Tensor, dim: Any, what: str) -> Dimension:
    """The dimension of ``x`` named by ``dim`` (a name or a Dimension)."""
    name = dim if isinstance(dim, str) and ":" not in dim else _as_dim(dim, what).name
    if name not in x.shape.dimension_names:
        raise ShapeError(
            f"{what}: {x.name} [{x.shape}] has no dimension {name!r}; expected one of "
            f"{x.shape.dimension_names}"
        )
    d = x.shape.get_dim_by_name(name)
    if not isinstance(dim, str) or ":" in dim:
        given = _as_dim(dim, what)
        if given.size != d.size:
            raise ShapeError(
                f"{what}: dimension {given} does not match {d} of {x.name} [{x.shape}]"
            )
    return d


def _wide_ids(tf: Any, i: Any) -> Any:
    """Ids as int32/int64 (what tf.one_hot and tf.gather take)."""
    return i if i.dtype in (tf.int32, tf.int64) else tf.cast(i, tf.int32)


def _split_axis(ctx: LayoutContext, name: str) -> int | None:
    """Mesh axis (of size > 1) splitting dimension ``name``, or None."""
    return ctx.effective_mesh_axis(name)


# --------------------------------------------------------------------------
# one_hot
# --------------------------------------------------------------------------


class OneHot(Operation):
    """``one_hot(indices, output_dim)``: ``indices.shape + [output_dim]``."""

    op_type = "OneHot"

    def __init__(
        self,
        indices: Tensor,
        output_dim: Dimension,
        on_value: float,
        off_value: float,
        dtype: Any,
        name: str | None = None,
    ) -> None:
        if indices.dtype not in dtypes.INTEGER:
            raise DTypeError(
                f"one_hot: indices {indices.name} have dtype {indices.dtype}; "
                "expected an integer dtype such as int32"
            )
        if output_dim.name in indices.shape.dimension_names:
            raise ShapeError(
                f"one_hot: output dimension {output_dim} is already a dimension of "
                f"{indices.name} [{indices.shape}]; give it another name"
            )
        super().__init__([indices], name=name or "one_hot")
        self.output_dim = output_dim
        self.on_value = float(on_value)
        self.off_value = float(off_value)
        self._add_output(indices.shape + [output_dim], dtypes.as_dtype_name(dtype))

    @property
    def has_gradient(self) -> bool:
        return False

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [None]

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        out = self.outputs[0]
        k = impl.slice_shape(out.shape)[-1]
        dt = out.dtype
        on, off = tf.cast(self.on_value, dt), tf.cast(self.off_value, dt)
        ids = lowering.tensors[self.inputs[0]]
        m = _split_axis(impl.ctx, self.output_dim.name)

        def local(i: Any, c: Any) -> Any:
            # Ids outside this device's block [c*k, (c+1)*k) become off values.
            i = _wide_ids(tf, i)
            return tf.one_hot(i - tf.cast(c * k, i.dtype), k, on, off, dtype=dt)

        coord = 0 if m is None else impl.laid_out_pcoordinate(m)
        res = impl.slicewise(local, ids, coord)
        lowering.set_tensor_lowering(out, res)

    def attrs(self) -> dict[str, Any]:
        return {
            "output_dim": str(self.output_dim),
            "on_value": self.on_value,
            "off_value": self.off_value,
            "dtype": self.outputs[0].dtype,
        }


def one_hot(
    indices: Tensor,
    output_dim: Any,
    on_value: float = 1.0,
    off_value: float = 0.0,
    dtype: Any = "float32",
    name: str | None = None,
) -> Tensor:
    """One-hot encoding along a new dimension ``output_dim``.

    Ids outside ``[0, output_dim.size)`` give a row of ``off_value``.

    >>> # labels [batch] int32 -> [batch, classes] float32
    >>> # onehot = mtf.one_hot(labels, classes_dim, dtype=mtf.float32)
    """
    return OneHot(
        indices, _as_dim(output_dim, "one_hot"), on_value, off_value, dtype, name
    ).outputs[0]


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

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        out = self.outputs[0]
        (k,) = impl.slice_shape(out.shape)
        dt = out.dtype
        m = _split_axis(impl.ctx, self.dim.name)
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
    if not isinstance(mesh, Mesh):
        raise ShapeError(f"range: {mesh!r} is not an mtf.Mesh")
    return Range(mesh, _as_dim(dim, "range"), dtype, name).outputs[0]


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
        if indices.dtype not in dtypes.INTEGER:
            raise DTypeError(
                f"gather: indices {indices.name} have dtype {indices.dtype}; expected "
                "an integer dtype such as int32"
            )
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
        from mtf_core.ops.einsum import einsum

        dy = grad_ys[0]
        if dy is None:
            return [None, None]
        weights, indices = self.inputs
        hot = one_hot(indices, self.dim, dtype=weights.dtype)
        return [einsum([hot, dy], output_shape=weights.shape), None]

    def _check(self, ctx: Any) -> int | None:
        ctx.check_op_dims(f"Gather {self.name}", sorted(self.all_dim_names))
        return _split_axis(ctx, self.dim.name)

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        m = self._check(ctx)
        if m is None:
            return []
        out = self.outputs[0]
        return [
            CollectiveSpec(
                "allreduce",
                (ctx.axis_name(m),),
                ctx.slice_bytes(out.shape, out.dtype),
                pending=True,
            )
        ]

    def lower(self, lowering: Any) -> None:
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
            w = _maybe_transpose(tf, w, w_perm)
            i = _wide_ids(tf, _maybe_transpose(tf, i, i_perm))
            ids = i - tf.cast(c * kv, i.dtype)
            valid = tf.logical_and(ids >= 0, ids < kv)
            g = tf.gather(
                w, tf.where(valid, ids, tf.zeros_like(ids)), axis=nb, batch_dims=nb
            )
            mask = tf.reshape(valid, valid.shape.as_list() + [1] * len(w_rest))
            g = tf.where(mask, g, tf.zeros_like(g))
            return _maybe_transpose(tf, g, o_perm)

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


def _maybe_transpose(tf: Any, x: Any, perm: list[int]) -> Any:
    return x if perm == list(_brange(len(perm))) else tf.transpose(x, perm)


def gather(
    weights: Tensor, indices: Tensor, dim: Any, name: str | None = None
) -> Tensor:
    """Embedding lookup: ``weights`` rows along ``dim`` picked by ``indices``.

    >>> # emb [vocab, d_model], ids [batch, seq] -> [batch, seq, d_model]
    >>> # x = mtf.gather(emb, ids, vocab_dim)
    """
    return Gather(weights, indices, _dim_of(weights, dim, "gather"), name).outputs[0]


# --------------------------------------------------------------------------
# top_k / argmax
# --------------------------------------------------------------------------


class TopK(Operation):
    """``top_k(x, reduced_dim, k_dim)``: the ``k`` largest values along
    ``reduced_dim`` (descending) and their indices (int32).

    The outputs have ``k_dim`` where ``x`` had ``reduced_dim``; with
    ``k_dim=None`` (``argmax``) k is 1 and the dimension is dropped.
    """

    op_type = "TopK"

    def __init__(
        self,
        x: Tensor,
        reduced_dim: Dimension,
        k_dim: Dimension | None,
        name: str | None = None,
    ) -> None:
        if k_dim is not None:
            if k_dim.name in x.shape.dimension_names:
                raise ShapeError(
                    f"top_k: k_dim {k_dim} is already a dimension of {x.name} "
                    f"[{x.shape}]; give it a new name"
                )
            if k_dim.size > reduced_dim.size:
                raise ShapeError(
                    f"top_k: k_dim {k_dim} is larger than reduced_dim {reduced_dim}"
                )
        super().__init__([x], name=name or ("top_k" if k_dim else "argmax"))
        self.reduced_dim = reduced_dim
        self.k_dim = k_dim
        dims = list(x.shape.dims)
        pos = x.shape.index(reduced_dim.name)
        if k_dim is None:
            del dims[pos]
        else:
            dims[pos] = k_dim
        self._add_output(Shape(dims), x.dtype)
        self._add_output(Shape(dims), "int32")

    @property
    def k(self) -> int:
        return 1 if self.k_dim is None else self.k_dim.size

    def flops(self) -> float:
        return float(self.inputs[0].size)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        from mtf_core.ops.einsum import einsum

        dv = grad_ys[0]
        if dv is None:
            return [None]
        x = self.inputs[0]
        hot = one_hot(self.outputs[1], self.reduced_dim, dtype=dv.dtype)
        return [einsum([hot, dv], output_shape=x.shape)]

    def _plan(self, ctx: Any) -> tuple[int | None, bool]:
        """(mesh axis splitting reduced_dim, whether to gather it whole first:
        when a device holds fewer than k candidates)."""
        m = _split_axis(ctx, self.reduced_dim.name)
        if m is None:
            return None, False
        return m, self.reduced_dim.size // ctx.mesh_shape[m].size < self.k

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        from mtf_core.ops.reshape import gather_collectives

        m, whole = self._plan(ctx)
        x = self.inputs[0]
        if m is None:
            return []
        if whole:
            return gather_collectives(ctx, x, [self.reduced_dim.name])
        per_pos = ctx.slice_size(x.shape) // (
            self.reduced_dim.size // ctx.mesh_shape[m].size
        )
        axis = (ctx.axis_name(m),)
        return [
            CollectiveSpec(
                "allconcat", axis, per_pos * self.k * dtypes.size_bytes(x.dtype)
            ),
            CollectiveSpec("allconcat", axis, per_pos * self.k * 4),
        ]

    def lower(self, lowering: Any) -> None:
        from mtf_core.ops.reshape import lower_gathered, lower_resplit

        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        names = x.shape.dimension_names
        r = names.index(self.reduced_dim.name)
        to_last = [i for i in _brange(len(names)) if i != r] + [r]
        k = self.k
        m, whole = self._plan(impl.ctx)
        laid = lowering.tensors[x]
        if whole:
            laid = lower_gathered(impl, laid, x.shape, [self.reduced_dim.name])
        kl = (
            self.reduced_dim.size
            if whole or m is None
            else (self.reduced_dim.size // impl.shape[m].size)
        )

        def local(s: Any, c: Any) -> tuple[Any, Any]:
            v, i = tf.math.top_k(_maybe_transpose(tf, s, to_last), k)
            return v, i + c * kl

        coord = 0 if m is None or whole else impl.laid_out_pcoordinate(m)
        vals, idx = impl.slicewise_multi(local, 2, laid, coord)
        if m is not None and not whole:
            # n*k candidates, in device order; top_k is stable, so ties still
            # resolve to the lowest index.
            last = len(names) - 1
            vals = impl.allconcat(vals, m, last)
            idx = impl.allconcat(idx, m, last)

            def merge(v: Any, i: Any) -> tuple[Any, Any]:
                v2, pos = tf.math.top_k(v, k)
                return v2, tf.gather(i, pos, batch_dims=last)

            vals, idx = impl.slicewise_multi(merge, 2, vals, idx)
        back = (
            (lambda s: tf.squeeze(s, -1))
            if self.k_dim is None
            else (lambda s: _maybe_transpose(tf, s, _inverse(to_last)))
        )
        kname = [] if self.k_dim is None else [self.k_dim.name]
        for t, v in zip(self.outputs, (vals, idx)):
            v = impl.slicewise(back, v)
            lowering.set_tensor_lowering(t, lower_resplit(impl, v, t.shape, kname))

    def attrs(self) -> dict[str, Any]:
        return {
            "reduced_dim": str(self.reduced_dim),
            "k_dim": None if self.k_dim is None else str(self.k_dim),
        }


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def top_k(
    x: Tensor, reduced_dim: Any, k_dim: Any, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """The ``k_dim.size`` largest values of ``x`` along ``reduced_dim`` and their
    int32 indices; both have ``k_dim`` in place of ``reduced_dim``."""
    op = TopK(x, _dim_of(x, reduced_dim, "top_k"), _as_dim(k_dim, "top_k"), name)
    return op.outputs[0], op.outputs[1]


def argmax(x: Tensor, reduced_dim: Any, name: str | None = None) -> Tensor:
    """int32 index of the largest value along ``reduced_dim`` (the first one on
    ties), with ``reduced_dim`` dropped."""
    return TopK(x, _dim_of(x, reduced_dim, "argmax"), None, name).outputs[1]


# --------------------------------------------------------------------------
# cumsum
# --------------------------------------------------------------------------


class Cumsum(Operation):
    """``cumsum(x, dim, exclusive)`` (``reverse`` sums from the end)."""

    op_type = "Cumsum"

    def __init__(
        self,
        x: Tensor,
        dim: Dimension,
        exclusive: bool,
        reverse: bool,
        name: str | None = None,
    ) -> None:
        super().__init__([x], name=name or "cumsum")
        self.dim = dim
        self.exclusive = exclusive
        self.reverse = reverse
        self._add_output(x.shape, x.dtype)

    def flops(self) -> float:
        return float(self.inputs[0].size)

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        return [cumsum(dy, self.dim, self.exclusive, reverse=not self.reverse)]

    def communication(self, ctx: Any) -> list[CollectiveSpec]:
        m = _split_axis(ctx, self.dim.name)
        if m is None:
            return []
        x = self.inputs[0]
        k = self.dim.size // ctx.mesh_shape[m].size
        return [
            CollectiveSpec(
                "allconcat", (ctx.axis_name(m),), ctx.slice_bytes(x.shape, x.dtype) // k
            )
        ]

    def lower(self, lowering: Any) -> None:
        tf = lowering.tf
        impl = lowering.mesh_impl(self)
        x = self.inputs[0]
        axis = x.shape.index(self.dim.name)
        ex, rev = self.exclusive, self.reverse
        laid = lowering.tensors[x]
        res = impl.slicewise(
            lambda s: tf.cumsum(s, axis, exclusive=ex, reverse=rev), laid
        )
        m = _split_axis(impl.ctx, self.dim.name)
        if m is not None:
            n = impl.shape[m].size
            totals = impl.slicewise(
                lambda s: tf.reduce_sum(s, axis, keepdims=True), laid
            )
            totals = impl.allconcat(totals, m, axis)
            bshape = [1] * len(x.shape)
            bshape[axis] = n

            def add_blocks_before(s: Any, t: Any, c: Any) -> Any:
                j = tf.range(n)
                before = j > c if rev else j < c
                w = tf.reshape(tf.cast(before, s.dtype), bshape)
                return s + tf.reduce_sum(t * w, axis, keepdims=True)

            res = impl.slicewise(
                add_blocks_before, res, totals, impl.laid_out_pcoordinate(m)
            )
        lowering.set_tensor_lowering(self.outputs[0], res)

    def attrs(self) -> dict[str, Any]:
        return {
            "dim": self.dim.name,
            "exclusive": self.exclusive,
            "reverse": self.reverse,
        }


def cumsum(
    x: Tensor,
    dim: Any,
    exclusive: bool = False,
    reverse: bool = False,
    name: str | None = None,
) -> Tensor:
    """Cumulative sum of ``x`` along ``dim`` (``exclusive``: without the current
    element; ``reverse``: from the end)."""
    return Cumsum(
        x, _dim_of(x, dim, "cumsum"), bool(exclusive), bool(reverse), name
    ).outputs[0]
