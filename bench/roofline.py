"""How fast can a training step of the shared LM graph be on this host?

Measures the host's float32 matmul throughput with TensorFlow (one big
matmul, and the LM's own matmul shapes at this mesh's slice sizes, one op per
logical device at once, as in a step) and counts the matmul flops a step of
the bench/baseline graph runs (einsums the lowering executes; einsums with a
one-hot input lower as lookups and are left out).  Their ratio is a lower
bound on the step: no lowering of this graph can beat it on this machine,
however it orders or fuses the elementwise ops.

    .venv/bin/python bench/roofline.py --layers 8 --mtf_step 1.8

``--mtf_step S`` (Mesh TensorFlow's measured step, from
``bench/compare_mtf.py lower``) adds the step a 2x speed-up would need.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "baseline"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
from graph_common import LMConfig, build_lm  # noqa: E402

import mtf_core as mtf  # noqa: E402


def step_matmul_flops(layers: int) -> tuple[float, int]:
    """Matmul flops one step executes (all devices, any layout that splits
    work without duplicating it), and how many einsums."""
    from mtf_core.lowering.lowering import needed_operations

    graph = mtf.Graph()
    m = mtf.Mesh(graph, "m")
    loss, updates, _ = build_lm(
        mtf,
        m,
        LMConfig(layers=layers),
        lambda mesh, s, n: mtf.placeholder(mesh, s, "int32", name=n),
    )
    total, count = 0.0, 0
    for op in needed_operations(graph, [loss, *updates]):
        if op.op_type != "Einsum" or op.onehot_plan is not None:
            continue
        total += op.flops()
        count += 1
    return total, count


def matmul_gflops(shapes: list[tuple[int, int, int]], devices: list[str]) -> float:
    """GFLOP/s of one float32 matmul per device per shape, all launched in
    one tf.function (as a step launches them), best of 5 runs."""
    import tensorflow as tf

    inputs = []
    for i, (m, k, n) in enumerate(shapes):
        with tf.device(devices[i % len(devices)]):
            inputs.append(
                (tf.random.normal([m, k], seed=i), tf.random.normal([k, n], seed=i))
            )

    @tf.function
    def run() -> list:
        outs = []
        for i, (a, b) in enumerate(inputs):
            with tf.device(devices[i % len(devices)]):
                outs.append(tf.reduce_sum(tf.matmul(a, b)))
        return outs

    run()
    best = min(common.timed(lambda: [o.numpy() for o in run()])[1] for _ in range(5))
    flops = sum(2.0 * m * k * n for m, k, n in shapes)
    return flops / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mtf_step", type=float, default=None)
    args = ap.parse_args()
    devices = mtf.logical_devices(8)
    t0 = time.perf_counter()
    flops, count = step_matmul_flops(args.layers)
    print(f"step: {count} einsums, {flops / 1e9:.1f} GFLOP", flush=True)
    big = matmul_gflops([(2048, 2048, 2048)], devices[:1])
    print(f"one 2048^3 matmul: {big:.0f} GFLOP/s", flush=True)
    # The step's largest per-device matmuls on x:2;y:4 (tokens 4096 / 2 per
    # device): FF [2048,256]x[256,256], logits [2048,256]x[256,2048].
    lm = matmul_gflops([(2048, 256, 256)] * 8 + [(2048, 256, 2048)] * 8, devices)
    print(f"LM-shaped matmuls, 8 devices at once: {lm:.0f} GFLOP/s", flush=True)
    peak = max(big, lm)
    floor = flops / 1e9 / peak
    rows = [
        ["matmul GFLOP per step", f"{flops / 1e9:.1f}"],
        ["best measured matmul GFLOP/s", f"{peak:.0f}"],
        ["step lower bound s (matmuls at that rate, nothing else)", f"{floor:.3f}"],
    ]
    if args.mtf_step:
        rows.append(["Mesh TensorFlow step s (given)", f"{args.mtf_step:.3f}"])
        rows.append(["step for a 2x speed-up s", f"{args.mtf_step / 2:.3f}"])
        rows.append(
            [
                "matmul rate a 2x speed-up needs, GFLOP/s",
                f"{flops / 1e9 / (args.mtf_step / 2):.0f}",
            ]
        )
    print(common.markdown_table(["quantity", "value"], rows))
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
