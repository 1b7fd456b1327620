"""The interface every backend implements, and what is common to all of them.

A backend (``MeshImpl``) turns an op's lowering into per-device TensorFlow work.
Ops talk to it only through this interface, so the placement backend (one TF op
per device) and an SPMD backend are interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtf_core.comm import LayoutContext, plan_layout_change
from mtf_core.errors import LayoutError
from mtf_core.graph import Tensor
from mtf_core.layout import LayoutRules, TensorLayout
from mtf_core.lowering.counters import CollectiveRecord, Counters
from mtf_core.shapes import Shape, convert_to_shape


class MeshImpl:
    """A mesh shape, layout rules and the collectives that couple devices.

    ``layout_rules=`` is accepted for ``layout`` (Mesh TF's keyword).
    """

    #: Mesh TF's flag: lowered ops may carry control dependencies.
    supports_control_dependencies = True

    def __init__(
        self, shape: Any, layout: Any = None, layout_rules: Any = None
    ) -> None:
        if layout is None:
            layout = layout_rules if layout_rules is not None else []
        self.ctx = LayoutContext.make(shape, layout)
        self.shape: Shape = self.ctx.mesh_shape
        self.layout_rules: LayoutRules = self.ctx.rules
        self.counters: Counters | None = None
        self.current_op: Any = None

    # -- geometry -------------------------------------------------------------
    @property
    def size(self) -> int:
        return self.shape.size

    @property
    def ndims(self) -> int:
        return len(self.shape)

    def tensor_layout(self, arg: Tensor | Shape | Any) -> TensorLayout:
        shape = arg.shape if isinstance(arg, Tensor) else convert_to_shape(arg)
        try:
            return self.ctx.tensor_layout(shape)
        except LayoutError as e:
            what = arg.name if isinstance(arg, Tensor) else f"[{shape}]"
            raise type(e)(f"tensor {what}: {e}") from None

    def tensor_dimension_to_mesh_axis(self, dim: Any) -> int | None:
        return self.ctx.mesh_axis(dim)

    def mesh_axis_names(self, axes: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.shape[a].name for a in axes)

    def slice_shape(self, shape: Any) -> list[int]:
        self.tensor_layout(shape)  # raises a LayoutError naming the tensor
        return self.ctx.slice_shape(shape)

    def pnum_to_processor_coordinates(self, pnum: int) -> list[int]:
        coords = []
        for d in reversed(self.shape.dims):
            coords.append(pnum % d.size)
            pnum //= d.size
        return coords[::-1]

    def processor_coordinates_to_pnum(self, coords: Sequence[int]) -> int:
        pnum = 0
        for c, d in zip(coords, self.shape.dims):
            pnum = pnum * d.size + c
        return pnum

    def processor_groups(self, mesh_axes: Sequence[int]) -> list[list[int]]:
        """Groups of pnums that differ only in ``mesh_axes``, each in coordinate order."""
        mesh_axes = list(mesh_axes)
        groups: dict[tuple[int, ...], list[int]] = {}
        for pnum in range(self.size):
            c = self.pnum_to_processor_coordinates(pnum)
            key = tuple(v for i, v in enumerate(c) if i not in mesh_axes)
            groups.setdefault(key, []).append(pnum)
        return list(groups.values())

    def slice_begin(self, shape: Any, pnum: int) -> list[int]:
        shape = convert_to_shape(shape)
        layout = self.tensor_layout(shape)
        coords = self.pnum_to_processor_coordinates(pnum)
        begin = []
        for d, m in zip(shape, layout):
            begin.append(0 if m is None else coords[m] * (d.size // self.shape[m].size))
        return begin

    # -- bookkeeping --------------------------------------------------------
    def record(
        self,
        kind: str,
        mesh_axes: Sequence[int],
        bytes_per_device: int,
        reduction: str = "",
        op: Any = None,
    ) -> None:
        if self.counters is None:
            return
        op = op if op is not None else self.current_op
        self.counters.record_collective(
            CollectiveRecord(
                kind=kind,
                mesh_axes=self.mesh_axis_names(sorted(mesh_axes)),
                bytes_per_device=int(bytes_per_device),
                op_name=getattr(op, "name", ""),
                op_type=getattr(op, "op_type", ""),
                reduction=reduction,
            )
        )

    def devices_splitting(self, dim_names: Sequence[str]) -> int:
        """How many ways the op's work is divided: product of the mesh axes used."""
        return self.ctx.devices_splitting(dim_names)

    # -- what backends implement --------------------------------------------
    def slicewise(self, fn: Callable[..., Any], *inputs: Any) -> Any:
        raise NotImplementedError

    def slicewise_multi(
        self, fn: Callable[..., Sequence[Any]], n_out: int, *inputs: Any
    ) -> list[Any]:
        """Like slicewise for a function returning ``n_out`` tensors (backends
        may override this to call ``fn`` once per device)."""
        return [
            self.slicewise(lambda *a, i=i: fn(*a)[i], *inputs) for i in range(n_out)
        ]

    def allreduce(
        self, x: Any, mesh_axes: Sequence[int], reduction: str = "SUM"
    ) -> Any:
        raise NotImplementedError

    def allconcat(self, x: Any, mesh_axis: int, concat_axis: int) -> Any:
        raise NotImplementedError

    def alltoall(
        self, x: Any, mesh_axis: int, split_axis: int, concat_axis: int
    ) -> Any:
        raise NotImplementedError

    def allsplit(self, x: Any, mesh_axis: int, split_axis: int) -> Any:
        raise NotImplementedError

    def shift_by_n_processors(
        self, x: Any, mesh_axis: int, offset: int, wrap: bool
    ) -> Any:
        raise NotImplementedError

    def import_tf_tensor(self, tf_tensor: Any, shape: Any) -> Any:
        raise NotImplementedError

    def export_to_tf_tensor(self, x: Any, shape: Any) -> Any:
        raise NotImplementedError

    def laid_out_pcoordinate(self, mesh_axis: int) -> Any:
        raise NotImplementedError

    def laid_out_pnum(self) -> Any:
        raise NotImplementedError

    def make_variables(self, laid: Any, name: str, trainable: bool) -> list[Any]:
        raise NotImplementedError

    def read_variables(self, variables: Sequence[Any]) -> Any:
        raise NotImplementedError

    def assign_variables(
        self, variables: Sequence[Any], laid: Any, mode: str = "assign"
    ) -> list[Any]:
        raise NotImplementedError

    def finish_lowering(self) -> None:
        """Called when a lowering has created its ops (a backend that places
        them lazily places them now)."""

    # -- built on the primitives ------------------------------------------------
    def allreduce_for(self, op: Any, x: Any, mesh_axes: Sequence[int]) -> Any:
        """Allreduce (sum) recorded against ``op`` rather than the current op."""
        saved, self.current_op = self.current_op, op
        try:
            return self.allreduce(x, mesh_axes, "SUM")
        finally:
            self.current_op = saved

    def change_layout(self, x: Any, shape: Shape, new_layout: TensorLayout) -> Any:
        """Moves a laid-out tensor of ``shape`` from its rules' layout to
        ``new_layout``, following :func:`mtf_core.comm.plan_layout_change`."""
        return self.apply_layout_change(x, shape, self.tensor_layout(shape), new_layout)

    def apply_layout_change(
        self, x: Any, shape: Shape, old_layout: TensorLayout, new_layout: TensorLayout
    ) -> Any:
        for step in plan_layout_change(
            self.ctx, shape, "float32", old_layout, new_layout
        ):
            if step.kind == "alltoall":
                x = self.alltoall(x, step.mesh_axis, step.split_axis, step.concat_axis)
            elif step.kind == "allconcat":
                x = self.allconcat(x, step.mesh_axis, step.concat_axis)
            else:
                x = self.allsplit(x, step.mesh_axis, step.split_axis)
        return x
