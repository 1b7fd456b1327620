"""Pending allreduces: an einsum (or gather, reduction, ...) that sums over a
split dim leaves its result as a :class:`LazyAllreduceSum`, which the lowering
reduces only when something needs the whole sum.

It sits below both the op families (which make them in ``lower``) and the
lowering (which forces them), and imports neither, nor TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LazyAllreduceSum:
    """A laid-out tensor whose allreduce over ``mesh_axes`` has not happened yet.

    Sums of lazy tensors with the same axes stay lazy, so ``a@b + c@d`` is
    reduced once.  Any other use forces the reduction.
    """

    def __init__(
        self, mesh_impl: Any, laid_out: Any, mesh_axes: Sequence[int], op: Any
    ) -> None:
        self.mesh_impl = mesh_impl
        self.laid_out = laid_out
        self.mesh_axes = tuple(sorted(mesh_axes))
        self.op = op
        self._reduced: Any = None

    @property
    def is_pending(self) -> bool:
        """True until something forces the reduction."""
        return self._reduced is None

    def to_laid_out_tensor(self) -> Any:
        if self._reduced is None:
            self._reduced = self.mesh_impl.allreduce_for(
                self.op, self.laid_out, self.mesh_axes
            )
        return self._reduced
