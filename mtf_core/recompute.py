"""Recomputing a block that creates its own weights (activation checkpointing).

The model builders' whole-block recomputation (the planner's ``block``
option).  :func:`recompute_block` runs the block once as it is (creating its
variables and the forward ops), records the weight tensors the block read
from ``get_variable``, and wraps the forward outputs in one custom-gradient op
whose inputs are the block's input and those weights.  The backward pass runs
the block again on fresh copies, with ``get_variable`` handing the recorded
weights back by name (:mod:`mtf_core.weight_handoff`), and differentiates that
copy.  So nothing the block computes is held from the forward to the backward
pass: its forward activations die inside the forward, at the cost of running
the block's forward twice (its flops and collectives are in the graph twice,
where the cost model counts them).

Randomness inside a recomputed block would draw new numbers the second time;
blocks with dropout are refused by the model builders.

:func:`mtf_core.autodiff.recompute_grad` (Mesh TF's) takes such blocks too,
dropout included: it copies the forward operations instead of running the
code again.  The builders keep this function, whose graphs (fresh copies of
the weights, read by name) the planner's tables and tests are built on.
"""

from __future__ import annotations

from collections.abc import Callable

from mtf_core.autodiff import CustomGradientOp, gradients, zero_filled
from mtf_core.errors import GraphError
from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.weight_handoff import provided_variables, recorded_weights


def recompute_block(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``fn(x)``, whose activations are recomputed in the backward pass.

    >>> import mtf_core as mtf
    >>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
    >>> x = mtf.placeholder(m, "b:2,d:4")
    >>> y = recompute_block(lambda t: mtf.layers.dense(t, "h:3", name="w"), x)
    >>> y.operation.op_type, [v.name for v in g.all_variables]
    ('CustomGradient', ['w_kernel', 'w_bias'])
    """
    graph = x.graph
    with recorded_weights(graph) as frame:
        out = fn(x)
    if not isinstance(out, Tensor):
        raise GraphError(f"recompute_block: fn returned {out!r}; expected a Tensor")
    names = sorted(frame)
    weights = [frame[n] for n in names]

    def grad_fn(
        ins: list[Tensor], outs: list[Tensor], gys: list[Tensor | None], needed: object
    ) -> list[Tensor | None]:
        grads = zero_filled(gys, outs)
        start = len(graph.operations)
        fresh = [ew.identity(t) for t in ins]
        with provided_variables(graph, dict(zip(names, fresh[1:]))):
            again = fn(fresh[0])
        # Only the copy made here can lie between ``fresh`` and ``again``:
        # differentiating through it alone gives the same ops as through the
        # whole graph, without walking every op of the graph once per block.
        return gradients([again], fresh, grads, operations=graph.operations[start:])

    op = CustomGradientOp([out], [x, *weights], grad_fn, name="recompute")
    return op.outputs[0]
