"""The interface every backend implements, and what is common to all of them.

A backend (``MeshImpl``) turns an op's lowering into per-device TensorFlow work.
Ops talk to it only through this interface, so the placement backend (one TF op
per device) and an SPMD backend are interchangeable.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from typing import Any

from mtf_core.comm import LayoutContext, Reduction, plan_layout_change
from mtf_core.errors import LayoutError
from mtf_core.graph import Tensor
from mtf_core.layout import LayoutRules, TensorLayout
from mtf_core.lowering.counters import CollectiveRecord, Counters
from mtf_core.shapes import Shape, convert_to_shape


class MeshImpl(abc.ABC):
    """A mesh shape, layout rules and the collectives that couple devices.

    ``layout_rules=`` is accepted for ``layout`` (Mesh TF's keyword).  A
    backend implements every abstract primitive below (a class that misses
    one cannot be instantiated, and says which); ops see them through
    :class:`mtf_core.seams.MeshBackend`.
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

    def laid_out_size(self, shape: Any) -> int:
        """Elements of all the slices of a tensor of ``shape`` together (a
        replicated dim counts once per device), as Mesh TF's."""
        return math.prod(self.slice_shape(shape)) * self.size

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
    @abc.abstractmethod
    def slicewise(self, fn: Callable[..., Any], *inputs: Any) -> Any:
        """Runs ``fn`` on every device's slice of the laid-out ``inputs``."""

    def slicewise_multi(
        self, fn: Callable[..., Sequence[Any]], n_out: int, *inputs: Any
    ) -> list[Any]:
        """Like slicewise for a function returning ``n_out`` tensors (backends
        may override this to call ``fn`` once per device)."""
        return [
            self.slicewise(lambda *a, i=i: fn(*a)[i], *inputs) for i in range(n_out)
        ]

    @abc.abstractmethod
    def allreduce(
        self, x: Any, mesh_axes: Sequence[int], reduction: Reduction | str = "SUM"
    ) -> Any:
        """Combines ``x`` over ``mesh_axes`` with ``reduction``; every device gets the result."""

    @abc.abstractmethod
    def allconcat(self, x: Any, mesh_axis: int, concat_axis: int) -> Any:
        """Gathers ``x``'s pieces along tensor axis ``concat_axis`` over ``mesh_axis``."""

    @abc.abstractmethod
    def alltoall(
        self, x: Any, mesh_axis: int, split_axis: int, concat_axis: int
    ) -> Any:
        """Re-splits ``x`` over ``mesh_axis`` from ``concat_axis`` to ``split_axis``."""

    @abc.abstractmethod
    def allsplit(self, x: Any, mesh_axis: int, split_axis: int) -> Any:
        """Each device keeps its piece of ``x`` along ``split_axis`` (no communication)."""

    @abc.abstractmethod
    def shift_by_n_processors(
        self, x: Any, mesh_axis: int, offset: int, wrap: bool
    ) -> Any:
        """Moves each slice ``offset`` devices along ``mesh_axis`` (``wrap``: cyclically)."""

    @abc.abstractmethod
    def import_tf_tensor(self, tf_tensor: Any, shape: Any) -> Any:
        """Lays out a whole TensorFlow value of ``shape``."""

    @abc.abstractmethod
    def export_to_tf_tensor(self, x: Any, shape: Any) -> Any:
        """The whole value of laid-out ``x`` of ``shape``."""

    @abc.abstractmethod
    def laid_out_pcoordinate(self, mesh_axis: int) -> Any:
        """Each device's coordinate along ``mesh_axis``, laid out."""

    @abc.abstractmethod
    def laid_out_pnum(self) -> Any:
        """Each device's processor number, laid out."""

    @abc.abstractmethod
    def make_variables(self, laid: Any, name: str, trainable: bool) -> list[Any]:
        """The per-device variables holding slices of ``laid``."""

    @abc.abstractmethod
    def read_variables(self, variables: Sequence[Any]) -> Any:
        """The laid-out values of per-device ``variables``."""

    @abc.abstractmethod
    def assign_variables(
        self, variables: Sequence[Any], laid: Any, mode: str = "assign"
    ) -> list[Any]:
        """Assigns (``mode``: assign, add, sub) laid-out ``laid`` to ``variables``."""

    def finish_lowering(self) -> None:  # noqa: B027 - optional hook, not a primitive
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
            # plan_layout_change sets the axes each kind needs.
            if step.kind == "alltoall":
                assert step.split_axis is not None and step.concat_axis is not None
                x = self.alltoall(x, step.mesh_axis, step.split_axis, step.concat_axis)
            elif step.kind == "allconcat":
                assert step.concat_axis is not None
                x = self.allconcat(x, step.mesh_axis, step.concat_axis)
            else:
                assert step.split_axis is not None
                x = self.allsplit(x, step.mesh_axis, step.split_axis)
        return x
