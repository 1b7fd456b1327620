"""TensorFlow's collective ops, wrapped for the SPMD backend.

The SPMD backend (:mod:`mtf_core.lowering.spmd`) traces one program and runs it
on every device; devices meet in TensorFlow's collective ops
(``CollectiveReduceV2``, ``CollectiveGatherV2``, ``CollectiveAllToAllV2``,
``CollectiveBcastSendV2``/``RecvV2``).  Those ops have traps, each handled here:

* **Keys.** A collective is identified by ``(group_key, instance_key)``.  The
  group key names a *set of devices* and must mean the same set for the life of
  the process (and in every process of a cluster), so it is a hash of the
  sorted device names, checked for collisions.  The instance key names one call
  site and is pinned to the first shape it sees, so every call site traced gets
  a fresh one from a process-wide counter.  Every process of a multi-process
  mesh traces the same programs in the same order, so they agree on the keys.
* **Ordering.** Inside a ``tf.function`` the executor may start independent
  collectives in any order; two devices starting them in different orders
  deadlock.  Every device passes its own ``ordering_token`` (a resource, see
  :mod:`spmd_variables`), which makes automatic control dependencies run its
  collectives in program order.
* **Ranks.** Gathers and all-to-alls order their blocks by the rank TensorFlow
  gives each member: devices sorted by (job, replica, task, type, index).  Mesh
  coordinates may differ from that order (any device list is allowed), so
  :class:`AxisGroups` keeps the permutation and the backend reorders blocks.
* **Dtypes.** The CPU kernels take float16/32/64 and int32/64, and bfloat16
  only for reduce and all-to-all (gather and broadcast refuse it).  Where a
  collective only moves bits (gather, all-to-all, broadcast), another 16-bit
  dtype travels *bitcast* to float16: bfloat16 activations are gathered in
  their own 2 bytes, so what is sent is what the counters (and the cost
  model) say.  Where it adds (reduce), a dtype the kernel lacks is widened to
  a carrier that holds it exactly (bool and small ints as int32).
* **No gradients** are needed: mtf differentiates its own graph.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from mtf_core.comm import CollectiveKind
from mtf_core.errors import LoweringError

_lock = threading.Lock()
_group_members: dict[int, tuple[str, ...]] = {}
_instance_keys = itertools.count(1)


# -- device names -----------------------------------------------------------
DeviceKey = tuple[str, int, int, str, int]


def parse_device(
    name: str, default_job: str = "localhost", default_task: int = 0
) -> DeviceKey:
    """``(job, replica, task, type, index)`` of a device name; missing parts take
    the defaults (a bare ``/device:CPU:3`` is on the local task)."""
    try:
        spec = tf.DeviceSpec.from_string(name)
    except ValueError as e:
        raise LoweringError(
            f"device {name!r} is not a TensorFlow device name: {e}"
        ) from None
    if spec.device_type is None:
        raise LoweringError(
            f"device {name!r} names no device type; expected e.g. '/device:CPU:0'"
        )
    return (
        spec.job or default_job,
        spec.replica or 0,
        default_task if spec.task is None else spec.task,
        spec.device_type.upper(),
        spec.device_index or 0,
    )


def full_device_name(parsed: DeviceKey) -> str:
    job, replica, task, kind, index = parsed
    return f"/job:{job}/replica:{replica}/task:{task}/device:{kind}:{index}"


# -- keys -------------------------------------------------------------------
def group_key(members: Sequence[str]) -> int:
    """The group key of a set of (full) device names, the same in every process."""
    canon = tuple(sorted(members))
    key = (zlib.crc32("|".join(canon).encode()) & 0x3FFFFFFF) + 1
    with _lock:
        seen = _group_members.setdefault(key, canon)
    if seen != canon:
        raise LoweringError(
            f"collective group key {key} would name two device groups ({seen} and "
            f"{canon}); this hash collision is vanishingly rare: reorder or rename "
            "the devices"
        )
    return key


def next_instance_key() -> int:
    """A fresh instance key for one collective call site."""
    with _lock:
        return next(_instance_keys)


# -- processor groups -------------------------------------------------------
@dataclass(frozen=True)
class AxisGroups:
    """The groups of one collective over ``mesh_axes``, looked up by pnum.

    ``group_keys[p]`` is the key of pnum p's group; ``coord_to_rank[p][k]`` is
    the rank (block index in a gather) of the k-th member of p's group in mesh
    coordinate order, and ``rank_to_coord`` its inverse.  ``identity_ranks``
    says they are the identity for every group (the usual case, when devices
    are listed in TensorFlow's order), so no reordering is needed.
    """

    mesh_axes: tuple[int, ...]
    group_size: int
    group_keys: tuple[int, ...]
    coord_to_rank: tuple[tuple[int, ...], ...]
    rank_to_coord: tuple[tuple[int, ...], ...]
    position: tuple[int, ...]  # pnum's index in its group (coordinate order)

    @property
    def identity_ranks(self) -> bool:
        ident = tuple(range(self.group_size))
        return all(r == ident for r in self.coord_to_rank)

    @property
    def single_group(self) -> bool:
        return len(set(self.group_keys)) == 1

    @classmethod
    def build(
        cls,
        groups: Sequence[Sequence[int]],
        devices: Sequence[str],
        sort_keys: Sequence[tuple[Any, ...]],
        mesh_axes: Sequence[int],
    ) -> AxisGroups:
        size = len(devices)
        keys = [0] * size
        c2r: list[tuple[int, ...]] = [()] * size
        r2c: list[tuple[int, ...]] = [()] * size
        pos = [0] * size
        for group in groups:
            key = group_key([devices[p] for p in group])
            by_rank = sorted(range(len(group)), key=lambda k: sort_keys[group[k]])
            to_rank = [0] * len(group)
            for r, k in enumerate(by_rank):
                to_rank[k] = r
            for k, p in enumerate(group):
                keys[p] = key
                c2r[p] = tuple(to_rank)
                r2c[p] = tuple(by_rank)
                pos[p] = k
        return cls(
            tuple(mesh_axes),
            len(groups[0]),
            tuple(keys),
            tuple(c2r),
            tuple(r2c),
            tuple(pos),
        )


# -- dtype carriers -----------------------------------------------------------
_NATIVE = frozenset({tf.float16, tf.float32, tf.float64, tf.int32, tf.int64})
#: Kinds whose kernels take bfloat16 as well.
_BFLOAT16_KINDS = frozenset({"allreduce", "alltoall"})
#: Kinds that only move bits (no arithmetic): any 16-bit dtype may travel
#: bitcast to float16, in its own bytes.
_MOVES_ONLY = frozenset({"allgather", "alltoall", "broadcast"})
_WIDEN = {
    tf.bool: tf.int32,
    tf.int8: tf.int32,
    tf.uint8: tf.int32,
    tf.int16: tf.int32,
    tf.uint16: tf.int32,
    tf.uint32: tf.int64,
    tf.bfloat16: tf.float32,
}


def carrier_dtype(dtype: tf.DType, kind: str) -> tf.DType:
    """The dtype a tensor of ``dtype`` travels in through collective ``kind``
    (``allreduce``, ``allgather``, ``alltoall`` or ``broadcast``).  A carrier
    of ``dtype``'s size holds its bits (a bitcast); a wider one its value."""
    if dtype in _NATIVE or (dtype == tf.bfloat16 and kind in _BFLOAT16_KINDS):
        return dtype
    if kind in _MOVES_ONLY and dtype.size == tf.float16.size:
        return tf.float16
    if dtype in _WIDEN:
        return _WIDEN[dtype]
    raise LoweringError(
        f"TensorFlow's collective ops cannot carry dtype {dtype.name}; expected "
        "a float, integer or bool tensor"
    )


def _in_carrier(x: Any, kind: str) -> tuple[Any, tf.DType]:
    c = carrier_dtype(x.dtype, kind)
    if c == x.dtype:
        return x, x.dtype
    if c.size == x.dtype.size:
        return tf.bitcast(x, c), x.dtype
    return tf.cast(x, c), x.dtype


def _out_of_carrier(y: Any, dtype: tf.DType) -> Any:
    if y.dtype == dtype:
        return y
    if y.dtype.size == dtype.size:
        return tf.bitcast(y, dtype)
    return tf.cast(y, dtype)


# -- the ops ----------------------------------------------------------------
#: The name of the ``tf.cond`` that sends or receives a broadcast.
BROADCAST_NAME = "collective_broadcast"
_MERGE = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}


