"""Lowering: turns an mtf graph into TensorFlow work on a mesh of devices.

Works eagerly (each op runs as it is lowered, handy for debugging) and inside a
``tf.function`` (see :mod:`mtf_core.lowering.compiled`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import numpy as np

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
      autostack: accepted for Mesh TensorFlow (whose variables it stacks).
      log_file: a path (``tf.io.gfile``'s, so ``gs://`` too) to write the
        variables (shape, size, slice size) and the counters to, as Mesh
        TensorFlow's lowering does.
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
        log_file: Any = None,
    ) -> None:
        del autostack  # accepted for Mesh TensorFlow compatibility
        self.tf = FAST_TF  # tf, making the common ops faster (fast_tf.py)
        self.graph = graph
        self.mesh_to_impl = _checked_impls(graph, mesh_to_impl)
        self.feeds = _checked_feeds(graph, feeds)
        if targets is not None:
            targets = _checked_targets(graph, targets)
        self.seed = _checked_seed(seed)
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
        if log_file is not None:
            self._write_log(log_file)

    def _write_log(self, path: Any) -> None:
        """The variables and counters, as Mesh TF's ``log_file`` holds them."""
        import tensorflow as tf

        lines = []
        for tag, variables, each in (
            ("Trainable Variables", self.graph.trainable_variables, True),
            ("All Variables", self.graph.all_variables, False),
        ):
            total = total_slice = 0
            for v in sorted(variables, key=lambda v: v.name):
                size = v.shape.size
                per_slice = int(np.prod(self.mesh_impl(v).slice_shape(v.shape)))
                total, total_slice = total + size, total_slice + per_slice
                if each:
                    lines.append(
                        f"Variable    {v.name:<60} size {size:<12} slice_size "
                        f"{per_slice:<12} {v.shape}"
                    )
            lines.append(
                f"{tag} count: {len(variables)} Total size: {total} Total "
                f"slice_size: {total_slice}"
            )
        lines += ["Counters:", self.counters.summary()]
        try:
            with tf.io.gfile.GFile(str(path), "w") as f:
                f.write("\n".join(lines) + "\n")
        except (OSError, tf.errors.OpError) as e:
            raise LoweringError(
                f"log_file {str(path)!r} cannot be written: {type(e).__name__}: {e}"
            ) from None

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

    def laid_out_size(self, tensor: Tensor) -> int:
        """Elements of all of ``tensor``'s slices together (Mesh TF's)."""
        return self.mesh_impl(tensor).laid_out_size(tensor.shape)

    # -- what ops use ----------------------------------------------------------
    def mesh_impl(self, x: Tensor | Operation | Mesh) -> MeshImpl:
        if not isinstance(x, (Tensor, Operation, Mesh)):
            raise LoweringError(
                f"{x!r} is not an mtf.Tensor, Operation or Mesh of the lowered graph"
            )
        mesh = x if isinstance(x, Mesh) else x.mesh
        try:
            return self.mesh_to_impl[mesh]
        except KeyError:
            what = "" if isinstance(x, Mesh) else f"{x.name} is on "
            raise LoweringError(
                f"{what}mesh {mesh.name!r}, which this lowering has no mesh "
                f"implementation for (given: {[m.name for m in self.mesh_to_impl]})"
            ) from None

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
        if not isinstance(op, Operation):
            raise LoweringError(f"{op!r} is not an mtf.Operation or mtf.Tensor")
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


def _checked_impls(graph: Any, mesh_to_impl: Any) -> dict[Mesh, MeshImpl]:
    """``{mesh: MeshImpl}``, checked before lowering starts."""
    if not isinstance(graph, Graph):
        raise LoweringError(f"graph {graph!r} is not an mtf.Graph")
    if not isinstance(mesh_to_impl, Mapping):
        raise LoweringError(
            f"mesh_to_impl is {mesh_to_impl!r}; expected a dict {{mesh: MeshImpl}}"
        )
    for mesh, impl in mesh_to_impl.items():
        if not isinstance(mesh, Mesh):
            raise LoweringError(f"mesh_to_impl key {mesh!r} is not an mtf.Mesh")
        if not isinstance(impl, MeshImpl):
            raise LoweringError(
                f"mesh_to_impl[{mesh.name!r}] is {impl!r}; expected a MeshImpl "
                "such as mtf.placement_mesh_impl.PlacementMeshImpl"
            )
    return dict(mesh_to_impl)


def _checked_feeds(graph: Graph, feeds: Any) -> dict[Tensor, Any]:
    """``feeds`` whose keys are the graph's imported tensors (placeholders):
    a value for any other tensor would be ignored."""
    from mtf_core.ops.creation import ImportTensor

    if feeds is None:
        return {}
    if not isinstance(feeds, Mapping):
        raise LoweringError(
            f"feeds is {feeds!r}; expected a dict {{placeholder: value}}"
        )
    for t in feeds:
        if not (
            isinstance(t, Tensor)
            and isinstance(t.operation, ImportTensor)
            and t.graph is graph
        ):
            raise LoweringError(
                f"feeds key {t!r} is not a placeholder of this graph; expected "
                "tensors made by mtf.placeholder"
            )
    return dict(feeds)


def _checked_targets(graph: Graph, targets: Iterable[Any]) -> list[Tensor | Operation]:
    if isinstance(targets, (Tensor, Operation, str)) or not isinstance(
        targets, Iterable
    ):
        raise LoweringError(
            f"targets is {targets!r}; expected a list of mtf.Tensors or Operations"
        )
    out = list(targets)
    for t in out:
        if not isinstance(t, (Tensor, Operation)) or t.graph is not graph:
            raise LoweringError(
                f"target {t!r} is not a tensor or operation of this graph"
            )
    return out


def _checked_seed(seed: Any) -> Any:
    """An integer seed, or a scalar integer TF tensor (a compiled step's
    counter); a float or a string would be cast, or fail in TF."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return seed
    if getattr(getattr(seed, "dtype", None), "is_integer", False):
        return seed
    raise LoweringError(
        f"seed is {seed!r}; expected an integer or a scalar integer tf.Tensor"
    )
