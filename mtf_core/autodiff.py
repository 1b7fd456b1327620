"""Reverse-mode autodiff in the mtf graph itself.

Gradients are mtf ops, so they lower like everything else: the backend never
needs TensorFlow gradients of collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mtf_core.errors import GraphError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops.creation import ones, zeros_like
from mtf_core.ops.variables import Variable
from mtf_core.seams import LoweringContext


def _as_tensor(x: Any) -> Tensor:
    if isinstance(x, Variable):
        return x.outputs[0]
    if not isinstance(x, Tensor):
        raise GraphError(f"gradients: {x!r} is not an mtf Tensor or Variable")
    return x


def gradients(
    ys: Sequence[Tensor] | Tensor,
    xs: Sequence[Any],
    grad_ys: Sequence[Tensor | None] | None = None,
) -> list[Tensor | None]:
    """d(sum of ys)/d(xs): one tensor (or None if unconnected) per x.

    >>> # dw = mtf.gradients([loss], [w])[0]
    """
    if isinstance(ys, Tensor):
        ys = [ys]
    for name, arg in (("ys", ys), ("xs", xs)):
        if isinstance(arg, str) or not isinstance(arg, Iterable):
            raise GraphError(
                f"gradients: {name} is {arg!r}; expected a list of mtf.Tensors"
            )
    ys = [_as_tensor(y) for y in ys]
    xs = [_as_tensor(x) for x in xs]
    if not ys:
        raise GraphError("gradients needs at least one y")
    graph = ys[0].graph
    for t in [*ys, *xs]:
        if t.graph is not graph:  # its gradient would be None, unasked
            raise GraphError(
                f"gradients: {t.name} belongs to another graph than "
                f"{ys[0].name}; ys and xs must be tensors of one graph"
            )
    ops = list(graph.operations)
    # tensors downstream of xs
    downstream: set[Tensor] = set(xs)
    for op in ops:
        if any(t in downstream for t in op.inputs):
            downstream.update(op.outputs)
    # ops upstream of ys
    upstream_ops: set[Operation] = set()
    stack = [y.operation for y in ys]
    while stack:
        op = stack.pop()
        if op in upstream_ops:
            continue
        upstream_ops.add(op)
        stack.extend(t.operation for t in op.inputs)
    grads: dict[Tensor, list[Tensor]] = {}
    for i, y in enumerate(ys):
        g = grad_ys[i] if grad_ys is not None else None
        grads.setdefault(y, []).append(
            g if g is not None else ones(y.mesh, y.shape, y.dtype)
        )
    for op in reversed(ops):
        if op not in upstream_ops or not any(t in downstream for t in op.outputs):
            continue
        out_grads = [_sum(grads.get(t)) for t in op.outputs]
        if all(g is None for g in out_grads):
            continue
        if not any(t in downstream for t in op.inputs):
            continue
        in_grads = op.gradient(out_grads)
        for t, g in zip(op.inputs, in_grads):
            if g is None or t not in downstream:
                continue
            grads.setdefault(t, []).append(g)
    return [_sum(grads.get(x)) for x in xs]


def _sum(gs: list[Tensor] | None) -> Tensor | None:
    if not gs:
        return None
    if len(gs) == 1:
        return gs[0]
    total: Tensor = ew.add_n(gs)
    return total


class CustomGradientOp(Operation):
    """Wraps a forward subgraph whose gradient is given by the user.

    Its inputs are ``inputs`` then ``fn_outputs``; it forwards the latter as
    its outputs, and its gradient is ``grad_fn(inputs, fn_outputs, grads)``.
    """

    op_type = "CustomGradient"

    def __init__(
        self,
        fn_outputs: list[Tensor],
        inputs: list[Tensor],
        grad_fn: Callable[..., Any],
        name: str | None = None,
    ) -> None:
        super().__init__(inputs + fn_outputs, name=name or "custom_gradient")
        self._n_in = len(inputs)
        self.grad_fn = grad_fn
        for t in fn_outputs:
            self._add_output(t.shape, t.dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        ins = self.inputs[: self._n_in]
        outs = self.inputs[self._n_in :]
        gys = [g if g is not None else zeros_like(o) for g, o in zip(grad_ys, outs)]
        gxs = list(self.grad_fn(ins, outs, gys))
        return gxs + [None] * len(outs)

    def lower(self, lowering: LoweringContext) -> None:
        # Reading a pending sum forces it, as the cost model assumes of every
        # reader but identity/add/add_n (cost_models/deferred.py).
        for src, dst in zip(self.inputs[self._n_in :], self.outputs):
            lowering.set_tensor_lowering(dst, lowering.tensors[src])


def custom_gradient(
    fn: Callable[..., Any], grad_fn: Callable[..., Any], inputs: Sequence[Tensor]
) -> list[Tensor]:
    """Runs ``fn(*inputs)``; its gradient is ``grad_fn(inputs, outputs, grad_outputs)``
    (returning one gradient per input) instead of autodiff through ``fn``."""
    inputs = list(inputs)
    outs = fn(*inputs)
    single = isinstance(outs, Tensor)
    outs = [outs] if single else list(outs)
    op = CustomGradientOp(outs, inputs, grad_fn)
    return op.outputs[0] if single else op.outputs  # type: ignore[return-value]


def recompute_grad(fn: Callable[..., Any], inputs: Sequence[Tensor]) -> Any:
    """Runs ``fn`` and, in the backward pass, runs it again instead of keeping
    its activations (trading compute for memory).

    ``fn`` must depend only on ``inputs`` (pass weights' value tensors in as
    inputs) and must not create variables: it is called a second time.
    """
    inputs = list(inputs)
    graph = inputs[0].graph
    n_vars = len(graph.all_variables)

    def grad_fn(
        ins: list[Tensor], outs: list[Tensor], gys: list[Tensor]
    ) -> list[Tensor | None]:
        fresh = [ew.identity(x) for x in ins]
        recomputed = fn(*fresh)
        recomputed = (
            [recomputed] if isinstance(recomputed, Tensor) else list(recomputed)
        )
        return gradients(recomputed, fresh, gys)

    out = custom_gradient(fn, grad_fn, inputs)
    if len(graph.all_variables) != n_vars:
        raise GraphError(
            "recompute_grad: fn created variables; create them outside and pass "
            "their value tensors as inputs"
        )
    return out
