"""Sums over rows against sums along rows: what ``outer_reduce_bytes`` prices.

Times TensorFlow's ``reduce_sum`` of a ``[rows, cols]`` float32 tensor over
axis 0 (keeping the innermost dim: a bias or layer-norm gradient) and over
axis 1, on one thread (inter- and intra-op parallelism 1), fastest of
``--repeats`` calls, for slices of 256 KiB to 64 MiB.  Then it fits one rate
per byte to the extra time of the sum over rows, for the byte counts of
``cost_models.op_classes`` (``min(1, row / PAGE_BYTES) * min(1, rows /
STRIDED_ROWS)`` of the slice bytes) and for plain bytes, and prints how well
each explains the table (relative error of the sum over rows' time).

    .venv/bin/python bench/strided_sum.py
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROWS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
COLS = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def fastest(fn: Any, x: Any, repeats: int) -> float:
    fn(x)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        best = min(best, time.perf_counter() - t0)
    return best


def measure(repeats: int) -> list[dict[str, float]]:
    """``{rows, cols, bytes, over_rows_s, along_rows_s}`` per shape."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    over = tf.function(lambda x: tf.reduce_sum(x, axis=[0]))
    along = tf.function(lambda x: tf.reduce_sum(x, axis=[1]))
    rng = np.random.default_rng(0)
    out = []
    for rows in ROWS:
        for cols in COLS:
            nbytes = rows * cols * 4
            if not (256 << 10) <= nbytes <= (64 << 20):
                continue
            x = tf.constant(rng.random((rows, cols), dtype=np.float32))
            out.append(
                {
                    "rows": rows,
                    "cols": cols,
                    "bytes": nbytes,
                    "over_rows_s": fastest(over, x, repeats),
                    "along_rows_s": fastest(along, x, repeats),
                }
            )
    return out


def fit(
    table: list[dict[str, float]], feature: list[float]
) -> tuple[float, list[float]]:
    """The rate minimizing the relative error of ``along + rate * feature``
    against the sum over rows, and each shape's error."""
    w = [1.0 / r["over_rows_s"] for r in table]
    extra = [r["over_rows_s"] - r["along_rows_s"] for r in table]
    num = sum(wi * wi * f * e for wi, f, e in zip(w, feature, extra))
    den = sum(wi * wi * f * f for wi, f in zip(w, feature))
    rate = num / den if den else 0.0
    errs = [
        (r["along_rows_s"] + rate * f) / r["over_rows_s"] - 1
        for r, f in zip(table, feature)
    ]
    return rate, errs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=12, help="timed calls per sum")
    args = p.parse_args()
    from common import machine_summary, markdown_table

    from cost_models.op_classes import PAGE_BYTES, STRIDED_ROWS

    table = measure(args.repeats)
    print(machine_summary())
    print(
        markdown_table(
            ["rows", "cols", "MiB", "over rows ms", "along rows ms", "ratio"],
            [
                [
                    r["rows"],
                    r["cols"],
                    f"{r['bytes'] / 2**20:g}",
                    f"{r['over_rows_s'] * 1e3:.2f}",
                    f"{r['along_rows_s'] * 1e3:.2f}",
                    f"{r['over_rows_s'] / r['along_rows_s']:.1f}",
                ]
                for r in table
            ],
        )
    )
    features = {
        "none": [0.0 for _ in table],
        "bytes": [r["bytes"] for r in table],
        "bytes * min(1, row / page)": [
            r["bytes"] * min(1.0, 4 * r["cols"] / PAGE_BYTES) for r in table
        ],
        "outer_reduce_bytes (cost_models)": [
            r["bytes"]
            * min(1.0, 4 * r["cols"] / PAGE_BYTES)
            * min(1.0, r["rows"] / STRIDED_ROWS)
            for r in table
        ],
    }
    rows = []
    for name, feat in features.items():
        rate, errs = fit(table, feat)
        rms = math.sqrt(sum(e * e for e in errs) / len(errs))
        within = sum(abs(e) <= 0.2 for e in errs) / len(errs)
        rows.append([name, f"{rate * 1e9:.3f}", f"{rms:.2f}", f"{within:.0%}"])
    print()
    print(markdown_table(["feature", "ns per unit", "rms error", "within 20%"], rows))


if __name__ == "__main__":
    main()
