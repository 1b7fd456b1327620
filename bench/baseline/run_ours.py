"""Runs mtf_core (this project) on the shared LM graph; prints one JSON line.

.venv/bin/python bench/baseline/run_ours.py lower --layers 8 --mesh "x:2;y:4" --layout "batch:x;d_ff:y;heads:y;vocab:y"
.venv/bin/python bench/baseline/run_ours.py auto --layers 32 --mesh "x:2;y:4" [--objective memory]
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from graph_common import LMConfig, build_timed, parse_args  # noqa: E402

import mtf_core as mtf  # noqa: E402


def make_input(mesh, shape, name):
    return mtf.placeholder(mesh, shape, "int32", name=name)


def main() -> None:
    args = parse_args()
    cfg = LMConfig(layers=args.layers)
    mesh, loss, updates, tokens, mesh_shape, out = build_timed(
        mtf, "mtf-planner", args, make_input
    )
    graph = mesh.graph
    if args.mode == "auto":
        # Imported before the clock starts, as run_mtf.py imports auto_mtf
        # and CP-SAT.
        from ortools.sat.python import cp_model  # noqa: F401

        from layout_planner import auto_mtf, planner

        t0 = time.perf_counter()
        if args.objective == "memory":  # the same call as Mesh TensorFlow's
            rules = auto_mtf.layout(graph, mesh_shape, [loss])
            out["plan_s"] = time.perf_counter() - t0
            out["rules"] = str(rules)
            t0 = time.perf_counter()
        plan = planner.auto_layout(
            graph, mesh_shape, outputs=[loss], objective=args.objective, top_k=1
        )
        out[f"plan_{args.objective}_s"] = time.perf_counter() - t0
        out.setdefault("rules", str(plan.layout_rules))
        out.setdefault("plan_s", out[f"plan_{args.objective}_s"])
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
