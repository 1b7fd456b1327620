"""``while_loop``: an mtf op whose condition and body are mtf sub-graphs.

``while_loop(cond_fn, body_fn, inputs)`` calls ``cond_fn`` and ``body_fn``
once, on stand-ins for the loop variables (:class:`LoopInput` ops), and keeps
the operations they create as the loop's own sub-graphs (out of the graph's
operation list, so the planner sees one op).  Tensors of the outer graph the
sub-graphs read become extra inputs of the loop, so they are lowered first.

Lowering is one ``tf.while_loop`` whose loop variables are every device's
slices: each iteration lowers the body's ops on the mesh implementation, so
the body is laid out like the rest of the graph.  Counters record the
condition's and body's collectives and flops once (what one iteration costs,
as the planner prices it), whatever the number of iterations.  Random ops in
the body draw new numbers at each iteration.  Loops have no gradient (as in
Mesh TensorFlow).  They lower on the placement and the SPMD backends.

``has_accumulators``: outputs the body returns after the loop variables are
summed over the iterations and returned after them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from mtf_core import dtypes
from mtf_core.comm import CollectiveSpec, LayoutContext
from mtf_core.errors import ArgumentError, GraphError, LoweringError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor
from mtf_core.seams import LoweringContext


class LoopInput(Operation):
    """A loop variable as the condition or body sees it (set by the loop)."""

    op_type = "LoopInput"

    def __init__(self, mesh: Mesh, like: Tensor, name: str) -> None:
        super().__init__([], mesh=mesh, name=name)
        self._add_output(like.shape, like.dtype)

    def flops(self) -> float:
        return 0.0

    def lower(self, lowering: LoweringContext) -> None:
        # The loop sets this op's tensor before lowering its sub-graph.
        if self.outputs[0] not in lowering.tensors:
            raise LoweringError(f"{self.name} is lowered only inside its while_loop")


def _ops_reaching(outputs: Sequence[Tensor], ops: Sequence[Operation]) -> list[Any]:
    keep: set[Operation] = set()
    stack = [t.operation for t in outputs]
    pool = set(ops)
    while stack:
        op = stack.pop()
        if op in keep or op not in pool:
            continue
        keep.add(op)
        stack.extend(i.operation for i in op.inputs)
    return [op for op in ops if op in keep]


class WhileLoop(Operation):
    """See the module docstring."""

    op_type = "WhileLoop"
    stateful = True

    def __init__(
        self,
        cond_fn: Callable[..., Tensor],
        body_fn: Callable[..., Sequence[Tensor]],
        inputs: Sequence[Tensor],
        has_accumulators: bool = False,
        name: str | None = None,
        tf_kwargs: dict[str, Any] | None = None,
    ) -> None:
        inputs = list(inputs)
        if not inputs:
            raise ArgumentError("while_loop: needs at least one loop variable")
        super().__init__(inputs, name=name or "while_loop")
        self.tf_kwargs = dict(tf_kwargs or {})
        if self.tf_kwargs.get("back_prop"):
            raise ArgumentError("while_loop: back_prop=True is not supported")
        self.tf_kwargs.pop("back_prop", None)
        graph_ops = self.graph.operations
        graph_ops.pop()  # re-added after what the functions create
        n = len(inputs)

        def trace(fn: Callable[..., Any], what: str) -> tuple[list[Tensor], Any]:
            start = len(graph_ops)
            stand_ins = [
                LoopInput(self.mesh, t, f"{self.name}/{what}_input_{i}").outputs[0]
                for i, t in enumerate(inputs)
            ]
            result = fn(*stand_ins)
            made = graph_ops[start:]
            del graph_ops[start:]
            return stand_ins, (result, made)

        self._cond_inputs, (cond_out, cond_ops) = trace(cond_fn, "cond")
        if not isinstance(cond_out, Tensor) or cond_out.shape.ndims != 0:
            raise ShapeError(
                f"while_loop {self.name}: cond_fn must return a scalar mtf Tensor, "
                f"got {cond_out!r}"
            )
        if cond_out.dtype != dtypes.bool_:
            raise ArgumentError(
                f"while_loop {self.name}: cond_fn returned {cond_out.dtype}; "
                "expected a bool scalar"
            )
        self._body_inputs, (body_out, body_ops) = trace(body_fn, "body")
        body_out = list(body_out)
        if len(body_out) < n or (len(body_out) > n and not has_accumulators):
            raise ArgumentError(
                f"while_loop {self.name}: body_fn returned {len(body_out)} tensors "
                f"for {n} loop variables"
                + ("" if has_accumulators else " (more need has_accumulators=True)")
            )
        for i, (a, b) in enumerate(zip(inputs, body_out)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ShapeError(
                    f"while_loop {self.name}: loop variable {i} is [{a.shape}] "
                    f"{a.dtype} but body_fn returned [{b.shape}] {b.dtype}"
                )
        # Variables made inside belong to the graph (created once, before).
        for op in cond_ops + body_ops:
            if op.op_type == "Variable":
                graph_ops.append(op)
        self._cond_output = cond_out
        self._body_outputs = body_out
        self._cond_ops = [
            op for op in _ops_reaching([cond_out], cond_ops) if op.op_type != "Variable"
        ]
        self._body_ops = [
            op for op in _ops_reaching(body_out, body_ops) if op.op_type != "Variable"
        ]
        inner = set(self._cond_ops) | set(self._body_ops)
        captured: list[Tensor] = []
        for op in self._cond_ops + self._body_ops:
            for t in op.inputs:
                if t.operation not in inner and t not in captured:
                    captured.append(t)
        self._inputs = inputs + captured
        self.num_loop_vars = n
        # The sub-graphs' dims are the loop's: the planner splits them (or
        # keeps them whole) for the body as for any op, and flops per device
        # divide by what splits them.
        sub = self._cond_ops + self._body_ops
        self._sub_dims = frozenset(d for op in sub for d in op.all_dim_names)
        self._unsplittable = frozenset(d for op in sub for d in op.unsplittable_dims())
        graph_ops.append(self)
        for t in body_out:
            self._add_output(t.shape, t.dtype)

    @property
    def all_dim_names(self) -> frozenset[str]:
        return super().all_dim_names | self._sub_dims

    @property
    def sub_operations(self) -> list[Operation]:
        return self._cond_ops + self._body_ops

    @property
    def body_operations(self) -> list[Operation]:
        return list(self._body_ops)

    @property
    def cond_operations(self) -> list[Operation]:
        return list(self._cond_ops)

    def flops(self) -> float:
        """One iteration's flops (condition and body)."""
        return float(sum(op.flops() for op in self._cond_ops + self._body_ops))

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        """One iteration's collectives: the condition's, then the body's.

        Every one is issued inside the iteration (the loop variables leave it
        whole), so pending sums count as issued.  Two pending sums the body
        adds before use are one allreduce in the lowering but two here: an
        upper bound, which no loop in mtf_core's decoders reaches.
        """
        out: list[CollectiveSpec] = []
        for op in self._cond_ops + self._body_ops:
            out.extend(
                replace(c, pending=False) if c.pending else c
                for c in op.communication(ctx)
            )
        return out

    @property
    def has_gradient(self) -> bool:
        return False

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [None] * len(self._inputs)

    def lower(self, lowering: LoweringContext) -> None:
        from mtf_core.ops._loop_lowering import lower_while_loop

        lower_while_loop(self, lowering)

    def attrs(self) -> dict[str, Any]:
        return {"num_loop_vars": self.num_loop_vars}


def while_loop(
    cond_fn: Callable[..., Tensor],
    body_fn: Callable[..., Sequence[Tensor]],
    inputs: Sequence[Tensor],
    num_loop_vars: int | None = None,
    has_accumulators: bool = False,
    **kwargs: Any,
) -> list[Tensor]:
    """Runs ``inputs = body_fn(*inputs)`` while ``cond_fn(*inputs)`` holds;
    returns the final loop variables (then the accumulators, with
    ``has_accumulators``).  ``kwargs`` go to ``tf.while_loop``
    (``maximum_iterations``, ``parallel_iterations``...).

    ``num_loop_vars`` (Mesh TensorFlow's multi-GPU device-memory workaround)
    changes nothing here: every input is a loop variable.
    """
    if num_loop_vars is not None and not 0 < num_loop_vars <= len(inputs):
        raise ArgumentError(
            f"while_loop: num_loop_vars {num_loop_vars!r} must be in 1..{len(inputs)}"
        )
    for t in inputs:
        if not isinstance(t, Tensor):
            raise GraphError(f"while_loop: input {t!r} is not an mtf.Tensor")
    return WhileLoop(
        cond_fn, body_fn, inputs, has_accumulators, tf_kwargs=kwargs
    ).outputs
