"""What an op sees of the lowering and of a mesh backend, as Protocols.

Ops live below the lowering (import-linter forbids ``mtf_core.ops`` ->
``mtf_core.lowering``), yet ``Operation.lower`` is called with a
:class:`~mtf_core.lowering.lowering.Lowering` and talks to a
:class:`~mtf_core.lowering.mesh_impl.MeshImpl`.  These Protocols are that
seam, typed: the members ops use, and nothing that would need TensorFlow
here.  ``Lowering`` and every ``MeshImpl`` satisfy them structurally (a test
checks it), so a new backend knows exactly what it must offer.

Laid-out tensors and TensorFlow values stay ``Any``: each backend has its own
representation (placement: one ``tf.Tensor`` per device; SPMD: one per
replica program).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from mtf_core.comm import LayoutContext, Reduction
    from mtf_core.graph import Mesh, Operation, Tensor
    from mtf_core.layout import TensorLayout
    from mtf_core.shapes import Shape


@runtime_checkable
class MeshBackend(Protocol):
    """The primitives a mesh implementation gives ops (``lowering.mesh_impl(op)``)."""

    ctx: LayoutContext
    shape: Shape
    current_op: Any

    def tensor_layout(self, arg: Any) -> TensorLayout: ...
    def slice_shape(self, shape: Any) -> list[int]: ...
    def slicewise(self, fn: Callable[..., Any], *inputs: Any) -> Any: ...
    def slicewise_multi(
        self, fn: Callable[..., Sequence[Any]], n_out: int, *inputs: Any
    ) -> list[Any]: ...
    def allreduce(
        self, x: Any, mesh_axes: Sequence[int], reduction: Reduction | str = "SUM"
    ) -> Any: ...
    def allreduce_for(self, op: Any, x: Any, mesh_axes: Sequence[int]) -> Any: ...
    def allconcat(self, x: Any, mesh_axis: int, concat_axis: int) -> Any: ...
    def alltoall(
        self, x: Any, mesh_axis: int, split_axis: int, concat_axis: int
    ) -> Any: ...
    def allsplit(self, x: Any, mesh_axis: int, split_axis: int) -> Any: ...
    def shift_by_n_processors(
        self, x: Any, mesh_axis: int, offset: int, wrap: bool
    ) -> Any: ...
    def apply_layout_change(
        self, x: Any, shape: Shape, old_layout: TensorLayout, new_layout: TensorLayout
    ) -> Any: ...
    def import_tf_tensor(self, tf_tensor: Any, shape: Any) -> Any: ...
    def export_to_tf_tensor(self, x: Any, shape: Any) -> Any: ...
    def laid_out_pcoordinate(self, mesh_axis: int) -> Any: ...
    def read_variables(self, variables: Sequence[Any]) -> Any: ...
    def assign_variables(
        self, variables: Sequence[Any], laid: Any, mode: str = "assign"
    ) -> list[Any]: ...


@runtime_checkable
class LoweringContext(Protocol):
    """What ``Operation.lower(lowering)`` may use of the lowering."""

    tf: Any  # TensorFlow (mtf_core.lowering.fast_tf.FAST_TF)
    seed: Any  # the step counter, for random ops
    feeds: dict[Any, Any]  # placeholder tensor -> the value fed for it
    variables: Any  # the VariableStore holding the per-device slices
    tensors: Any  # Tensor -> laid-out value (forces pending sums on read)
    lowered_operations: dict[Any, Any]

    def mesh_impl(self, x: Tensor | Operation | Mesh) -> MeshBackend: ...
    def set_tensor_lowering(self, t: Tensor, laid_out: Any) -> None: ...
    def raw_tensor(self, t: Tensor) -> Any: ...
    def memoized(self, key: Hashable, make: Callable[[], Any]) -> Any: ...
