"""Runs mtf_core (this project) on the shared LM graph; prints one JSON line.

.venv/bin/python bench/baseline/run_ours.py lower --layers 8 --mesh "x:2;y:4" --layout "batch:x;d_ff:y;heads:y;vocab:y"
.venv/bin/python bench/baseline/run_ours.py auto --layers 32 --mesh "x:2;y:4" [--call auto_mtf|auto_layout]

``auto`` measures planning as a user's program meets it: TensorFlow is
imported first (a real program builds its inputs with it), the graph is
built, and then the clock runs over importing the planner (OR-tools included,
loaded on the first solve) and the one call: ``auto_mtf.layout`` (Mesh
TensorFlow's API: objective memory, one layout) or ``mtf.auto_layout`` with
its defaults (objective time, top 5 candidates, verified with
``cost_models.evaluate``, baselines and explanations).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402,F401  (loaded first, as in a user's program)
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
        assert "layout_planner" not in sys.modules and "ortools" not in sys.modules
        t0 = time.perf_counter()
        if args.call == "auto_mtf":  # the same call as Mesh TensorFlow's
            from layout_planner import auto_mtf

            rules = auto_mtf.layout(graph, mesh_shape, [loss])
            out["plan_s"] = time.perf_counter() - t0
            out["rules"] = str(rules)
        else:
            plan = mtf.auto_layout(graph, mesh_shape, outputs=[loss])
            out["plan_s"] = time.perf_counter() - t0
            out["rules"] = str(plan.layout_rules)
            out["status"] = plan.status.value
            out["gap"] = plan.solver.gap
            out["candidates"] = len(plan.candidates)
            out["verified"] = plan.solver.verified
            out["solves"] = plan.solver.num_solves
            out["solver_s"] = plan.solver.wall_time_s
        from layout_planner import solver_process

        out["call"] = args.call
        out["solved_in"] = solver_process.solver_location()
        out["ortools_loaded"] = solver_process.how_loaded()
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
