"""SimdMeshImpl: the SPMD backend.  One program, traced once, run on every device.

Inside a per-replica program a laid-out tensor is *one* tensor, this device's
slice (:class:`ReplicaTensor`); the device's processor number is a tensor
argument, so slice offsets, group keys and coordinates are computed from it at
run time, and the traced program does not depend on which device runs it.
Devices meet in TensorFlow's collective ops (:mod:`spmd_collectives`).  The
program is traced as one ``tf.function`` and called once per device from an
outer function (:mod:`spmd_compiled`), so graph size and lowering time stay
flat as the mesh grows, where :class:`PlacementMeshImpl` emits one op per
device.

Outside a replica program (eager debugging, the variable store) a laid-out
tensor is this process's slices, by pnum (:class:`LocalSlices`); slice-local
work runs device by device, and each collective runs as a small SPMD program.

Primitive by primitive (mesh axis of size n, the slice's bytes ``b``):

=====================  ===========================================  =========
primitive              TensorFlow collective                        traffic
=====================  ===========================================  =========
allreduce              CollectiveReduceV2 (Add/Max/Min)             as TF's
allconcat              CollectiveGatherV2, blocks put in mesh order n*b in
alltoall               CollectiveAllToAllV2                         b
shift (permute)        CollectiveGatherV2, then pick the source     n*b in
reduce_scatter         CollectiveAllToAllV2, then a local sum       b
broadcast              CollectiveBcastSendV2 / RecvV2               b
allsplit               none: a slice at this device's offset        0
=====================  ===========================================  =========

CPU has no CollectivePermute or ReduceScatter kernel, hence the constructions.
Counters record what :class:`PlacementMeshImpl` records (the slice bytes per
device), so cost models read both backends alike; the collective ops carry
exactly those bytes (bfloat16 included: bitcast to float16 where a kernel
refuses it), except bool and 8-bit values, and 16-bit integers in
allreduces, which travel widened to int32
(:func:`spmd_collectives.sent_collectives` lists what a program sends).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from mtf_core.comm import CollectiveKind, Reduction
from mtf_core.errors import LoweringError
from mtf_core.lowering import cluster
from mtf_core.lowering import spmd_collectives as coll
from mtf_core.lowering import spmd_variables as sv
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.spmd_values import (
    LocalSlices,
    Replica,
    ReplicaTensor,
    local_slices_of,
    wrap_replica,
)
from mtf_core.shapes import convert_to_shape


class SimdMeshImpl(MeshImpl):
    """SPMD mesh implementation over TensorFlow's collective ops.

    Args:
      shape: mesh shape, e.g. ``"rows:2;cols:4"``.
      layout: layout rules, e.g. ``"batch:rows;hidden:cols"``.
      devices: one device per processor, pnum order; may span processes (full
        names such as ``/job:worker/replica:0/task:1/device:CPU:0``, see
        :func:`mtf_core.lowering.cluster.initialize`).  Default: this process's
        first logical CPUs.
      collective_timeout_s: fail a collective that has not completed after this
        long (0: wait forever), so a peer that never arrives raises instead of
        hanging.

    >>> # doctest: +SKIP
    >>> impl = SimdMeshImpl("rows:2;cols:2", "batch:rows;hidden:cols", devices[:4])
    >>> step = mtf.compile_function(graph, {mesh: impl}, [x], [loss], updates)
    """

    is_spmd = True

    def __init__(
        self,
        shape: Any,
        layout: Any,
        devices: Sequence[Any] | None = None,
        collective_timeout_s: float = 0.0,
    ) -> None:
        super().__init__(shape, layout)
        job, task = cluster.local_task()
        if devices is None:
            devices = _default_devices(self.size)
        names = [getattr(d, "name", d) for d in devices]
        if len(names) != self.size:
            raise LoweringError(
                f"mesh [{self.shape}] has {self.size} processors but {len(names)} "
                f"devices were given ({names}); give exactly one device per processor"
            )
        for d in names:
            if not isinstance(d, str):
                raise LoweringError(f"device {d!r} is not a name such as '/cpu:0'")
        parsed = [coll.parse_device(d, job, task) for d in names]
        self.devices = [coll.full_device_name(p) for p in parsed]
        if len(set(self.devices)) != len(self.devices):
            raise LoweringError(
                f"devices {names} name one device twice; each processor needs its "
                "own device"
            )
        self._sort_keys = parsed
        self.local_pnums = [
            p for p, d in enumerate(parsed) if (d[0], d[2]) == (job, task)
        ]
        if not self.local_pnums:
            raise LoweringError(
                f"none of the mesh devices {self.devices} belongs to this process "
                f"(/job:{job}/task:{task})"
            )
        self.collective_timeout_s = float(collective_timeout_s)
        self._groups: dict[tuple[int, ...], coll.AxisGroups] = {}
        self._replica: Replica | None = None

    # -- where we are --------------------------------------------------------
    @property
    def all_local(self) -> bool:
        return len(self.local_pnums) == self.size

    @contextlib.contextmanager
    def replica(self, pnum: Any, token: Any = None) -> Iterator[Replica]:
        """Lowers for one device: the context of the per-replica trace.

        ``pnum`` is a scalar int32 tensor; ``token`` the resource that orders
        the device's collectives (see :meth:`ordering_token`).
        """
        saved, self._replica = self._replica, Replica(pnum, token)
        try:
            yield self._replica
        finally:
            self._replica = saved

    def ordering_token(self, pnum: int) -> Any:
        """Device ``pnum``'s ordering token: pass it to its replica program."""
        return sv.ordering_token(self.devices[pnum])

    def axis_groups(self, mesh_axes: Sequence[int]) -> coll.AxisGroups:
        key = tuple(sorted(mesh_axes))
        if key not in self._groups:
            self._groups[key] = coll.AxisGroups.build(
                self.processor_groups(key), self.devices, self._sort_keys, key
            )
        return self._groups[key]

    def _pnum(self) -> Any:
        assert self._replica is not None
        return self._replica.pnum

    def _coordinate(self, mesh_axis: int) -> Any:
        stride = math.prod(d.size for d in self.shape.dims[mesh_axis + 1 :])
        return (self._pnum() // stride) % self.shape[mesh_axis].size

    def _row(self, table: Sequence[Any]) -> Any:
        """This device's entry of a per-pnum table."""
        return tf.gather(tf.constant(table, tf.int32), self._pnum())

    def _channel(self, groups: coll.AxisGroups) -> coll.Channel:
        assert self._replica is not None
        key = (
            groups.group_keys[0]
            if groups.single_group
            else self._row(groups.group_keys)
        )
        return coll.Channel(
            groups.group_size, key, self._replica.token, self.collective_timeout_s
        )

    # -- running replica code ------------------------------------------------
    def _apply(
        self, fn: Callable[..., Any], inputs: Sequence[Any], communicates: bool
    ) -> Any:
        """Runs ``fn`` (tensors of one device -> tensor(s)) on every device.

        In a replica program that is one call.  Outside, slice-local ``fn`` runs
        device by device; a communicating one runs as a small SPMD program,
        since collectives issued one device at a time would wait forever.
        """
        laid = [x.to_laid_out_tensor() for x in inputs]
        if self._replica is not None:
            for x in laid:
                if not isinstance(x, ReplicaTensor):
                    raise LoweringError(f"{x!r} is not a slice of this replica program")
            return wrap_replica(fn(*[x.tensor for x in laid]))
        for x in laid:
            if not isinstance(x, LocalSlices):
                raise LoweringError(f"{x!r} is not a laid-out tensor of this mesh")
        if communicates:
            per_device = self.run_program(fn, laid)
        else:
            per_device = {}
            for p in self.local_pnums:
                with tf.device(self.devices[p]), self.replica(tf.constant(p)):
                    per_device[p] = fn(*[x.slices[p] for x in laid])
        return local_slices_of(per_device, self.size)

    def run_program(
        self, fn: Callable[..., Any], inputs: Sequence[LocalSlices]
    ) -> dict[int, Any]:
        """Runs ``fn`` as one SPMD program on this process's devices.

        ``fn`` takes one device's slices (tensors) and returns a tensor or a
        tuple; it is traced once, inside :meth:`replica`, so it may call this
        mesh's primitives on :class:`ReplicaTensor`.  Returns ``{pnum: result}``
        for the local devices.  Every process of the mesh must run it too.
        """
        specs = [tf.TensorSpec(x.first.shape, x.first.dtype) for x in inputs]

        def body(pnum: Any, token: Any, *tensors: Any) -> Any:
            with self.replica(pnum, token):
                return fn(*tensors)

        inner = tf.function(body, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.resource), *specs
        )
        tokens = {p: self.ordering_token(p) for p in self.local_pnums}

        def launch() -> list[Any]:
            outs = []
            for p in self.local_pnums:
                with tf.device(self.devices[p]):
                    args = [x.slices[p] for x in inputs]
                    outs.append(inner(tf.constant(p), tokens[p], *args))
            return outs

        # A concrete function: tracing a new launcher per call is expected here.
        results = tf.function(launch, autograph=False).get_concrete_function()()
        return dict(zip(self.local_pnums, results))

    # -- slicewise -----------------------------------------------------------
    def slicewise(self, fn: Callable[..., Any], *inputs: Any) -> Any:
        laid = [i for i, x in enumerate(inputs) if hasattr(x, "to_laid_out_tensor")]
        consts = list(inputs)

        def local(*slices: Any) -> Any:
            args = list(consts)
            for i, s in zip(laid, slices):
                args[i] = s
            return fn(*args)

        return self._apply(local, [inputs[i] for i in laid], communicates=False)

    def slicewise_multi(
        self, fn: Callable[..., Sequence[Any]], n_out: int, *inputs: Any
    ) -> list[Any]:
        """Like slicewise for a function returning ``n_out`` tensors."""
        out = self.slicewise(lambda *a: tuple(fn(*a)), *inputs)
        return list(out)

    # -- collectives -----------------------------------------------------------
    def allreduce(
        self, x: Any, mesh_axes: Sequence[int], reduction: Reduction | str = "SUM"
    ) -> Any:
        try:
            reduction = Reduction.parse(reduction)
        except ValueError as e:
            raise LoweringError(str(e)) from None
        mesh_axes = [a for a in mesh_axes if self.shape[a].size > 1]
        if not mesh_axes:
            return x
        x = x.to_laid_out_tensor()
        self.record("allreduce", mesh_axes, x.slice_bytes, reduction=reduction)
        groups = self.axis_groups(mesh_axes)
        return self._apply(
            lambda t: coll.all_reduce(t, self._channel(groups), reduction),
            [x],
            communicates=True,
        )

    def allconcat(self, x: Any, mesh_axis: int, concat_axis: int) -> Any:
        if self.shape[mesh_axis].size == 1:
            return x
        x = x.to_laid_out_tensor()
        self.record("allconcat", [mesh_axis], x.slice_bytes)
        return self._apply(
            lambda t: self._gather_along(t, mesh_axis, concat_axis),
            [x],
            communicates=True,
        )

    def _gather_along(self, t: Any, mesh_axis: int, concat_axis: int) -> Any:
        groups = self.axis_groups([mesh_axis])
        n = groups.group_size
        rank = t.shape.rank
        perm = [concat_axis] + [i for i in range(rank) if i != concat_axis]
        front = tf.transpose(t, perm) if concat_axis else t
        blocks = coll.all_gather(tf.expand_dims(front, 0), self._channel(groups))
        if not groups.identity_ranks:
            blocks = tf.gather(blocks, self._row(groups.coord_to_rank))
        shape = front.shape.as_list()
        full = tf.reshape(blocks, [n * shape[0]] + shape[1:])
        if concat_axis:
            full = tf.transpose(full, [perm.index(i) for i in range(rank)])
        return full

    def alltoall(
        self, x: Any, mesh_axis: int, split_axis: int, concat_axis: int
    ) -> Any:
        n = self.shape[mesh_axis].size
        if n == 1:
            return x
        x = x.to_laid_out_tensor()
        self.record("alltoall", [mesh_axis], x.slice_bytes)
        groups = self.axis_groups([mesh_axis])

        def fn(t: Any) -> Any:
            pieces = tf.stack(tf.split(t, n, axis=split_axis))  # k: for coordinate k
            if not groups.identity_ranks:
                pieces = tf.gather(pieces, self._row(groups.rank_to_coord))
            got = coll.all_to_all(pieces, self._channel(groups))  # r: from rank r
            if not groups.identity_ranks:
                got = tf.gather(got, self._row(groups.coord_to_rank))
            return tf.concat(tf.unstack(got, n), axis=concat_axis)

        return self._apply(fn, [x], communicates=True)

    def allsplit(self, x: Any, mesh_axis: int, split_axis: int) -> Any:
        n = self.shape[mesh_axis].size
        if n == 1:
            return x

        def fn(t: Any) -> Any:
            size = t.shape.as_list()[split_axis] // n  # an int under TF1 too
            begin = [0] * t.shape.rank
            begin[split_axis] = self._coordinate(mesh_axis) * size
            sizes = t.shape.as_list()
            sizes[split_axis] = size
            return tf.slice(t, tf.stack(begin), sizes)

        return self._apply(fn, [x], communicates=False)

    def shift_by_n_processors(
        self, x: Any, mesh_axis: int, offset: int, wrap: bool
    ) -> Any:
        """Device at coordinate c receives the slice of coordinate c - offset
        (a collective permute, built from a gather: CPU has no permute kernel)."""
        n = self.shape[mesh_axis].size
        if n == 1 and wrap:
            return x
        x = x.to_laid_out_tensor()
        self.record("shift", [mesh_axis], x.slice_bytes)
        if n == 1:
            return self._apply(tf.zeros_like, [x], communicates=False)
        groups = self.axis_groups([mesh_axis])

        def fn(t: Any) -> Any:
            src = self._coordinate(mesh_axis) - offset
            valid = tf.logical_and(src >= 0, src < n)
            src = src % n
            blocks = coll.all_gather(tf.expand_dims(t, 0), self._channel(groups))
            rank = tf.gather(self._row(groups.coord_to_rank), src)
            got = tf.gather(blocks, rank)
            return got if wrap else tf.where(valid, got, tf.zeros_like(got))

        return self._apply(fn, [x], communicates=True)

    def reduce_scatter(self, x: Any, mesh_axis: int, split_axis: int) -> Any:
        """Sums over ``mesh_axis`` and keeps this device's part of ``split_axis``
        (an allreduce followed by an allsplit, in 1/n of the traffic)."""
        n = self.shape[mesh_axis].size
        if n == 1:
            return x
        x = x.to_laid_out_tensor()
        # The same kind the placement backend records and the cost model prices.
        self.record(
            CollectiveKind.REDUCE_SCATTER, [mesh_axis], x.slice_bytes, reduction="SUM"
        )
        groups = self.axis_groups([mesh_axis])

        def fn(t: Any) -> Any:
            pieces = tf.stack(tf.split(t, n, axis=split_axis))
            if not groups.identity_ranks:
                pieces = tf.gather(pieces, self._row(groups.rank_to_coord))
            return tf.reduce_sum(coll.all_to_all(pieces, self._channel(groups)), 0)

        return self._apply(fn, [x], communicates=True)

    def broadcast(self, x: Any, mesh_axes: Sequence[int]) -> Any:
        """Every device gets the slice of the device at coordinate 0 of
        ``mesh_axes`` (same coordinates elsewhere)."""
        mesh_axes = [a for a in mesh_axes if self.shape[a].size > 1]
        if not mesh_axes:
            return x
        x = x.to_laid_out_tensor()
        self.record("broadcast", mesh_axes, x.slice_bytes)
        groups = self.axis_groups(mesh_axes)

        def fn(t: Any) -> Any:
            is_source = tf.equal(self._row(groups.position), 0)
            return coll.broadcast(t, is_source, self._channel(groups))

        return self._apply(fn, [x], communicates=True)

    # -- processor numbers -----------------------------------------------------
    def laid_out_pnum(self) -> Any:
        return self._apply(lambda: tf.identity(self._pnum()), [], communicates=False)

    def laid_out_pcoordinate(self, mesh_axis: int) -> Any:
        return self._apply(
            lambda: tf.identity(self._coordinate(mesh_axis)), [], communicates=False
        )

    # -- import / export ---------------------------------------------------------
    def import_tf_tensor(self, tf_tensor: Any, shape: Any) -> Any:
        shape = convert_to_shape(shape)
        sizes = self.slice_shape(shape)
        layout = self.tensor_layout(shape)
        full = tf.convert_to_tensor(tf_tensor)

        def fn() -> Any:
            if layout.is_fully_replicated:
                return tf.identity(full)
            begin = [
                0 if m is None else self._coordinate(m) * size
                for m, size in zip(layout, sizes)
            ]
            return tf.slice(full, tf.stack(begin), sizes)

        return self._apply(fn, [], communicates=False)

    def export_to_tf_tensor(self, x: Any, shape: Any) -> Any:
        """The full value.  In a replica program every device gets it (gathers
        that are not counted: exporting is not the model's communication, as
        in placement); outside, this process's first device."""
        shape = convert_to_shape(shape)
        x = x.to_laid_out_tensor()
        m2t = self.tensor_layout(shape).mesh_axis_to_tensor_axis(self.ndims)
        split = [(m, t) for m, t in enumerate(m2t) if t is not None]
        if self._replica is None and self.all_local:
            return self._assemble(x, split)

        def fn(t: Any) -> Any:
            for m, axis in split:
                t = self._gather_along(t, m, axis)
            return t

        out = self._apply(fn, [x], communicates=bool(split))
        if isinstance(out, ReplicaTensor):
            return out.tensor
        return out.slices[self.local_pnums[0]]

    def _assemble(self, x: LocalSlices, split: list[tuple[int, int]]) -> Any:
        """Concatenates the slices (all in this process) on the first device."""

        def build(coords: list[int], k: int) -> Any:
            if k == len(split):
                return x.slices[self.processor_coordinates_to_pnum(coords)]
            m, axis = split[k]
            parts = []
            for i in range(self.shape[m].size):
                c = list(coords)
                c[m] = i
                parts.append(build(c, k + 1))
            return tf.concat(parts, axis=axis)

        with tf.device(self.devices[self.local_pnums[0]]):
            return tf.identity(build([0] * self.ndims, 0))

    # -- variables ---------------------------------------------------------------
    def make_variables(self, laid: Any, name: str, trainable: bool) -> list[Any]:
        """Named slices (see :mod:`spmd_variables`) on this process's devices."""
        if self._replica is not None:
            raise LoweringError(
                f"variable {name}: SPMD variables are made outside the replica "
                "program (by a VariableStore)"
            )
        laid = laid.to_laid_out_tensor()
        return sv.slice_variables(laid.slices, self.devices, name)

    def read_variables(self, variables: Sequence[Any]) -> Any:
        v0 = sv.first(variables)
        if self._replica is None:
            out: list[Any] = [None] * self.size
            for p in self.local_pnums:
                out[p] = variables[p].read_value()
            return LocalSlices(out)
        handle = self._replica.open(v0.shared_name, v0.open)
        value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=v0.dtype)
        value.set_shape(v0.shape)
        return ReplicaTensor(value)

    def assign_variables(
        self, variables: Sequence[Any], laid: Any, mode: str = "assign"
    ) -> list[Any]:
        if mode not in ("assign", "add", "sub"):
            raise LoweringError(f"assign mode {mode!r}: expected assign, add or sub")
        v0 = sv.first(variables)
        laid = laid.to_laid_out_tensor()
        if self._replica is None:
            methods = {"assign": "assign", "add": "assign_add", "sub": "assign_sub"}
            return [
                getattr(variables[p], methods[mode])(laid.slices[p])
                for p in self.local_pnums
            ]
        op = {
            "assign": tf.raw_ops.AssignVariableOp,
            "add": tf.raw_ops.AssignAddVariableOp,
            "sub": tf.raw_ops.AssignSubVariableOp,
        }[mode]
        handle = self._replica.open(v0.shared_name, v0.open)
        return [op(resource=handle, value=laid.tensor)]


def _default_devices(n: int) -> list[str]:
    spec = cluster.active_cluster()
    if spec is not None:
        raise LoweringError(
            "a mesh on a cluster needs its devices listed; use the list that "
            "mtf_core.lowering.cluster.initialize returned"
        )
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(cpus) < n:
        raise LoweringError(
            f"a mesh of {n} processors needs {n} devices; this process has "
            f"{len(cpus)} logical CPUs (see mtf.logical_devices)"
        )
    return cpus[:n]
