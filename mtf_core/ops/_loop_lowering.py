"""Lowering of :class:`mtf_core.ops.control.WhileLoop` to one ``tf.while_loop``.

The loop variables are every device's slices of every mtf loop variable (a
list per variable), plus an iteration counter that is mixed into the seed of
random ops in the body.  ``tf`` comes from ``lowering.tf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core.errors import LoweringError
from mtf_core.graph import Operation, Tensor


def _slices(laid: Any, what: str) -> list[Any]:
    laid = laid.to_laid_out_tensor()
    if not hasattr(laid, "slices"):
        raise LoweringError(
            f"{what}: while_loop lowers on the placement backend (per-device "
            f"slices); this mesh implementation gives {type(laid).__name__}"
        )
    return list(laid.slices)


def lower_while_loop(op: Any, lowering: Any) -> None:
    tf = lowering.tf
    impl = lowering.mesh_impl(op)
    n = op.num_loop_vars
    # Force captured pending sums here, outside the loop's graph, so no
    # tensor made inside the loop leaks out through a cached reduction.
    lowered_inputs = [lowering.tensors[t] for t in op.inputs]
    laid_type = type(lowered_inputs[0])
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
            lowering.tensors[t] = laid_type(list(v))
        counters = impl.counters
        quiet = key in traced  # count one iteration, as the planner prices it
        if quiet:
            impl.counters = type(counters)()
        try:
            for sub in ops:
                if sub.op_type == "LoopInput":
                    continue
                impl.current_op = sub
                sub.lower(lowering)
                if not quiet:
                    lowering._count_flops(sub, impl)
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
        lowering.set_tensor_lowering(t, laid_type(list(v)))
