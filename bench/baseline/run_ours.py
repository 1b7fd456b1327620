"""Runs mtf_core (this project) on the shared LM graph; prints one JSON line.

.venv/bin/python bench/baseline/run_ours.py lower --layers 8 --mesh "x:2;y:4" --layout "batch:x;d_ff:y;heads:y;vocab:y"
.venv/bin/python bench/baseline/run_ours.py auto --layers 32 --mesh "x:2;y:4" [--objective memory]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from graph_common import LMConfig, build_lm  # noqa: E402

import mtf_core as mtf  # noqa: E402


def make_input(mesh, shape, name):
    return mtf.placeholder(mesh, shape, "int32", name=name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["lower", "auto"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mesh", default="x:2;y:4")
    ap.add_argument("--layout", default="batch:x;d_ff:y;heads:y;vocab:y")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--objective", default="memory")
    args = ap.parse_args()
    cfg = LMConfig(layers=args.layers)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    t0 = time.perf_counter()
    loss, updates, tokens = build_lm(mtf, mesh, cfg, make_input)
    build_s = time.perf_counter() - t0
    mesh_shape = mtf.convert_to_shape(args.mesh)
    out = {
        "library": "mtf-planner",
        "mode": args.mode,
        "layers": args.layers,
        "mesh": args.mesh,
        "build_s": build_s,
    }
    if args.mode == "auto":
        t0 = time.perf_counter()
        plan = mtf.auto_layout(
            graph, mesh_shape, outputs=[loss], objective=args.objective
        )
        out["plan_s"] = time.perf_counter() - t0
        out["rules"] = str(plan.layout_rules)
        out["status"] = str(getattr(plan.solver, "status", ""))
        out["gap"] = getattr(plan.solver, "gap", None)
        print(json.dumps(out))
        return
    devices = mtf.logical_devices(mesh_shape.size)
    impl = mtf.PlacementMeshImpl(mesh_shape, args.layout, devices)
    step = mtf.compile_function(
        graph, {mesh: impl}, inputs=[tokens], outputs=[loss], updates=updates
    )
    out["lower_s"] = step.trace()
    out["layout"] = args.layout
    feed = (
        np.random.RandomState(0)
        .randint(0, cfg.vocab, (cfg.batch, cfg.length))
        .astype(np.int32)
    )
    step(feed)  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.steps):
        (loss_v,) = step(feed)
    out["step_s"] = (time.perf_counter() - t0) / args.steps
    out["loss"] = float(loss_v)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
