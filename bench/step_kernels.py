"""Where one layout's step goes: TensorFlow kernels by type and shape.

Compiles one step of a benchmark workload (``bench/fidelity.py``'s) or of a
calibration sweep point on 8 logical CPU devices, times it by the CPU clock
(process CPU seconds of the fastest of ``--steps``), and prints the kernels
TensorFlow's profiler saw in two more steps, summed per op type and shapes,
in milliseconds per step.  With ``--serial`` TensorFlow runs one kernel at a
time on one thread (inter- and intra-op parallelism 1): each kernel's time
is then its own, not stretched by the others sharing the cores, and the
step's CPU time is what the kernels cost without the devices running at
once (compare it with a run without ``--serial``).

    .venv/bin/python bench/step_kernels.py mlp all:8 hidden_0:all --serial
    .venv/bin/python bench/step_kernels.py --point tiny-lm-model --serial
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def compiled(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The compiled step and its arguments."""
    import numpy as np

    import mtf_core as mtf

    devices = mtf.logical_devices(8)
    if args.point:
        from mtf_core.lowering.calibration_sweep import sweep_points

        points = {p.name: p for p in sweep_points(8)}
        if args.point not in points:
            raise SystemExit(
                f"unknown sweep point {args.point!r}; known: {sorted(points)}"
            )
        pt = points[args.point]
        graph, outputs, updates = pt.build(8)
        (mesh,) = {op.mesh for op in graph.operations}
        mesh_shape, rules = pt.mesh(8), pt.rules
        inputs = [
            op.outputs[0]
            for op in graph.operations
            if getattr(op, "is_placeholder", False)
        ]
        feeds = [np.zeros(t.shape.to_integer_list(), dtype=t.dtype) for t in inputs]
    else:
        from fidelity import build
        from fidelity import feeds as random_feeds

        if not (args.workload and args.mesh and args.rules is not None):
            raise SystemExit("give WORKLOAD MESH RULES, or --point NAME")
        model = build(args.workload)
        graph, mesh, inputs = model.graph, model.mesh, model.placeholders
        outputs, updates = [model.loss], list(model.updates)
        mesh_shape, rules = args.mesh, args.rules
        feeds = random_feeds(model)
    impl_cls = mtf.SimdMeshImpl if args.backend == "spmd" else mtf.PlacementMeshImpl
    impl = impl_cls(mesh_shape, rules, devices)
    fn = mtf.compile_function(graph, {mesh: impl}, inputs, outputs, updates)
    return fn, feeds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", nargs="?", help="lm, mlp or wide")
    p.add_argument("mesh", nargs="?", help="e.g. all:8")
    p.add_argument("rules", nargs="?", help="layout rules ('' for replicated)")
    p.add_argument("--point", help="a calibration sweep point instead")
    p.add_argument("--backend", choices=("placement", "spmd"), default="placement")
    p.add_argument("--serial", action="store_true", help="one kernel at a time")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--top", type=int, default=25, help="kernel rows to print")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from mtf_core.lowering.op_profile import _CALLERS, _KERNEL, trace_events

    if args.serial:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(1)
    fn, feeds = compiled(args)
    fn(*feeds)
    cpu = min(_cpu_seconds(fn, feeds) for _ in range(args.steps))
    shapes = {}
    for op in fn.concrete.graph.get_operations():
        ins = ",".join(
            str(t.shape.as_list()) for t in op.inputs if t.dtype != tf.resource
        )
        outs = ",".join(str(t.shape.as_list()) for t in op.outputs)
        shapes[op.name] = f"{ins} -> {outs}"
    per_kernel: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    with tempfile.TemporaryDirectory() as d:
        tf.profiler.experimental.start(d)
        for _ in range(2):
            fn(*feeds)
        tf.profiler.experimental.stop()
        events = trace_events(Path(d))
    for name, seconds in events:
        m = _KERNEL.match(name)
        if m is None or m["type"] in _CALLERS:
            continue
        key = (m["type"], shapes.get(name.split(":")[0], "?"))
        per_kernel[key][0] += seconds / 2
        per_kernel[key][1] += 0.5
    total = sum(s for s, _ in per_kernel.values())
    print(
        f"step CPU time {cpu * 1e3:.1f} ms ({'one thread' if args.serial else '2 cores'})"
        f", kernels {total * 1e3:.1f} ms per step"
    )
    rows = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: args.top]
    for (op_type, shape), (s, n) in rows:
        print(f"{s * 1e3:8.2f} ms {int(n):4d}x {op_type:14s} {shape}")


def _cpu_seconds(fn: Any, feeds: list[Any]) -> float:
    c0 = time.process_time()
    fn(*feeds)
    return time.process_time() - c0


if __name__ == "__main__":
    main()
