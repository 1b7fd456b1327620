"""Measures the local devices and writes a hardware profile (JSON).

What it measures, on the devices the lowering would use:

* ``peak_flops``: a float32 matmul (``2 n^3`` flops) on one device, best of
  a few repeats;
* ``hbm_bandwidth_bytes_per_s``: an elementwise scale of a large tensor (read
  plus write) on one device;
* the link: allreduces of several sizes over all devices, run by the same
  :class:`~mtf_core.lowering.placement.PlacementMeshImpl` the lowering uses,
  fitted to the ring model ``t = 2 (n-1) latency + 2 (n-1)/n * bytes / bw``
  (least squares), so the cost model's formula reproduces what was measured;
* a point-to-point copy between two devices (recorded under ``measured``);
* ``memory_bytes``: physical memory divided among the devices (CPU) or the
  device's memory limit as TensorFlow reports it (GPU);
* the **sweep** (:func:`measure_sweep`): short real training-step graphs of
  one op class each (:mod:`mtf_core.lowering.calibration_sweep`), compiled
  with ``compile_function`` on every backend asked for and run with all
  devices at once, as a real step runs them; each measurement keeps its graph
  (JSON), mesh, rules, backend and fastest step, under ``measured.sweep``.

``cost_models.calibration.fit_profile`` fits per-op-class rates from the
sweep (``mtf-planner calibrate`` measures and fits in one go; a profile with a
sweep but no fitted rates is fitted when ``cost_models.get_hardware`` reads it).

The JSON has the keys of ``cost_models.hardware.HardwareProfile.to_dict()``
(plus ``measured``, the raw timings); ``cost_models.get_hardware(path)`` reads
it.  This module cannot import cost_models (dependencies point the other way),
so it writes that schema itself.

    python -m mtf_core.lowering.calibrate --devices 8 --out profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import LoweringError
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.lowering.calibration_sweep import SweepPoint, sweep_points
from mtf_core.lowering.devices import logical_cpu_devices, logical_gpu_devices
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.placement import LaidOutTensor, PlacementMeshImpl
from mtf_core.shapes import convert_to_shape

#: The lowering backends a sweep can measure.
BACKENDS = ("placement", "spmd")


#: How a step is timed: ``"wall"`` (wall-clock seconds) or ``"cpu"`` (this
#: process's CPU seconds divided by the cores the devices can use: what the
#: wall time would be on an otherwise idle host when the step keeps every core
#: busy, as 8 logical devices on a few cores do; it stays put when other
#: processes share the machine, where the wall time does not).
CLOCKS = ("wall", "cpu")


def usable_cores(devices: int) -> int:
    """Cores ``devices`` logical CPU devices of this process can keep busy."""
    return max(1, min(len(os.sched_getaffinity(0)), devices))


def _best_seconds(
    fn: Callable[[], Any], repeats: int, clock: str = "wall", cores: int = 1
) -> float:
    """Fastest of ``repeats`` timed calls (after one warm-up call)."""
    if clock not in CLOCKS:
        raise LoweringError(f"clock {clock!r}; expected one of {list(CLOCKS)}")
    fn()
    best = float("inf")
    timer = time.perf_counter if clock == "wall" else time.process_time
    for _ in range(repeats):
        t0 = timer()
        fn()
        best = min(best, timer() - t0)
    return best if clock == "wall" else best / cores


def _traced(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` traced as one ``tf.function`` (without autograph); typed here
    because TensorFlow ships no type stubs."""
    traced: Callable[[], Any] = tf.function(fn, autograph=False)
    return traced


def measure_matmul_flops(device: str, n: int = 512, repeats: int = 5) -> float:
    """Flop/s of an ``n x n`` float32 matmul on ``device``."""
    with tf.device(device):
        a = tf.random.stateless_uniform([n, n], [1, 2])
        b = tf.random.stateless_uniform([n, n], [3, 4])

    @_traced
    def step() -> Any:
        with tf.device(device):
            return tf.reduce_sum(tf.matmul(a, b))

    seconds = _best_seconds(lambda: step().numpy(), repeats)
    return 2.0 * n**3 / seconds


