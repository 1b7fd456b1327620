"""What TensorFlow's einsum kernel pays for the transposes it makes.

Times equations of equal flops on 8 logical CPU devices at once (as a step
runs them), each device with its own operands (distinct variables, so no
computation is shared), the fastest of 4 calls, and prints beside each the
operands ``cost_models.einsum_transposes`` says the kernel transposes.

    .venv/bin/python bench/einsum_transposes.py
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: The weight gradient of a 1024 -> 4096 layer on one sequence of 64 tokens,
#: in every operand and output order, the forward and input-gradient products
#: beside it, and attention's values product with its output's batch (of
#: size one) moved: a copy that keeps the bytes in order.
SIZES = {"b": 1, "l": 64, "d": 1024, "f": 4096, "h": 16, "q": 512, "k": 64, "v": 512}
EQUATIONS = [
    "bld,blf->df",
    "blf,bld->fd",
    "blf,bld->df",
    "bld,blf->fd",
    "lbd,blf->df",
    "bld,df->blf",
    "df,bld->blf",
    "blf,df->bld",
    "bhqk,bhkv->bhqv",
    "bhqk,bhkv->hbqv",
]
REPS = 3


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from cost_models.einsum_transposes import kernel_transposes, moved_operands
    from mtf_core.lowering.devices import logical_cpu_devices

    devices = [str(d) for d in logical_cpu_devices(8)]
    rng = np.random.RandomState(0)

    def timed(eq: str) -> float:
        ins, _ = eq.split("->")
        names = ins.split(",")
        per_device = []
        for d in devices:
            with tf.device(d):
                per_device.append(
                    [
                        [
                            tf.Variable(
                                rng.rand(*[SIZES[c] for c in n]).astype(np.float32)
                            )
                            for n in names
                        ]
                        for _ in range(REPS)
                    ]
                )

        @tf.function
        def step() -> Any:
            sums = []
            for d, calls in zip(devices, per_device):
                with tf.device(d):
                    sums.append(
                        tf.add_n([tf.reduce_sum(tf.einsum(eq, *ops)) for ops in calls])
                    )
            return tf.add_n(sums)

        step()
        best = float("inf")
        for _ in range(4):
            start = time.perf_counter()
            step().numpy()
            best = min(best, time.perf_counter() - start)
        return best / REPS

    print("8 devices at once; GFLOP/s of all of them")
    for eq in EQUATIONS:
        ins, out = eq.split("->")
        labels = set(ins) - {","}
        flops = 2 * math.prod(SIZES[c] for c in labels) * len(devices)
        names = tuple(tuple(n) for n in ins.split(","))
        sizes = [[SIZES[c] for c in n] for n in names] + [[SIZES[c] for c in out]]
        copied = [k for k, _ in kernel_transposes(names, tuple(out))]
        moved = moved_operands(names, tuple(out), sizes)
        what = ", ".join(
            ("output" if k == len(names) else f"input {k}")
            + ("" if k in moved else " (dims of size one only)")
            for k in copied
        )
        t = timed(eq)
        print(
            f"{eq:14s} {t * 1e3:7.2f} ms  {flops / t / 1e9:6.1f} GFLOP/s  "
            f"transposes: {what or 'nothing'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
