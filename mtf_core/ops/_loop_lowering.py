"""Lowering of :class:`mtf_core.ops.control.WhileLoop` to one ``tf.while_loop``.

The loop variables are every device's slices of every mtf loop variable (a
list per variable; in a traced SPMD step, the one replica's tensor), plus an
iteration counter that is mixed into the seed of random ops in the body.
``tf`` comes from ``lowering.tf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.errors import LoweringError
from mtf_core.graph import Operation, Tensor


def _slices(laid: Any, what: str) -> list[Any]:
    """The TF tensors of a laid-out value: every device's slice (placement,
    or an eager SPMD lowering), or the one replica's (a traced SPMD step)."""
    laid = laid.to_laid_out_tensor()
    if hasattr(laid, "slices"):
        return list(laid.slices)
    if hasattr(laid, "tensor"):
        return [laid.tensor]
    raise LoweringError(
        f"{what}: while_loop cannot loop over a {type(laid).__name__}; expected "
        "per-device slices or a replica's tensor"
    )


def _laid_out(like: Any, values: Sequence[Any]) -> Any:
    """``values`` (from :func:`_slices`) as a laid-out value of ``like``'s type."""
    if hasattr(like, "slices"):
        return type(like)(list(values))
    return type(like)(values[0])


def lower_while_loop(op: Any, lowering: Any) -> None:
    tf = lowering.tf
    impl = lowering.mesh_impl(op)
    n = op.num_loop_vars
    # Force captured pending sums here, outside the loop's graph, so no
    # tensor made inside the loop leaks out through a cached reduction.
    lowered_inputs = [lowering.tensors[t] for t in op.inputs]
    like = lowered_inputs[0].to_laid_out_tensor()
    init = [_slices(v, op.name) for v in lowered_inputs[:n]]
    for t in op.outputs[n:]:  # accumulators start at zero
        shape = impl.slice_shape(t.shape)
        init.append(
            _slices(impl.slicewise(lambda s=shape, d=t.dtype: tf.zeros(s, d)), op.name)
        )
    seed0 = lowering.seed
    traced: set[str] = set()

    def run(
        key: str,
        ops: Sequence[Operation],
        stand_ins: Sequence[Tensor],
        values: Sequence[Any],
    ) -> None:
        memo = dict(lowering.memo)  # constants made inside stay inside
        for t, v in zip(stand_ins, values):
            lowering.tensors[t] = _laid_out(like, v)
        counters = impl.counters
        quiet = key in traced  # count one iteration, as the planner prices it
        if quiet:
            impl.counters = type(counters)()
        try:
            for sub in ops:
                if sub.op_type == "LoopInput":
                    continue
                impl.current_op = sub
                sub.lower(lowering)  # flops: the loop op's own, counted once
        finally:
            impl.counters = counters
            impl.current_op = op
            lowering.memo = memo
        traced.add(key)

    def cond(i: Any, *values: Any) -> Any:
        run("cond", op.cond_operations, op._cond_inputs, values[:n])
        return _slices(lowering.tensors[op._cond_output], op.name)[0]

    def body(i: Any, *values: Any) -> Any:
        lowering.seed = tf.cast(seed0, tf.int64) * 1000003 + tf.cast(i, tf.int64)
        try:
            run("body", op.body_operations, op._body_inputs, values[:n])
            new = [_slices(lowering.tensors[t], op.name) for t in op._body_outputs]
        finally:
            lowering.seed = seed0
        for k in range(n, len(new)):
            new[k] = [a + b for a, b in zip(new[k], values[k])]
        return (i + 1, *new)

    result = tf.while_loop(
        cond, body, [tf.constant(0, tf.int32), *init], **op.tf_kwargs
    )
    for t, v in zip(op.outputs, result[1:]):
        lowering.set_tensor_lowering(t, _laid_out(like, v))
