"""Reverse-mode autodiff in the mtf graph itself.

Gradients are mtf ops, so they lower like everything else: the backend never
needs TensorFlow gradients of collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mtf_core import dtypes
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
    operations: Sequence[Operation] | None = None,
) -> list[Tensor | None]:
    """d(sum of ys)/d(xs): one tensor (or None if unconnected) per x.

    ``operations``: the operations to differentiate through, in graph order
    (Mesh TF's argument; default every operation of the graph), e.g. the
    copies :meth:`~mtf_core.graph.Graph.clone_operations` made.  Only those
    upstream of ``ys`` are walked, so one block's gradient in a large graph
    costs that block's ops.

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
    ops: list[Operation] | None = None
    if operations is not None:
        if isinstance(operations, Operation) or not isinstance(operations, Iterable):
            raise GraphError(
                f"gradients: operations is {operations!r}; expected a list of "
                "mtf Operations (or None for the whole graph)"
            )
        ops = list(operations)
        for op in ops:
            if not isinstance(op, Operation) or op.graph is not graph:
                raise GraphError(
                    f"gradients: operations holds {op!r}; expected operations "
                    f"of the graph of {ys[0].name}"
                )
    within = None if ops is None else set(ops)
    # ops upstream of ys
    upstream_ops: set[Operation] = set()
    stack = [y.operation for y in ys]
    while stack:
        op = stack.pop()
        if op in upstream_ops or (within is not None and op not in within):
            continue
        upstream_ops.add(op)
        stack.extend(t.operation for t in op.inputs)
    # Only they can carry a gradient from ys to xs: the walks below visit
    # them alone, in graph order, not every op of the graph (a pipeline
    # takes one backward per stage and micro-batch, each reading a small
    # part of a large graph).  An input of one of them is made by another of
    # them or by no op of ``operations``.
    if ops is None:
        ops = sorted(upstream_ops, key=_position)
        listed = graph.operations
        if not all(_listed_at_its_index(op, listed) for op in ops):
            # a list someone reordered: find its order the long way
            ops = [op for op in listed if op in upstream_ops]
    else:
        ops = [op for op in ops if op in upstream_ops]
    # tensors downstream of xs
    downstream: set[Tensor] = set(xs)
    for op in ops:
        if any(t in downstream for t in op.inputs):
            downstream.update(op.outputs)
    grads: dict[Tensor, list[Tensor]] = {}
    for i, y in enumerate(ys):
        g = grad_ys[i] if grad_ys is not None else None
        grads.setdefault(y, []).append(
            g if g is not None else ones(y.mesh, y.shape, y.dtype)
        )
    for op in reversed(ops):
        if not any(t in downstream for t in op.outputs):
            continue
        out_grads = [_sum(grads.get(t)) for t in op.outputs]
        if all(g is None for g in out_grads):
            continue
        needed = [t in downstream for t in op.inputs]
        if not any(needed):
            continue
        in_grads = op.gradient_for(out_grads, needed)
        for t, g, need in zip(op.inputs, in_grads, needed):
            if g is None or not need:
                continue
            grads.setdefault(t, []).append(g)
    return [_sum(grads.get(x)) for x in xs]


def _position(op: Operation) -> int:
    """``op``'s place in its graph's list (the order the walks take)."""
    return op.graph_index


def _listed_at_its_index(op: Operation, listed: list[Operation]) -> bool:
    i = op.graph_index
    return 0 <= i < len(listed) and listed[i] is op


def zero_filled(
    grads: Sequence[Tensor | None], outputs: Sequence[Tensor]
) -> list[Tensor]:
    """``grads``, with zeros for an output that has none."""
    return [g if g is not None else zeros_like(t) for g, t in zip(grads, outputs)]


def _sum(gs: list[Tensor] | None) -> Tensor | None:
    if not gs:
        return None
    if len(gs) == 1:
        return gs[0]
    total: Tensor = ew.add_n(gs)
    return total


class CustomGradientOp(Operation):
    """Wraps a forward subgraph whose gradient is given by a function.

    Its inputs are ``inputs`` then ``fn_outputs``; it forwards the latter as
    its outputs, and its gradient is ``grad_fn(inputs, fn_outputs, grads,
    needed)``: one gradient (or None) per input, where ``needed[i]`` says
    whether ``gradients`` asks for input ``i``'s (another may be None).
    ``grads`` holds None for an output without a gradient.
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
        return self.gradient_for(grad_ys, [True] * len(self.inputs))

    def gradient_for(
        self, grad_ys: Sequence[Tensor | None], needed: Sequence[bool]
    ) -> list[Tensor | None]:
        """:meth:`gradient`, the function told which inputs' gradients are
        ``needed`` (it may skip the others)."""
        ins = self.inputs[: self._n_in]
        outs = self.inputs[self._n_in :]
        gxs = list(self.grad_fn(ins, outs, list(grad_ys), tuple(needed[: self._n_in])))
        if len(gxs) != len(ins):
            raise GraphError(
                f"{self.name}: the gradient function returned {len(gxs)} "
                f"gradient(s) for {len(ins)} input(s); expected one (or None) per input"
            )
        return gxs + [None] * len(outs)

    def lower(self, lowering: LoweringContext) -> None:
        # Reading a pending sum forces it, as the cost model assumes of every
        # reader but identity/add/add_n (cost_models/deferred.py).
        for src, dst in zip(self.inputs[self._n_in :], self.outputs):
            lowering.set_tensor_lowering(dst, lowering.tensors[src])


@dataclass(frozen=True)
class _Captured:
    """What ``fn`` did in the forward pass of a custom gradient."""

    explicit_inputs: list[Tensor]
    all_inputs: list[Tensor]  # explicit, then what fn read from outside
    forward_operations: list[Operation]
    outputs: list[Tensor]
    single: bool


def _capture(
    fn: Callable[..., Any], explicit_inputs: Sequence[Tensor], what: str
) -> _Captured:
    if isinstance(explicit_inputs, Tensor) or not isinstance(explicit_inputs, Iterable):
        raise GraphError(
            f"{what}: explicit_inputs is {explicit_inputs!r}; expected a list of "
            "mtf.Tensors"
        )
    explicit = [_as_tensor(x) for x in explicit_inputs]
    if not explicit:
        raise GraphError(f"{what} needs at least one explicit input")
    if not callable(fn):
        raise GraphError(f"{what}: fn is {fn!r}; expected a function of the inputs")
    graph = explicit[0].graph
    outs, forward = graph.capture_operations(lambda: fn(*explicit))
    single = isinstance(outs, Tensor)
    outs = [outs] if single else list(outs)
    for t in outs:
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: fn returned {t!r}; expected mtf.Tensors")
    # A weight fn made is read from outside, as its own input: its value
    # comes from the variable, not from fn's (not recomputed) operations.
    made = {t for op in forward if not op.stateful for t in op.outputs}
    seen = set(explicit)
    external = []
    constant: dict[Operation, bool] = {}
    for op in forward:
        for t in op.inputs:
            if t in made or t in seen or not dtypes.is_floating(t.dtype):
                continue
            seen.add(t)
            if not _is_constant(t.operation, constant):
                external.append(t)
    return _Captured(explicit, explicit + external, forward, outs, single)


#: Operations without inputs whose values no gradient can reach: a tensor
#: computed from these and integer tensors alone (a mask, a causal bias) is
#: read as a constant.
_CONSTANT_SOURCES = frozenset({"Constant", "CausalBias", "Range", "Random"})


def _is_constant(op: Operation, memo: dict[Operation, bool]) -> bool:
    """Whether no gradient can reach ``op``'s outputs: every floating path
    into it starts at a constant source (not a variable, a graph input or
    anything else); no gradient flows through an integer tensor."""
    stack = [(op, False)]
    while stack:
        o, inputs_done = stack.pop()
        if o in memo:
            continue
        floating = [t.operation for t in o.inputs if dtypes.is_floating(t.dtype)]
        if inputs_done or not floating:
            memo[o] = (
                all(memo[i] for i in floating)
                if o.inputs
                else o.op_type in _CONSTANT_SOURCES
            )
            continue
        stack.append((o, True))
        stack.extend((i, False) for i in floating if i not in memo)
    return memo[op]


def _wrap(captured: _Captured, grad_fn: Callable[..., Any], name: str) -> Any:
    op = CustomGradientOp(captured.outputs, captured.all_inputs, grad_fn, name=name)
    return op.outputs[0] if captured.single else op.outputs


def custom_gradient(
    fn: Callable[..., Any],
    grad_fn: Callable[..., Any],
    explicit_inputs: Sequence[Tensor],
) -> Any:
    """Runs ``fn(*explicit_inputs)``; its gradient is ``grad_fn``'s instead
    of autodiff through ``fn`` (Mesh TF's API).

    ``grad_fn`` is called with the keywords ``explicit_inputs``,
    ``all_inputs`` (the explicit inputs, then every floating tensor ``fn``
    read from outside, weights it created included, but for constants such
    as masks, which no gradient reaches), ``forward_operations``
    (the operations ``fn`` added), ``outputs`` (``fn``'s) and
    ``output_grads`` (None for an output without one), and returns one
    gradient (or None) per tensor of ``all_inputs``.  It must not create
    variables.
    """
    captured = _capture(fn, explicit_inputs, "custom_gradient")

    def backward(
        ins: list[Tensor],
        outs: list[Tensor],
        gys: list[Tensor | None],
        needed: tuple[bool, ...],
    ) -> list[Tensor | None]:
        graph = ins[0].graph
        n_vars = len(graph.all_variables)
        grads = list(
            grad_fn(
                explicit_inputs=captured.explicit_inputs,
                all_inputs=captured.all_inputs,
                forward_operations=captured.forward_operations,
                outputs=outs,
                output_grads=gys,
            )
        )
        if len(graph.all_variables) != n_vars:
            raise GraphError(
                "custom_gradient: grad_fn created variables "
                f"{[v.name for v in graph.all_variables[n_vars:]]}; create them "
                "in fn or outside"
            )
        return grads

    return _wrap(captured, backward, "custom_gradient")


def recompute_grad(
    fn: Callable[..., Any],
    explicit_inputs: Sequence[Tensor],
    control_dependencies: bool = True,
) -> Any:
    """Runs ``fn`` and, in the backward pass, runs copies of its operations
    instead of keeping its activations (trading compute for memory), as
    Mesh TF's ``recompute_grad``.

    ``fn`` may create weights and read tensors from outside; their gradients
    flow as if ``fn`` were not recomputed.  Stateful operations are not
    copied: dropout inside ``fn`` keeps its forward masks (and holds them).
    ``control_dependencies`` is accepted for Mesh TF's programs; mtf_core
    adds no dependency (Mesh TF's forces XLA to run the copies after the
    output gradients; the lowering runs them where the graph puts them).
    """
    if not isinstance(control_dependencies, bool):
        raise GraphError(
            f"recompute_grad: control_dependencies is {control_dependencies!r}; "
            "expected True or False"
        )
    captured = _capture(fn, explicit_inputs, "recompute_grad")
    n_explicit = len(captured.explicit_inputs)

    def backward(
        ins: list[Tensor],
        outs: list[Tensor],
        gys: list[Tensor | None],
        needed: tuple[bool, ...],
    ) -> list[Tensor | None]:
        graph = ins[0].graph
        grads = zero_filled(gys, outs)
        # The copies read fresh copies of the explicit inputs, and what fn
        # read from outside as it is.
        mapping = {
            t: ew.identity(t) if i < n_explicit else t for i, t in enumerate(ins)
        }
        copies, mapping = graph.clone_operations(captured.forward_operations, mapping)
        again = [mapping.get(t, t) for t in outs]
        asked = [mapping[t] for t, need in zip(ins, needed) if need]
        got = iter(gradients(again, asked, grads, operations=copies) if asked else [])
        return [next(got) if need else None for need in needed]

    return _wrap(captured, backward, "recompute_grad")
