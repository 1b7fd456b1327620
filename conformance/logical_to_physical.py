"""mtf_core's ``auto_logical_to_physical_tpu`` against Mesh TF 0.1.21's own.

Run from this tree's venv, with Mesh TF's environment beside it
(docs/compatibility.md)::

    .venv/bin/python -m conformance.logical_to_physical --python .venv-mtf/bin/python

prints ``equal: N of M`` and each pair that differs.  The pairs are every
factorisation into one to three powers of 2 of the cores of eight TPU-shaped
grids ``[rows, cols, 2]``, plus a few odd ones.  Mesh TF's side runs in a
subprocess of ``--python`` (``--mesh-tf-side`` prints its answers as JSON);
where Mesh TF returns a function object (a core count other than its flag's)
it is printed as ``"FUNCTION"``, and errors as their message.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Case = tuple[list[int], list[int]]  # (logical shape, physical shape)


def cases() -> list[Case]:
    out: list[Case] = []
    grids = ([8, 8, 2], [2, 2, 2], [4, 2, 2], [2, 4, 2], [4, 4, 2], [1, 4, 2],
             [8, 4, 2], [16, 8, 2])  # fmt: skip
    for physical in grids:
        n = math.prod(physical)
        powers = [2**i for i in range(n.bit_length())]
        for a in powers:
            for b in powers:
                if n % (a * b) == 0:
                    out.append(([a, b, n // (a * b)], list(physical)))
                    out.append(([a, n // a], list(physical)))
        out.append(([n], list(physical)))
    out += [([2, 32, 4], [256]), ([8, 16], [4, 4, 2, 2]), ([4, 8], [2, 2, 2, 4])]
    return out


def answers(fn: Callable[..., Any]) -> list[Any]:
    out: list[Any] = []
    for logical, physical in cases():
        try:
            got = fn(logical, physical)
            out.append("FUNCTION" if callable(got) else got)
        except ValueError:  # both sides raise a ValueError on bad shapes
            out.append("ValueError")
    return out


def _mesh_tf_side() -> None:
    from conformance.bootstrap import install_stand_ins

    install_stand_ins()
    import tensorflow.compat.v1 as tf1
    from mesh_tensorflow import simd_mesh_impl

    tf1.flags.FLAGS(["mesh-tf"])  # the flags' defaults: 2 cores per chip
    print(json.dumps(answers(simd_mesh_impl.auto_logical_to_physical_tpu)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=".venv-mtf/bin/python")
    parser.add_argument("--mesh-tf-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mesh_tf_side:
        _mesh_tf_side()
        return 0
    from mtf_core.compat.simd_mesh_impl import auto_logical_to_physical_tpu

    proc = subprocess.run(
        [args.python, "-m", "conformance.logical_to_physical", "--mesh-tf-side"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = answers(auto_logical_to_physical_tpu)
    same = 0
    for (logical, physical), a, b in zip(cases(), ours, theirs):
        if a == b:
            same += 1
        else:
            print(f"differ: logical {logical} physical {physical}: "
                  f"mtf_core {str(a)[:60]} | Mesh TF {str(b)[:60]}")  # fmt: skip
    print(f"equal: {same} of {len(ours)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