def measure_memory_bandwidth(
    device: str, nbytes: int = 64 << 20, repeats: int = 5
) -> float:
    """Bytes/s read plus written by an elementwise scale on ``device``."""
    n = max(nbytes // 4, 1)
    with tf.device(device):
        x = tf.random.stateless_uniform([n], [5, 6])

    @_traced
    def step() -> Any:
        with tf.device(device):
            return tf.reduce_max(x * 2.0)

    # The reduction reads the product once more: 3 passes over n floats.
    seconds = _best_seconds(lambda: step().numpy(), repeats)
    return 3.0 * 4 * n / seconds


def measure_copy(src: str, dst: str, nbytes: int, repeats: int = 5) -> float:
    """Seconds to copy ``nbytes`` from ``src`` to ``dst`` (and use it there)."""
    n = max(nbytes // 4, 1)
    with tf.device(src):
        x = tf.random.stateless_uniform([n], [7, 8])

    @_traced
    def step() -> Any:
        with tf.device(dst):
            return tf.reduce_max(tf.identity(x) + 1.0)

    return _best_seconds(lambda: step().numpy(), repeats)


def measure_allreduce(devices: Sequence[str], nbytes: int, repeats: int = 5) -> float:
    """Seconds for one allreduce of ``nbytes`` per device, as the lowering runs it."""
    impl = PlacementMeshImpl(f"all:{len(devices)}", "", devices)
    n = max(nbytes // 4, 1)
    slices = []
    for p, d in enumerate(devices):
        with tf.device(d):
            slices.append(tf.random.stateless_uniform([n], [p, 9]))
    laid = LaidOutTensor(slices)

    @_traced
    def step() -> Any:
        out = impl.allreduce(laid, [0], "SUM")
        with tf.device(devices[0]):
            return tf.add_n([tf.reduce_max(s) for s in out.slices])

    return _best_seconds(lambda: step().numpy(), repeats)


def fit_ring_allreduce(
    n: int, sizes: Sequence[int], seconds: Sequence[float]
) -> tuple[float, float]:
    """``(bandwidth_bytes_per_s, latency_s)`` fitting
    ``t = 2(n-1) * latency + 2(n-1)/n * bytes / bandwidth`` by least squares."""
    if n < 2:
        raise LoweringError(f"fitting an allreduce needs n >= 2 devices, got {n}")
    x = np.array([2 * (n - 1) / n * b for b in sizes], dtype=float)
    y = np.array(seconds, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    # Noise can make a fit term non-positive; fall back to the extreme points.
    if slope <= 0:
        slope = max((y[-1] - y[0]) / max(x[-1] - x[0], 1.0), 1e-15)
    if intercept <= 0:
        intercept = max(float(y.min()) * 0.5, 1e-9)
    return 1.0 / float(slope), float(intercept) / (2 * (n - 1))


def calibrate(
    devices: Sequence[str],
    name: str = "calibrated",
    sizes: Sequence[int] = (4 << 10, 64 << 10, 1 << 20, 4 << 20),
    repeats: int = 5,
    matmul_n: int = 512,
    memory_bytes: int | None = None,
    sweep_backends: Sequence[str] = (),
    clock: str = "wall",
    progress: Callable[[str], None] | None = None,
    points: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Measures ``devices`` and returns a hardware profile dict (see module
    doc); with ``sweep_backends``, the sweep too, on each of them, timed by
    ``clock`` (``progress(name)`` after each sweep point)."""
    devices = list(devices)
    if len(devices) < 2:
        raise LoweringError(
            f"calibrate needs at least 2 devices to measure links, got {devices}"
        )
    if len(sizes) < 2:
        raise LoweringError(f"calibrate needs at least 2 message sizes, got {sizes}")
    flops = measure_matmul_flops(devices[0], matmul_n, repeats)
    hbm = measure_memory_bandwidth(devices[0], max(sizes) * 4, repeats)
    ar = [measure_allreduce(devices, b, repeats) for b in sizes]
    bw, lat = fit_ring_allreduce(len(devices), sizes, ar)
    copy_small = measure_copy(devices[0], devices[1], min(sizes), repeats)
    copy_large = measure_copy(devices[0], devices[1], max(sizes), repeats)
    copy_bw = (max(sizes) - min(sizes)) / max(copy_large - copy_small, 1e-9)
    if memory_bytes is None:
        memory_bytes = _memory_per_device(devices)
    link = {"name": "calibrated", "bandwidth_bytes_per_s": bw, "latency_s": lat}
    return {
        "name": name,
        "peak_flops": flops,
        "memory_bytes": int(memory_bytes),
        "hbm_bandwidth_bytes_per_s": hbm,
        "default_link": link,
        "axis_links": {},
        "devices_per_host": None,
        "intra_host_link": None,
        "inter_host_link": None,
        "measured": {
            "devices": devices,
            "allreduce_bytes": list(sizes),
            "allreduce_s": ar,
            "copy_bytes": [min(sizes), max(sizes)],
            "copy_s": [copy_small, copy_large],
            "copy_bandwidth_bytes_per_s": copy_bw,
            "matmul_n": matmul_n,
            "sweep": measure_sweep(
                devices, sweep_backends, repeats, progress, clock, points
            )
            if sweep_backends
            else [],
        },
    }


def select_points(devices: int, names: Sequence[str] | None = None) -> list[SweepPoint]:
    """The sweep points for ``devices`` devices, only those in ``names`` if given."""
    pts = sweep_points(devices)
    if names is None:
        return pts
    known = {p.name for p in pts}
    unknown = sorted(set(names) - known)
    if unknown:
        raise LoweringError(
            f"unknown sweep points {unknown}; expected among {sorted(known)}"
        )
    return [p for p in pts if p.name in set(names)]


def sweep_size(
    devices: int, backends: Sequence[str], points: Sequence[str] | None = None
) -> int:
    """How many steps :func:`measure_sweep` measures (for a progress bar)."""
    return len(select_points(devices, points)) * len(backends)


def pick_devices(n: int, kind: str = "auto") -> tuple[list[str], str]:
    """``n`` logical devices: ``kind`` "cpu", "gpu" (the first GPU split into
    ``n``), or "auto" (a GPU when TensorFlow sees one, else the CPU).
    Returns the device names and the kind used."""
    if kind not in ("auto", "cpu", "gpu"):
        raise LoweringError(f"device kind {kind!r}; expected auto, cpu or gpu")
    has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if kind == "gpu" and not has_gpu:
        raise LoweringError(
            "no GPU is visible to TensorFlow; use the CPU (--device cpu)"
        )
    if kind == "gpu" or (kind == "auto" and has_gpu):
        return logical_gpu_devices(n), "gpu"
    return logical_cpu_devices(n), "cpu"


def measure_step(
    graph: Graph,
    mesh_shape: str,
    rules: str,
    devices: Sequence[str],
    backend: str,
    outputs: Sequence[Tensor] = (),
    updates: Sequence[Operation] = (),
    repeats: int = 5,
    clock: str = "wall",
) -> float:
    """Fastest of ``repeats`` steps (after one warm-up step) of ``graph``
    compiled under ``rules`` on ``backend`` ("placement" or "spmd"), timed
    by ``clock`` (see :data:`CLOCKS`)."""
    from mtf_core.lowering.spmd import SimdMeshImpl
    from mtf_core.lowering.steps import compile_function

    meshes = {op.mesh for op in graph.operations}
    if len(meshes) != 1:
        raise LoweringError(f"measure_step needs a graph on one mesh, got {meshes}")
    (mesh,) = meshes
    n = convert_to_shape(mesh_shape).size
    if backend == "placement":
        impl: MeshImpl = PlacementMeshImpl(mesh_shape, rules, list(devices)[:n])
    elif backend == "spmd":
        impl = SimdMeshImpl(mesh_shape, rules, list(devices)[:n])
    else:
        raise LoweringError(f"backend {backend!r}; expected one of {list(BACKENDS)}")
    inputs = [
        op.outputs[0] for op in graph.operations if getattr(op, "is_placeholder", False)
    ]
    fn = compile_function(graph, {mesh: impl}, inputs, list(outputs), list(updates))
    # Zeros are valid values for every placeholder (token ids and labels too).
    feeds = [np.zeros(t.shape.to_integer_list(), dtype=t.dtype) for t in inputs]
    return _best_seconds(lambda: fn(*feeds), repeats, clock, usable_cores(n))


def measure_sweep(
    devices: Sequence[str],
    backends: Sequence[str] = BACKENDS,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
    clock: str = "wall",
    points: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Runs every calibration graph on every backend; one record per run:
    ``{"point", "backend", "mesh_shape", "layout_rules", "graph" (JSON
    document, with the exported outputs), "seconds", "repeats"}``.
    ``progress(name)`` is called after each run (a progress bar); ``points``
    keeps only the sweep points of those names."""
    from mtf_core.serialization import graph_to_dict

    records = []
    for backend in backends:
        for point in select_points(len(devices), points):
            graph, outputs, updates = point.build(len(devices))
            mesh_shape = point.mesh(len(devices))
            seconds = measure_step(
                graph,
                mesh_shape,
                point.rules,
                devices,
                backend,
                outputs,
                updates,
                repeats,
                clock,
            )
            records.append(
                {
                    "point": point.name,
                    "backend": backend,
                    "mesh_shape": mesh_shape,
                    "layout_rules": point.rules,
                    "graph": graph_to_dict(graph, outputs=outputs),
                    "seconds": seconds,
                    "repeats": repeats,
                    "clock": clock,
                }
            )
            if progress is not None:
                progress(f"{backend}/{point.name}")
    return records


def _memory_per_device(devices: Sequence[str]) -> int:
    if "GPU" in devices[0].upper():
        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[0]
        )
        if "memory_limit" in details:
            return int(details["memory_limit"])
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total // len(devices))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mtf_core.lowering.calibrate",
        description="Measure local devices and write a cost-model hardware profile.",
    )
    p.add_argument("--devices", type=int, default=8, help="logical devices (>= 2)")
    p.add_argument("--gpu", action="store_true", help="split the first GPU instead")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default=None,
        help="cpu (default), gpu, or auto (a GPU when one is visible)",
    )
    p.add_argument("--points", help="only these sweep points (comma-separated)")
    p.add_argument(
        "--progress-lines",
        action="store_true",
        help="print 'total N' then 'done <point>' lines (for a progress bar)",
    )
    p.add_argument("--out", default="profile.json", help="JSON file to write")
    p.add_argument("--name", default=None, help="profile name (default: calibrated-*)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point")
    p.add_argument(
        "--sizes",
        default="4096,65536,1048576,4194304",
        help="allreduce message sizes in bytes per device, comma-separated",
    )
    p.add_argument("--matmul-n", type=int, default=512, help="matmul side length")
    p.add_argument(
        "--sweep",
        default="placement,spmd",
        help="backends to run the op-class sweep on, comma-separated ('' for none)",
    )
    p.add_argument(
        "--clock", choices=CLOCKS, default=None, help="wall, or cpu (CPU devices)"
    )
    args = p.parse_args(argv)
    try:
        sizes = [int(v) for v in args.sizes.split(",") if v.strip()]
    except ValueError:
        p.error(f"--sizes {args.sizes!r} is not a comma-separated list of integers")
    if args.devices < 2:
        p.error(f"--devices must be at least 2, got {args.devices}")
    backends = [b.strip() for b in args.sweep.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            p.error(f"--sweep names backend {b!r}; expected among {list(BACKENDS)}")
    kind = args.device or ("gpu" if args.gpu else "cpu")
    points = [v.strip() for v in args.points.split(",")] if args.points else None
    try:
        devices, kind = pick_devices(args.devices, kind)
        total = sweep_size(len(devices), backends, points)
    except LoweringError as e:
        p.error(str(e))
    name = args.name or f"calibrated-{kind}x{args.devices}"
    clock = args.clock or ("cpu" if kind == "cpu" else "wall")
    progress = None
    if args.progress_lines:
        print(f"total {total}", flush=True)

        def progress(point: str) -> None:
            print(f"done {point}", flush=True)

    profile = calibrate(
        devices,
        name=name,
        sizes=sizes,
        repeats=args.repeats,
        matmul_n=args.matmul_n,
        sweep_backends=backends,
        clock=clock,
        progress=progress,
        points=points,
    )
    profile["measured"]["clock"] = clock
    profile["measured"]["device_kind"] = kind
    with open(args.out, "w") as f:
        json.dump(profile, f, indent=2)
    link = profile["default_link"]
    print(
        f"wrote {args.out}: {profile['peak_flops'] / 1e9:.1f} GFLOP/s, "
        f"{profile['hbm_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s memory, link "
        f"{link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s + "
        f"{link['latency_s'] * 1e6:.1f} us, {profile['memory_bytes'] / 2**30:.1f} GiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