@dataclass(frozen=True)
class Channel:
    """What one device passes to every collective: its group and its token."""

    group_size: int
    group_key: Any  # int or scalar int32 tensor (differs per device)
    token: Any  # resource handle
    timeout_s: float = 0.0


def all_reduce(x: Any, ch: Channel, reduction: str) -> Any:
    """Reduces ``x`` over the group: SUM, MAX, MIN, LOGICAL_OR, LOGICAL_AND."""
    if reduction == "LOGICAL_OR" or reduction == "LOGICAL_AND":
        merge = "Max" if reduction == "LOGICAL_OR" else "Min"
    elif reduction in _MERGE:
        merge = _MERGE[reduction]
    else:
        raise LoweringError(
            f"unknown reduction {reduction!r}; expected one of "
            f"{sorted([*_MERGE, 'LOGICAL_AND', 'LOGICAL_OR'])}"
        )
    x, dtype = _in_carrier(x, "allreduce")
    y = tf.raw_ops.CollectiveReduceV2(
        input=x,
        group_size=ch.group_size,
        group_key=ch.group_key,
        instance_key=next_instance_key(),
        ordering_token=[ch.token],
        merge_op=merge,
        final_op="Id",
        timeout_seconds=ch.timeout_s,
    )
    return _out_of_carrier(y, dtype)


