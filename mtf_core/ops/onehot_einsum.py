"""Lowering an einsum with a ``one_hot`` input as a lookup (a lowering choice
only: same op, same values, same collectives).

``einsum([one_hot(ids, vocab), w])`` multiplies by a matrix that is almost all
zeros; ``ids`` already says which rows matter.  Two shapes are recognised:

* **gather** -- ``vocab`` is summed out and every other dim of either input is
  kept (an embedding lookup, ``[batch, length, vocab] x [vocab, d_model]``):
  each device takes the rows of its slice of ``w`` for the ids in its block of
  ``vocab`` and zeroes the rest.
* **segment sum** -- ``vocab`` is an output dim, the other input has every dim
  of ``ids`` and those are all summed out (the embedding gradient,
  ``[batch, length, vocab] x [batch, length, d_model] -> [vocab, d_model]``):
  each device adds the rows of its slice of ``w`` into the segments of its
  block of ``vocab`` (``tf.math.unsorted_segment_sum``).

Either way a device computes exactly what ``tf.einsum`` computes on its local
slices (its one-hot block is ``one_hot(ids - c*k, k)`` for coordinate ``c``
along the mesh axis splitting ``vocab`` and ``k`` rows per device), so the
pending allreduce over the axes splitting reduced dims is the plain path's.
Anything else (more inputs, on/off values other than 1/0, dims that would
need an extra sum) keeps the plain einsum.

Values: the same to float32 rounding (the segment sum adds in another order),
except that a non-finite entry of ``w`` in a row no id selects gives ``nan``
in the plain einsum (``0 * inf``) but is never read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtf_core import dtypes
from mtf_core.graph import Tensor
from mtf_core.ops._local import block_ids, masked_gather, maybe_transpose
from mtf_core.ops.one_hot import OneHot


@dataclass(frozen=True)
class OneHotEinsumPlan:
    """How to lower one einsum as a lookup (layout independent).

    ``kind`` is ``"gather"`` or ``"segment_sum"``; ``hot`` and ``other`` are
    the input positions of the one-hot tensor and of the other operand.
    ``other_perm`` orders the other operand's local slice for the TF op,
    ``ids_perm`` the ids' slice, ``out_perm`` maps the TF op's result to the
    einsum's output order; ``batch`` counts the leading dims shared by ids and
    the other operand (gather's ``batch_dims``), ``rest`` the trailing dims
    the TF op carries through.
    """

    kind: str
    hot: int
    other: int
    vocab: str
    other_perm: tuple[int, ...]
    ids_perm: tuple[int, ...]
    out_perm: tuple[int, ...]
    batch: int
    rest: int


def plan_onehot_einsum(
    inputs: list[Tensor], output_names: list[str]
) -> OneHotEinsumPlan | None:
    """The lookup plan for ``einsum(inputs) -> output_names``, or None when
    the plain einsum must be used."""
    if len(inputs) != 2:
        return None
    for hot in (0, 1):
        op = inputs[hot].operation
        if not isinstance(op, OneHot):
            continue
        if op.on_value != 1.0 or op.off_value != 0.0:
            continue
        if op.outputs[0].dtype not in dtypes.FLOATING:
            continue
        plan = _plan_for(hot, op, inputs[1 - hot], output_names)
        if plan is not None:
            return plan
    return None


def _plan_for(
    hot: int, op: OneHot, other: Tensor, out: list[str]
) -> OneHotEinsumPlan | None:
    vocab = op.output_dim.name
    ids = op.inputs[0].shape.dimension_names
    w = other.shape.dimension_names
    if vocab in w and vocab not in out:
        # gather: out == ids dims + w dims - vocab, as sets (nothing else summed)
        if set(out) != (set(ids) | set(w)) - {vocab}:
            return None
        batch = [n for n in ids if n in w]
        i_rest = [n for n in ids if n not in batch]
        w_rest = [n for n in w if n != vocab and n not in batch]
        g = batch + i_rest + w_rest
        return OneHotEinsumPlan(
            kind="gather",
            hot=hot,
            other=1 - hot,
            vocab=vocab,
            other_perm=tuple(w.index(n) for n in batch + [vocab] + w_rest),
            ids_perm=tuple(ids.index(n) for n in batch + i_rest),
            out_perm=tuple(g.index(n) for n in out),
            batch=len(batch),
            rest=len(w_rest),
        )
    if vocab in out and vocab not in w:
        # segment sum: every ids dim is in w and summed out; w's other dims kept
        if not set(ids) <= set(w) or set(out) != {vocab} | (set(w) - set(ids)):
            return None
        rest = [n for n in out if n != vocab]
        s = [vocab] + rest
        return OneHotEinsumPlan(
            kind="segment_sum",
            hot=hot,
            other=1 - hot,
            vocab=vocab,
            other_perm=tuple(w.index(n) for n in ids + rest),
            ids_perm=tuple(range(len(ids))),
            out_perm=tuple(s.index(n) for n in out),
            batch=0,
            rest=len(rest),
        )
    return None


def lower_onehot_einsum(
    plan: OneHotEinsumPlan, inputs: list[Tensor], lowering: Any, impl: Any
) -> Any:
    """The laid-out local results (before any allreduce) of the einsum whose
    inputs are ``inputs``, computed as ``plan`` says."""
    tf = lowering.tf
    hot_t = inputs[plan.hot]
    ids_t = hot_t.operation.inputs[0]
    k = impl.slice_shape(hot_t.shape)[-1]  # one_hot's dim is last
    m = impl.ctx.effective_mesh_axis(plan.vocab)
    coord = 0 if m is None else impl.laid_out_pcoordinate(m)
    fn = _local_gather if plan.kind == "gather" else _local_segment_sum
    return impl.slicewise(
        lambda w, i, c: fn(tf, plan, k, w, i, c),
        lowering.tensors[inputs[plan.other]],
        lowering.tensors[ids_t],
        coord,
    )


def _local_gather(
    tf: Any, plan: OneHotEinsumPlan, k: int, w: Any, i: Any, c: Any
) -> Any:
    w = maybe_transpose(tf, w, plan.other_perm)
    i = maybe_transpose(tf, i, plan.ids_perm)
    g = masked_gather(tf, w, i, c, k, plan.batch)
    return maybe_transpose(tf, g, plan.out_perm)


def _local_segment_sum(
    tf: Any, plan: OneHotEinsumPlan, k: int, w: Any, i: Any, c: Any
) -> Any:
    w = maybe_transpose(tf, w, plan.other_perm)
    n_ids = i.shape.rank
    rows = tf.reshape(w, [-1] + w.shape.as_list()[n_ids:])
    ids, valid = block_ids(tf, tf.reshape(i, [-1]), c, k)
    # unsorted_segment_sum drops negative ids (and rejects ids >= k).
    ids = tf.where(valid, ids, -tf.ones_like(ids))
    s = tf.math.unsorted_segment_sum(rows, ids, k)
    return maybe_transpose(tf, s, plan.out_perm)
