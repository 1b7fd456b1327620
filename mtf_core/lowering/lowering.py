"""Lowering: turns an mtf graph into TensorFlow work on a mesh of devices.

Works eagerly (each op runs as it is lowered, handy for debugging) and inside a
``tf.function`` (see :mod:`mtf_core.lowering.compiled`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from mtf_core.errors import LoweringError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lazy_sum import LazyAllreduceSum  # noqa: F401  (re-exported)
from mtf_core.liveness import needed_operations
from mtf_core.lowering.counters import Counters
from mtf_core.lowering.fast_tf import FAST_TF
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.variables import VariableStore


class _TensorMap:
    """``lowering.tensors[t]``: the laid-out tensor of ``t``, forcing lazy sums."""

    def __init__(self) -> None:
        self.raw: dict[Tensor, Any] = {}
        self.after_force: Callable[[], None] | None = None  # set once lowered

    def __getitem__(self, t: Tensor) -> Any:
        try:
            v = self.raw[t]
        except KeyError:
            raise LoweringError(f"tensor {t.name} has not been lowered") from None
        laid = v.to_laid_out_tensor()
        if laid is not v and self.after_force is not None:
            self.after_force()  # forcing a pending sum made ops: place them
        return laid

    def __setitem__(self, t: Tensor, v: Any) -> None:
        self.raw[t] = v

    def __contains__(self, t: object) -> bool:
        return t in self.raw


class Lowering:
    """Lowers ``graph`` onto the mesh implementations in ``mesh_to_impl``.

    Args:
      graph: the mtf graph.
      mesh_to_impl: ``{mesh: MeshImpl}`` for every mesh the graph uses.
      feeds: ``{placeholder tensor: full tf value}``.
      variables: an existing VariableStore (per-device slice variables); a new
        one is made (initialized from each variable's initializer) if None.
      targets: lower only what these tensors/operations need (default: all;
        :func:`mtf_core.liveness.needed_operations`, the rule the cost model
        prices a step by).
      seed: integer or scalar int tensor mixed into every random op's seed.
    """

    def __init__(
        self,
        graph: Graph,
        mesh_to_impl: Mapping[Mesh, MeshImpl],
        feeds: Mapping[Tensor, Any] | None = None,
        variables: VariableStore | None = None,
        targets: Iterable[Tensor | Operation] | None = None,
        seed: Any = 0,
        autostack: bool = True,
    ) -> None:
        del autostack  # accepted for Mesh TensorFlow compatibility
        self.tf = FAST_TF  # tf, making the common ops faster (fast_tf.py)
        self.graph = graph
        self.mesh_to_impl = dict(mesh_to_impl)
        self.feeds = dict(feeds or {})
        self.seed = seed
        self.counters = Counters()
        self.tensors = _TensorMap()
        self.lowered_operations: dict[Operation, Any] = {}
        ops = graph.operations if targets is None else needed_operations(graph, targets)
        for op in ops:
            if op.mesh not in self.mesh_to_impl:
                raise LoweringError(
                    f"operation {op.name} is on mesh {op.mesh.name!r}, which has no "
                    f"mesh implementation (given: {[m.name for m in self.mesh_to_impl]})"
                )
        for impl in self.mesh_to_impl.values():
            impl.counters = self.counters
        for op in ops:
            for t in op.outputs:
                self.mesh_impl(op).tensor_layout(t)  # validate layouts up front
        self.variables = (
            variables
            if variables is not None
            else VariableStore(graph, self.mesh_to_impl)
        )
        self.memo: dict[Any, Any] = {}  # see memoized()
        for op in ops:
            impl = self.mesh_impl(op)
            impl.current_op = op
            op.lower(self)
            self._count_flops(op, impl)
        for impl in self.mesh_to_impl.values():
            impl.current_op = None
        self._finish()
        self.tensors.after_force = self._finish

    def _finish(self) -> None:
        for impl in self.mesh_to_impl.values():
            impl.finish_lowering()

    def memoized(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for in this lowering, the
        same value after that (e.g. one Const per device for a scalar that many
        ops use)."""
        try:
            return self.memo[key]
        except KeyError:
            value = self.memo[key] = make()
            return value

    # -- what ops use ----------------------------------------------------------
    def mesh_impl(self, x: Tensor | Operation | Mesh) -> MeshImpl:
        mesh = x if isinstance(x, Mesh) else x.mesh
        return self.mesh_to_impl[mesh]

    def set_tensor_lowering(self, t: Tensor, laid_out: Any) -> None:
        self.tensors[t] = laid_out

    def raw_tensor(self, t: Tensor) -> Any:
        """The lowering of ``t`` without forcing a pending allreduce."""
        return self.tensors.raw[t]

    def _count_flops(self, op: Operation, impl: MeshImpl) -> None:
        flops = op.flops()
        if flops:
            self.counters.record_flops(
                op.name, flops / impl.devices_splitting(sorted(op.all_dim_names))
            )

    # -- Mesh TensorFlow's API -------------------------------------------------
    def export_to_tf_tensor(self, t: Tensor) -> Any:
        """The full value of ``t`` as one tf.Tensor."""
        result = self.mesh_impl(t).export_to_tf_tensor(self.tensors[t], t.shape)
        self._finish()  # forcing a pending sum may have made ops
        return result

    def lowered_operation(self, op: Operation | Tensor) -> Any:
        """What lowering ``op`` produced (for assignments: the per-device updates)."""
        if isinstance(op, Tensor):
            op = op.operation
        if op in self.lowered_operations:
            return self.lowered_operations[op]
        if op.outputs:
            laid = self.tensors[op.outputs[0]]
            self._finish()  # forcing a pending sum may have made ops
            return laid
        raise LoweringError(f"operation {op.name} was not lowered")

    def variable_slices(self, var: Any) -> list[Any]:
        return self.variables.slices(var)

    def copy_masters_to_slices(self) -> Any:
        """Sets every variable's slices from its master variable (Mesh TF's
        TF1 loop runs this after restoring a checkpoint); a ``tf.group`` in
        graph mode, done at once (``None``) eagerly."""
        return self.variables.masters.copy_to_slices()

    def copy_slices_to_masters(self) -> Any:
        """Sets every master variable from its slices (before a save)."""
        return self.variables.masters.copy_from_slices()
