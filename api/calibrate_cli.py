"""``mtf-planner calibrate``: measure this machine and write a fitted profile.

    mtf-planner calibrate --devices 8 -o cpu8.json          # CPU here
    mtf-planner calibrate --device gpu --devices 4 -o gpu.json

Measures the devices with ``mtf_core.lowering.calibrate`` (peak rates, links,
and the sweep of one-op-class training steps on each backend, every device at
once), with a progress bar, then fits the per-op-class rates
(``cost_models.calibration.fit_profile``) and writes the profile: the fitted
rates under ``calibration``, the measurements they were fitted from (with
their features) under ``measured``.  ``--device auto`` (the default) uses a
GPU when TensorFlow sees one and the CPU otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def add_parser(sub: Any) -> None:
    c = sub.add_parser(
        "calibrate", help="measure this machine's devices and write a profile"
    )
    c.add_argument("--devices", type=int, default=8, help="logical devices (>= 2)")
    c.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    c.add_argument("-o", "--output", default="profile.json", help="JSON to write")
    c.add_argument("--name", help="profile name (default calibrated-<kind>x<n>)")
    c.add_argument("--backends", default="placement,spmd", help="sweep backends")
    c.add_argument("--repeats", type=int, default=5, help="timed steps per point")
    c.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        help="how steps are timed (default: cpu on CPU devices, wall on GPUs)",
    )
    c.add_argument(
        "--keep-graphs", action="store_true", help="keep each point's graph JSON"
    )
    c.add_argument("--points", help="only these sweep points (comma-separated)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_writable(path: str) -> None:
    """Raises (naming ``path``) unless the profile, and the raw measurements
    beside it, can be written there."""
    if os.path.isdir(path):
        raise ValueError(f"-o {path!r} is a directory; expected a file to write")
    for target in (path, path + ".raw"):
        existed = os.path.exists(target)
        try:
            with open(target, "a"):
                pass
        except OSError as e:
            raise ValueError(
                f"-o {path!r}: cannot write {target!r} ({e.strerror or e})"
            ) from None
        if not existed:
            os.remove(target)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Runs the calibration; 0 on success."""
    if args.devices < 2:
        raise ValueError(f"--devices must be at least 2, got {args.devices}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends:
        raise ValueError("--backends names no backend; expected placement and/or spmd")
    points = (
        [p.strip() for p in args.points.split(",") if p.strip()]
        if args.points
        else None
    )
    _check_writable(args.output)  # before minutes of measuring, not after
    from tqdm import tqdm

    from cost_models.calibration import fit_profile

    # The measuring runs in its own process: TensorFlow stays out of this one
    # (and of the api package), and it reports each sweep point as it goes.
    raw_path = args.output + ".raw"
    cmd = [
        sys.executable,
        "-m",
        "mtf_core.lowering.calibrate",
        "--devices",
        str(args.devices),
        "--device",
        args.device,
        "--out",
        raw_path,
        "--repeats",
        str(args.repeats),
        "--sweep",
        ",".join(backends),
        "--progress-lines",
    ]
    if args.name:
        cmd += ["--name", args.name]
    if args.clock:
        cmd += ["--clock", args.clock]
    if points:
        cmd += ["--points", ",".join(points)]
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
    )
    t0 = time.perf_counter()
    bar = None
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "total":
                bar = tqdm(
                    total=int(rest), desc="calibrate", unit="step", disable=args.quiet
                )
            elif word == "done" and bar is not None:
                bar.set_postfix_str(rest)
                bar.update(1)
        err = proc.stderr.read()
    if bar is not None:
        bar.close()
    if proc.returncode != 0:
        lines = [x for x in err.splitlines() if x.strip()]
        raise ValueError(
            "measuring failed: " + (lines[-1] if lines else f"exit {proc.returncode}")
        )
    with open(raw_path) as f:
        raw = json.load(f)
    profile = fit_profile(raw, keep_graphs=args.keep_graphs)
    profile["measured"]["seconds"] = time.perf_counter() - t0
    clock = profile["measured"].get("clock", "wall")
    kind = profile["measured"].get("device_kind", "cpu")
    with open(args.output, "w") as f:
        json.dump(profile, f, indent=1)
    os.remove(raw_path)  # only now: the measurements are in the profile
    for backend, report in sorted(profile["measured"]["fit"].items()):
        print(
            f"{backend}: {report['rows']} steps fitted, largest error "
            f"{report['max_abs_error']:.0%}"
        )
    print(f"wrote {args.output} ({kind} x{args.devices}, {clock} clock)")
    return 0
