"""The reversible residual block of Mesh TensorFlow's ``mtf.layers``
(RevNet, https://arxiv.org/abs/1707.04585; Mesh TF's
``ReversibleLayerStack``, as in Reformer).

A block maps ``(x1, x2)`` to ``(y1, y2) = (x1 + f(x2), x2)``.  Its inputs
can be rebuilt from its outputs (``x2 = y2``, ``x1 = y1 - f(y2)``), so with
``recompute_grads`` the backward pass rebuilds them instead of keeping
them: each block's gradient function runs copies of ``f``'s operations on
the rebuilt ``x2`` and hands the rebuilt ``x1`` and ``x2`` to the block
before it.  They travel as the "gradients" of the ``*_backwards`` tensors,
Mesh TF's device for it: a block's ``x1_backwards`` and ``x2_backwards``
are the previous block's ``y1_backwards`` and ``y2_backwards``.
"""

from __future__ import annotations

from collections.abc import Callable

from mtf_core.autodiff import custom_gradient, gradients
from mtf_core.errors import GraphError, ShapeError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops.creation import zeros_like

Block = tuple[Tensor, Tensor | None, Tensor, Tensor | None]


def reversible_half_residual_and_swap(
    x1: Tensor,
    x1_backwards: Tensor | None,
    x2: Tensor,
    x2_backwards: Tensor | None,
    f: Callable[[Tensor], Tensor],
    recompute_grads: bool = True,
) -> Block:
    """One block of a reversible network: ``(y2, y2_backwards, y1,
    y1_backwards) = (x2, x2_backwards, x1 + f(x2), x1_backwards)``.

    Pass None for the first block's ``*_backwards``, then each block's
    outputs to the next.  With ``recompute_grads`` the backward pass
    rebuilds each block's inputs from its outputs (the module docstring),
    so no block's activations are kept; the values and gradients are the
    same either way.
    """
    if x1.shape != x2.shape or x1.dtype != x2.dtype:
        raise ShapeError(
            f"reversible_half_residual_and_swap: x1 [{x1.shape}] {x1.dtype} and "
            f"x2 [{x2.shape}] {x2.dtype} must have one shape and dtype"
        )
    if not recompute_grads:
        return x2, x2_backwards, x1 + f(x2), x1_backwards
    fx: list[Tensor] = []

    def forward(a1: Tensor, a1_back: Tensor, a2: Tensor, a2_back: Tensor) -> Block:
        fx.append(f(a2))
        if not isinstance(fx[0], Tensor) or fx[0].shape != a1.shape:
            raise ShapeError(
                f"reversible_half_residual_and_swap: f returned {fx[0]!r}; expected "
                f"a Tensor of x1's shape [{a1.shape}]"
            )
        return a2, a2_back, a1 + fx[0], a1_back

    def backward(
        explicit_inputs: list[Tensor],
        all_inputs: list[Tensor],
        forward_operations: list[Operation],
        outputs: list[Tensor],
        output_grads: list[Tensor | None],
    ) -> list[Tensor | None]:
        _, _, x2_in, _ = explicit_inputs
        y1 = outputs[2]
        dy2, dy2_back, dy1, dy1_back = output_grads
        if forward_operations[-1] is not y1.operation:
            raise GraphError("reversible block: the last forward op is not y1's add")
        # The last block's outputs are at hand; an earlier block gets them
        # rebuilt by the block after it.
        x2_again = x2_in if dy2_back is None else dy2_back
        y1_again = y1 if dy1_back is None else dy1_back
        copies, mapping = x2_in.graph.clone_operations(
            forward_operations[:-1], {x2_in: x2_again}
        )
        fx_again = mapping[fx[0]]
        x1_again = y1_again - fx_again
        dy1 = zeros_like(y1) if dy1 is None else dy1
        grads = gradients(
            [fx_again], [x2_again, *all_inputs[4:]], [dy1], operations=copies
        )
        dx2 = _plus(dy2, grads[0])
        # x1's gradient, then x1 itself for the block before, and so on
        return [dy1, x1_again, dx2, x2_again, *grads[1:]]

    inputs = [
        x1,
        zeros_like(x1) if x1_backwards is None else x1_backwards,
        x2,
        zeros_like(x2) if x2_backwards is None else x2_backwards,
    ]
    y2, y2_back, y1, y1_back = custom_gradient(forward, backward, inputs)
    return y2, y2_back, y1, y1_back


def _plus(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b