def all_gather(x: Any, ch: Channel) -> Any:
    """Concatenates every member's ``x`` along axis 0, in rank order."""
    x, dtype = _in_carrier(x, "allgather")
    y = tf.raw_ops.CollectiveGatherV2(
        input=x,
        group_size=ch.group_size,
        group_key=ch.group_key,
        instance_key=next_instance_key(),
        ordering_token=[ch.token],
        timeout_seconds=ch.timeout_s,
    )
    return _out_of_carrier(y, dtype)


def all_to_all(x: Any, ch: Channel) -> Any:
    """Block r of axis 0 goes to rank r; the result stacks what each rank sent
    here, in rank order."""
    x, dtype = _in_carrier(x, "alltoall")
    y = tf.raw_ops.CollectiveAllToAllV2(
        input=x,
        group_size=ch.group_size,
        group_key=ch.group_key,
        instance_key=next_instance_key(),
        ordering_token=[ch.token],
        timeout_seconds=ch.timeout_s,
    )
    return _out_of_carrier(y, dtype)


def broadcast(x: Any, is_source: Any, ch: Channel) -> Any:
    """Every member gets the ``x`` of the member whose ``is_source`` is true.

    Broadcast ops take no ordering token, so each branch first writes the
    token (adds 0): that puts the broadcast in the token's chain, in program
    order with the other collectives.
    """
    xc, dtype = _in_carrier(x, "broadcast")
    key = next_instance_key()
    common = dict(
        group_size=ch.group_size,
        group_key=ch.group_key,
        instance_key=key,
        timeout_seconds=ch.timeout_s,
    )

    def in_order() -> Any:
        return tf.raw_ops.AssignAddVariableOp(resource=ch.token, value=tf.constant(0.0))

    def send() -> Any:
        with tf.control_dependencies([in_order()]):
            return tf.raw_ops.CollectiveBcastSendV2(input=xc, **common)

    def recv() -> Any:
        with tf.control_dependencies([in_order()]):
            return tf.raw_ops.CollectiveBcastRecvV2(
                shape=xc.shape, T=xc.dtype, **common
            )

    y = tf.cond(is_source, send, recv, name=BROADCAST_NAME)
    y.set_shape(xc.shape)
    return _out_of_carrier(y, dtype)


# -- what a traced program sends --------------------------------------------
#: The TensorFlow op each counted kind is built from on this backend.
OP_OF_KIND: dict[str, str] = {
    CollectiveKind.ALLREDUCE: "CollectiveReduceV2",
    CollectiveKind.ALLCONCAT: "CollectiveGatherV2",
    CollectiveKind.SHIFT: "CollectiveGatherV2",
    CollectiveKind.ALLTOALL: "CollectiveAllToAllV2",
    CollectiveKind.REDUCE_SCATTER: "CollectiveAllToAllV2",
    CollectiveKind.BROADCAST: "CollectiveBcastV2",
}
_SENDING_OPS = frozenset(
    {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveAllToAllV2"}
)


@dataclass(frozen=True)
class SentCollective:
    """One collective op of a traced program: what each device puts in."""

    op_type: str  # a value of OP_OF_KIND
    dtype: str  # the dtype it travels in (the carrier)
    bytes_per_device: int


def sent_collectives(graph: Any) -> list[SentCollective]:
    """The collective ops of a traced program (a ``tf.Graph``, e.g. a concrete
    function's ``.graph``), with the dtype and bytes of each device's input,
    in graph order.  A broadcast is the ``tf.cond`` that sends or receives it.
    The counters record the same bytes (the slice a device contributes), so
    this is what checks that they, and the cost model, count what is sent.
    """
    out = []
    for op in graph.get_operations():
        if op.type in _SENDING_OPS:
            t = op.inputs[0]
        elif op.type in ("If", "StatelessIf") and op.name.rsplit("/", 1)[-1].startswith(
            BROADCAST_NAME
        ):
            t = op.outputs[0]
        else:
            continue
        n = t.shape.num_elements()
        if n is None:
            raise LoweringError(
                f"collective {op.name} carries a tensor of unknown shape {t.shape}"
            )
        kind = "CollectiveBcastV2" if op.type.endswith("If") else op.type
        out.append(SentCollective(kind, t.dtype.name, int(n * t.dtype.size)))
    return out
