"""Where a step's time goes: seconds per op class, from TensorFlow's profiler.

:func:`profile_step` runs a compiled step under ``tf.profiler.experimental``
and reads the trace it writes (an ``XSpace`` protobuf): every TensorFlow
kernel that ran is an event named ``scope/name:OpType`` with its duration, on
the thread that ran it.  Kernels are summed by op class (the classes of
:mod:`cost_models.op_classes`, plus ``collective`` for TF's collective ops,
``add_n`` for the placement backend's placed sums, ``transfer`` for copies
between devices) and divided by the steps profiled, so a class's figure is
device-seconds per step.  A kernel's duration is its wall time on its thread,
so where devices share cores (eight logical devices on two) the classes add up
to several times the step's wall time: they say where the time went, in
proportion, not how long the step took.

``mtf-train --profile_ops`` sends these figures with its measured step
(``POST /v1/measurements``, field ``profile``), so a plan's page can show where
the measured time went next to the prediction.

>>> # doctest: +SKIP
>>> profile_step(step, [x, y], steps=2)
{'matmul': 0.0031, 'elementwise': 0.0012, ..., 'total': 0.0061}
"""

from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tensorflow as tf

from mtf_core.errors import ConfigError, LoweringError

#: An op class per TensorFlow op type (oneDNN's ``_Mkl`` and fused variants
#: are looked up without their prefix); anything else is ``elementwise``.
_CLASS_OF_TYPE: dict[str, str] = {}
for _cls, _types in {
    "matmul": "MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum FusedMatMul "
    "Conv2D Conv2DBackpropInput Conv2DBackpropFilter Conv3D NativeMatMul",
    "transcendental": "Exp Log Log1p Expm1 Tanh Sigmoid Rsqrt Sqrt Reciprocal Inv "
    "Softplus Softmax LogSoftmax Erf Sin Cos Elu Selu Gelu Pow",
    "reduce": "Sum Max Min Mean Prod All Any TopKV2 Cumsum ArgMax ArgMin",
    "gather": "GatherV2 ResourceGather GatherNd OneHot UnsortedSegmentSum "
    "ScatterNd TensorScatterAdd Range",
    "random": "RandomUniform RandomStandardNormal TruncatedNormal "
    "StatelessRandomUniformV2 StatelessRandomNormalV2 RandomUniformInt",
    "movement": "ConcatV2 Concat Split SplitV Slice StridedSlice Pad PadV2 Pack "
    "Unpack Transpose Tile Reshape ExpandDims Squeeze BroadcastTo Roll",
    "assign": "AssignVariableOp AssignAddVariableOp AssignSubVariableOp "
    "ReadVariableOp VarHandleOp",
    "collective": "CollectiveReduceV2 CollectiveGatherV2 CollectiveAllToAllV2 "
    "CollectiveBcastSendV2 CollectiveBcastRecvV2 CollectiveReduceScatterV2",
    "add_n": "AddN",
    "transfer": "_Send _Recv _HostSend _HostRecv Identity IdentityN",
}.items():
    for _t in _types.split():
        _CLASS_OF_TYPE[_t] = _cls

#: Op types that only call other kernels (a function call, control flow):
#: their events contain their callees' and would count them twice.
_CALLERS = frozenset(
    "PartitionedCall StatefulPartitionedCall While StatelessWhile If "
    "StatelessIf Case NoOp".split()
)

#: ``scope/name:OpType``: a kernel's trace event (host events such as
#: ``ExecutorState::Process`` or ``EagerLocalExecute: f`` do not match).
_KERNEL = re.compile(r"^[^:\s]+:(?P<type>_?[A-Za-z][A-Za-z0-9_]*)$")


def op_class_of_type(op_type: str) -> str:
    """The class a TensorFlow op type's time counts under."""
    base = op_type.removeprefix("_Mkl").removeprefix("_Fused")
    return _CLASS_OF_TYPE.get(op_type) or _CLASS_OF_TYPE.get(base, "elementwise")


def kernel_seconds(events: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds per op class from ``(event name, seconds)`` pairs; events that
    are not kernels, and kernels that only call others, are left out."""
    out: dict[str, float] = defaultdict(float)
    for name, seconds in events:
        m = _KERNEL.match(name)
        if m is None or m["type"] in _CALLERS:
            continue
        out[op_class_of_type(m["type"])] += seconds
    return dict(out)


def trace_events(logdir: Path) -> list[tuple[str, float]]:
    """``(event name, seconds)`` of every event on the host plane's threads."""
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError as e:  # the generated protobuf moved in this TF version
        raise LoweringError(
            f"TensorFlow {tf.__version__} has no XSpace protobuf module "
            f"(tensorflow.tsl.profiler.protobuf.xplane_pb2): {e}"
        ) from None
    files = sorted(logdir.rglob("*.xplane.pb"))
    if not files:
        raise LoweringError(f"the profiler wrote no trace under {logdir}")
    events: list[tuple[str, float]] = []
    for path in files:
        space: Any = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            names = {k: v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                for ev in line.events:
                    events.append(
                        (names.get(ev.metadata_id, ""), ev.duration_ps * 1e-12)
                    )
    return events


class OpProfile:
    """A profiled span of steps; :attr:`per_class` is filled when it ends."""

    def __init__(self) -> None:
        self.per_class: dict[str, float] = {}

    def per_step(self, steps: int) -> dict[str, float]:
        """Seconds per op class per step over ``steps`` profiled steps, with
        their ``total``."""
        if steps < 1:
            raise ConfigError(f"steps must be at least 1, got {steps}")
        out = {k: v / steps for k, v in sorted(self.per_class.items())}
        out["total"] = sum(out.values())
        return out


@contextmanager
def profiling() -> Iterator[OpProfile]:
    """Profiles everything TensorFlow runs inside the ``with`` block."""
    result = OpProfile()
    with tempfile.TemporaryDirectory(prefix="mtf-profile-") as d:
        tf.profiler.experimental.start(d)
        try:
            yield result
        finally:
            tf.profiler.experimental.stop()
        result.per_class = kernel_seconds(trace_events(Path(d)))


def profile_step(
    step: Callable[..., Any], args: Sequence[Any] = (), steps: int = 2
) -> dict[str, float]:
    """Device-seconds per op class per step of ``step(*args)``, over ``steps``
    profiled calls after one unprofiled warm-up; ``total`` is their sum."""
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    step(*args)
    with profiling() as prof:
        for _ in range(steps):
            step(*args)
    return prof.per_step(steps)
