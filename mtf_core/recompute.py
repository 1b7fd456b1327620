"""Recomputing a block that creates its own weights (activation checkpointing).

:func:`mtf_core.autodiff.recompute_grad` needs a function of its inputs only,
weights included.  Model code (``mtf.layers``) creates its weights inside the
block, so :func:`recompute_block` runs the block once as it is (creating its
variables and the forward ops), records the weight tensors the block read
from ``get_variable``, and wraps the forward outputs in one custom-gradient op
whose inputs are the block's input and those weights.  The backward pass runs
the block again on fresh copies, with ``get_variable`` handing the recorded
weights back by name (:func:`provided_variables`), and differentiates that
copy.  So nothing the block computes is held from the forward to the backward
pass: its forward activations die inside the forward, at the cost of running
the block's forward twice (its flops and collectives are in the graph twice,
where the cost model counts them).

Randomness inside a recomputed block would draw new numbers the second time;
blocks with dropout are refused by the model builders.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mtf_core.autodiff import CustomGradientOp, gradients
from mtf_core.errors import GraphError
from mtf_core.graph import Graph, Tensor
from mtf_core.ops import elementwise as ew

_PROVIDED: weakref.WeakKeyDictionary[Graph, dict[str, Tensor]] = (
    weakref.WeakKeyDictionary()
)
_RECORDING: weakref.WeakKeyDictionary[Graph, list[dict[str, Tensor]]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def provided_variables(graph: Graph, tensors: Mapping[str, Tensor]) -> Iterator[None]:
    """While active, ``get_variable(mesh, name, ...)`` on ``graph`` returns
    ``tensors[name]`` (shape-checked) instead of creating a variable."""
    previous = _PROVIDED.get(graph)
    _PROVIDED[graph] = {**(previous or {}), **tensors}
    try:
        yield
    finally:
        if previous is None:
            _PROVIDED.pop(graph, None)
        else:
            _PROVIDED[graph] = previous


def provided(graph: Graph, name: str, shape: Any) -> Tensor | None:
    """The tensor :func:`provided_variables` hands out for ``name``, or None."""
    table = _PROVIDED.get(graph)
    if not table or name not in table:
        return None
    t = table[name]
    if t.shape != shape:
        raise GraphError(
            f"recomputed block asks for variable {name!r} of shape [{shape}] but "
            f"the first run created it as [{t.shape}]"
        )
    return t


def record(graph: Graph, name: str, tensor: Tensor) -> None:
    """Notes that ``get_variable`` returned ``tensor`` for ``name`` (for
    :func:`recompute_block`)."""
    for frame in _RECORDING.get(graph, ()):
        frame[name] = tensor


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
    frames = _RECORDING.setdefault(graph, [])
    frame: dict[str, Tensor] = {}
    frames.append(frame)
    try:
        out = fn(x)
    finally:
        frames.pop()
    if not isinstance(out, Tensor):
        raise GraphError(f"recompute_block: fn returned {out!r}; expected a Tensor")
    names = sorted(frame)
    weights = [frame[n] for n in names]

    def grad_fn(
        ins: list[Tensor], outs: list[Tensor], gys: list[Tensor]
    ) -> list[Tensor | None]:
        fresh = [ew.identity(t) for t in ins]
        with provided_variables(graph, dict(zip(names, fresh[1:]))):
            again = fn(fresh[0])
        return gradients([again], fresh, gys)

    op = CustomGradientOp([out], [x, *weights], grad_fn, name="recompute")
    return op.outputs[0]
