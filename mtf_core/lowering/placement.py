"""PlacementMeshImpl: one TensorFlow op per device, collectives from placed ops.

Each laid-out tensor is a list of per-device ``tf.Tensor`` slices, in pnum
order.  On one host placed ``add_n`` / ``concat`` / ``identity`` are faster than
TF's collective ops, and need no ordering tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from mtf_core.comm import Reduction
from mtf_core.errors import LoweringError
from mtf_core.lowering import fast_tf
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.placing import DeferredPlacement
from mtf_core.shapes import convert_to_shape

#: How the placed allreduce combines the stacked slices (a sum is add_n).
_COMBINE = {
    Reduction.MAX: tf.reduce_max,
    Reduction.MIN: tf.reduce_min,
    Reduction.LOGICAL_OR: tf.reduce_any,
    Reduction.LOGICAL_AND: tf.reduce_all,
}


class PlacementLaidOutTensor:
    """Per-device slices of one mtf tensor, in pnum order."""

    __slots__ = ("slices",)

    def __init__(self, slices: Sequence[Any]) -> None:
        self.slices = list(slices)

    def to_laid_out_tensor(self) -> PlacementLaidOutTensor:
        return self

    @property
    def slice_bytes(self) -> int:
        s = self.slices[0]
        return int(s.shape.num_elements()) * int(s.dtype.size)

    def __repr__(self) -> str:
        return f"LaidOutTensor({len(self.slices)} x {self.slices[0].shape})"


#: The name Mesh TensorFlow and this package's callers use.
LaidOutTensor = PlacementLaidOutTensor


def _normalize_device(d: Any) -> str:
    name = getattr(d, "name", d)
    if not isinstance(name, str):
        raise LoweringError(f"device {d!r} is not a device name such as '/cpu:0'")
    return name


class PlacementMeshImpl(MeshImpl):
    """Mesh implementation that places one slice of each tensor on each device.

    >>> # doctest: +SKIP
    >>> impl = PlacementMeshImpl("rows:2;cols:2", "batch:rows;hidden:cols",
    ...                          ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])
    """

    def __init__(self, shape: Any, layout: Any, devices: Sequence[Any] | None) -> None:
        super().__init__(shape, layout)
        if devices is None:
            devices = [""] * self.size
        if isinstance(devices, str):  # a string would be its letters
            raise LoweringError(
                f"devices is {devices!r}; expected a list of device names, one per "
                "processor"
            )
        devices = [_normalize_device(d) for d in devices]
        if len(devices) != self.size:
            raise LoweringError(
                f"mesh [{self.shape}] has {self.size} processors but {len(devices)} "
                f"devices were given ({devices}); give exactly one device per processor"
            )
        self.devices = devices
        self._placement = DeferredPlacement()
        self.on = self._placement.on

    #: Mesh TensorFlow's name for the laid-out tensor class
    #: (``mesh_impl.LaidOutTensor(slices)``).
    LaidOutTensor = PlacementLaidOutTensor

    def finish_lowering(self) -> None:
        self._placement.flush()

    # -- slicewise ------------------------------------------------------------
    def slicewise(self, fn: Callable[..., Any], *inputs: Any) -> PlacementLaidOutTensor:
        per_input = []
        for x in inputs:
            if isinstance(x, PlacementLaidOutTensor):
                per_input.append(x.slices)
            elif hasattr(x, "to_laid_out_tensor"):
                per_input.append(x.to_laid_out_tensor().slices)
            else:
                per_input.append([x] * self.size)
        out = []
        for p, dev in enumerate(self.devices):
            with self.on(dev):
                out.append(fn(*[s[p] for s in per_input]))
        return PlacementLaidOutTensor(out)

    def slicewise_multi(
        self, fn: Callable[..., Sequence[Any]], n_out: int, *inputs: Any
    ) -> list[PlacementLaidOutTensor]:
        """Like slicewise for a function returning ``n_out`` tensors."""
        combined = self.slicewise(lambda *a: tuple(fn(*a)), *inputs)
        return [
            PlacementLaidOutTensor([s[i] for s in combined.slices])
            for i in range(n_out)
        ]

    # -- collectives -----------------------------------------------------------
    def allreduce(
        self,
        x: PlacementLaidOutTensor,
        mesh_axes: Sequence[int],
        reduction: Reduction | str = "SUM",
    ) -> PlacementLaidOutTensor:
        try:
            how = Reduction.parse(reduction)
        except ValueError as e:
            raise LoweringError(str(e)) from None
        mesh_axes = [a for a in mesh_axes if self.shape[a].size > 1]
        if not mesh_axes:
            return x
        self.record("allreduce", mesh_axes, x.slice_bytes, reduction=how)
        out: list[Any] = [None] * self.size
        for group in self.processor_groups(mesh_axes):
            with self.on(self.devices[group[0]]):
                parts = [x.slices[p] for p in group]
                if how is Reduction.SUM:
                    total = fast_tf.add_n(parts)
                else:
                    total = _COMBINE[how](tf.stack(parts), axis=0)
            # Every device of the group reads the one sum; TensorFlow copies
            # it to the devices that need it (no op of ours per device).
            for p in group:
                out[p] = total
        return PlacementLaidOutTensor(out)

    def allconcat(
        self, x: PlacementLaidOutTensor, mesh_axis: int, concat_axis: int
    ) -> PlacementLaidOutTensor:
        if self.shape[mesh_axis].size == 1:
            return x
        self.record("allconcat", [mesh_axis], x.slice_bytes)
        out: list[Any] = [None] * self.size
        for group in self.processor_groups([mesh_axis]):
            with self.on(self.devices[group[0]]):
                full = tf.concat([x.slices[p] for p in group], axis=concat_axis)
            for p in group:
                out[p] = full
        return PlacementLaidOutTensor(out)

    def _exchange(
        self,
        x: PlacementLaidOutTensor,
        mesh_axis: int,
        split_axis: int,
        combine: Callable[[list[Any]], Any],
    ) -> PlacementLaidOutTensor:
        """Every device of each group along ``mesh_axis`` cuts its slice in
        ``n`` pieces along ``split_axis``; device ``j`` gets ``combine`` of
        the group's ``j``-th pieces (in coordinate order)."""
        n = self.shape[mesh_axis].size
        out: list[Any] = [None] * self.size
        for group in self.processor_groups([mesh_axis]):
            pieces = []
            for p in group:
                with self.on(self.devices[p]):
                    pieces.append(tf.split(x.slices[p], n, axis=split_axis))
            for j, p in enumerate(group):
                with self.on(self.devices[p]):
                    out[p] = combine([pieces[i][j] for i in range(n)])
        return PlacementLaidOutTensor(out)

    def alltoall(
        self,
        x: PlacementLaidOutTensor,
        mesh_axis: int,
        split_axis: int,
        concat_axis: int,
    ) -> PlacementLaidOutTensor:
        if self.shape[mesh_axis].size == 1:
            return x
        self.record("alltoall", [mesh_axis], x.slice_bytes)
        return self._exchange(
            x, mesh_axis, split_axis, lambda ps: tf.concat(ps, axis=concat_axis)
        )

    def reduce_scatter(
        self, x: PlacementLaidOutTensor, mesh_axis: int, split_axis: int
    ) -> PlacementLaidOutTensor:
        """Sums ``x`` over ``mesh_axis`` leaving each device only its shard
        (tensor axis ``split_axis`` cut in ``n``): every device cuts its
        partial sum in ``n`` pieces and device ``j`` of a group adds up the
        group's ``j``-th pieces (one ``add_n`` per shard destination)."""
        if self.shape[mesh_axis].size == 1:
            return x
        self.record("reducescatter", [mesh_axis], x.slice_bytes)
        return self._exchange(x, mesh_axis, split_axis, fast_tf.add_n)

    def allsplit(
        self, x: PlacementLaidOutTensor, mesh_axis: int, split_axis: int
    ) -> PlacementLaidOutTensor:
        n = self.shape[mesh_axis].size
        if n == 1:
            return x
        out = []
        for p, dev in enumerate(self.devices):
            c = self.pnum_to_processor_coordinates(p)[mesh_axis]
            s = x.slices[p]
            # as_list: an int, also where TF1 behaviour makes shape[i] a Dimension
            size = s.shape.as_list()[split_axis] // n
            with self.on(dev):
                begin = [0] * s.shape.rank
                begin[split_axis] = c * size
                sizes = [-1] * s.shape.rank
                sizes[split_axis] = size
                out.append(tf.slice(s, begin, sizes))
        return PlacementLaidOutTensor(out)

    def shift_by_n_processors(
        self, x: PlacementLaidOutTensor, mesh_axis: int, offset: int, wrap: bool
    ) -> PlacementLaidOutTensor:
        """Device at coordinate c receives the slice of coordinate c - offset."""
        n = self.shape[mesh_axis].size
        if n == 1 and wrap:
            return x
        self.record("shift", [mesh_axis], x.slice_bytes)
        out = []
        for p, dev in enumerate(self.devices):
            coords = self.pnum_to_processor_coordinates(p)
            src = coords[mesh_axis] - offset
            with self.on(dev):
                if wrap:
                    coords[mesh_axis] = src % n
                    out.append(
                        tf.identity(
                            x.slices[self.processor_coordinates_to_pnum(coords)]
                        )
                    )
                elif 0 <= src < n:
                    coords[mesh_axis] = src
                    out.append(
                        tf.identity(
                            x.slices[self.processor_coordinates_to_pnum(coords)]
                        )
                    )
                else:
                    out.append(tf.zeros_like(x.slices[p]))
        return PlacementLaidOutTensor(out)

    # -- variables ---------------------------------------------------------------
    def make_variables(
        self, laid: PlacementLaidOutTensor, name: str, trainable: bool
    ) -> list[Any]:
        out = []
        for p, dev in enumerate(self.devices):
            with tf.device(dev):
                out.append(
                    tf.Variable(
                        laid.slices[p], name=f"{name}_slice_{p}", trainable=trainable
                    )
                )
        return out

    def read_variables(self, variables: Sequence[Any]) -> PlacementLaidOutTensor:
        out = []
        for v, dev in zip(variables, self.devices):
            with self.on(dev):
                out.append(fast_tf.read_variable(v))
        return PlacementLaidOutTensor(out)

    def assign_variables(
        self,
        variables: Sequence[Any],
        laid: PlacementLaidOutTensor,
        mode: str = "assign",
    ) -> list[Any]:
        out = []
        for v, s, dev in zip(variables, laid.slices, self.devices):
            with self.on(dev):
                out.append(fast_tf.assign_variable(v, s, mode))
        return out

    # -- import / export ---------------------------------------------------------
    def import_tf_tensor(self, tf_tensor: Any, shape: Any) -> PlacementLaidOutTensor:
        shape = convert_to_shape(shape)
        sizes = self.slice_shape(shape)
        full = tf.convert_to_tensor(tf_tensor)
        if full.shape.rank == 0 and len(shape) == 0:
            return self.slicewise(tf.identity, full)
        out = []
        layout = self.tensor_layout(shape)
        whole = layout.is_fully_replicated
        for p, dev in enumerate(self.devices):
            with self.on(dev):
                if whole:
                    out.append(tf.identity(full))
                else:
                    out.append(tf.slice(full, self.slice_begin(shape, p), sizes))
        return PlacementLaidOutTensor(out)

    def export_to_tf_tensor(self, x: Any, shape: Any) -> Any:
        shape = convert_to_shape(shape)
        x = x.to_laid_out_tensor()
        layout = self.tensor_layout(shape)
        m2t = layout.mesh_axis_to_tensor_axis(self.ndims)
        # Concatenate along each splitting mesh axis, innermost first, taking
        # coordinate 0 on the axes that replicate.
        pieces = {p: x.slices[p] for p in range(self.size)}
        with tf.device(self.devices[0]):
            for m in reversed(range(self.ndims)):
                t = m2t[m]
                new = {}
                for p in pieces:
                    c = self.pnum_to_processor_coordinates(p)
                    if c[m] != 0:
                        continue
                    if t is None:
                        new[p] = pieces[p]
                    else:
                        group = []
                        for i in range(self.shape[m].size):
                            c2 = list(c)
                            c2[m] = i
                            group.append(pieces[self.processor_coordinates_to_pnum(c2)])
                        new[p] = (
                            tf.concat(group, axis=t) if len(group) > 1 else group[0]
                        )
                pieces = new
            (result,) = pieces.values()
            return tf.identity(result)

    def laid_out_pnum(self) -> PlacementLaidOutTensor:
        out = []
        for p, dev in enumerate(self.devices):
            with self.on(dev):
                out.append(tf.constant(p, tf.int32))
        return PlacementLaidOutTensor(out)

    def laid_out_pcoordinate(self, mesh_axis: int) -> PlacementLaidOutTensor:
        out = []
        for p, dev in enumerate(self.devices):
            with self.on(dev):
                out.append(
                    tf.constant(
                        self.pnum_to_processor_coordinates(p)[mesh_axis], tf.int32
                    )
                )
        return PlacementLaidOutTensor(out)
