# ruff: noqa: I001  (import order matters here: the compat shim, then MTF)
"""Runs Mesh TensorFlow 0.1.21 on the shared LM graph; prints one JSON line.

Run with the baseline venv (``make bench-venv-mtf``):
  .venv-mtf/bin/python bench/baseline/run_mtf.py lower --layers 8 --mesh "x:2;y:4" --layout "batch:x;d_ff:y;heads:y;vocab:y"
  .venv-mtf/bin/python bench/baseline/run_mtf.py auto --layers 32 --mesh "x:2;y:4"

``auto`` measures what ``run_ours.py auto`` does: TensorFlow is loaded (Mesh
TensorFlow imports it), the graph is built, and the clock runs over importing
``mesh_tensorflow.auto_mtf`` (which imports OR-tools) and the call.  OR-tools
imported the ordinary way after TensorFlow crashes in CP-SAT's ``Solve``, so it
is imported with ``RTLD_DEEPBIND``, the same cure our planner uses
(``layout_planner.solver_process.cp_sat_import``).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import mtf_compat  # noqa: E402,F401  (must precede mesh_tensorflow)
import mesh_tensorflow as mtf  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow.compat.v1 as tf  # noqa: E402
from graph_common import LMConfig, build_timed, parse_args  # noqa: E402


def make_input(mesh, shape, name):
    ph = tf.placeholder(tf.int32, shape.to_integer_list, name=name)
    return mtf.import_tf_tensor(mesh, ph, shape)


def main() -> None:
    args = parse_args()
    cfg = LMConfig(layers=args.layers)
    mesh, loss, updates, tokens, mesh_shape, out = build_timed(
        mtf, "mesh-tensorflow 0.1.21", args, make_input
    )
    graph = mesh.graph
    if args.mode == "auto":
        assert "ortools" not in sys.modules
        t0 = time.perf_counter()
        flags = sys.getdlopenflags()
        sys.setdlopenflags(os.RTLD_NOW | os.RTLD_DEEPBIND)
        try:
            import mesh_tensorflow.auto_mtf  # noqa: F401  (imports OR-tools)
        finally:
            sys.setdlopenflags(flags)
        rules = mtf.auto_mtf.layout(graph, mesh_shape, [loss])
        out["plan_s"] = time.perf_counter() - t0
        out["rules"] = str(rules)
        out["call"] = "auto_mtf"
        print(json.dumps(out))
        return
    n = mesh_shape.size
    devices = [f"/cpu:{i}" for i in range(n)]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mesh_shape, mtf.convert_to_layout_rules(args.layout), devices
    )
    t0 = time.perf_counter()
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_updates = [lowering.lowered_operation(op) for op in updates]
    init_slices = lowering.copy_masters_to_slices()
    out["lower_s"] = time.perf_counter() - t0
    out["layout"] = args.layout
    config = tf.ConfigProto(
        device_count={"CPU": n},
        inter_op_parallelism_threads=2,
        intra_op_parallelism_threads=2,
    )
    rng = np.random.RandomState(0)
    with tf.Session(config=config) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(init_slices)
        ph = [t for t in tf.get_default_graph().get_operations() if t.name == "tokens"][
            0
        ].outputs[0]
        feed = {ph: rng.randint(0, cfg.vocab, (cfg.batch, cfg.length)).astype(np.int32)}
        sess.run([tf_loss, tf_updates], feed)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss_v, _ = sess.run([tf_loss, tf_updates], feed)
        out["step_s"] = (time.perf_counter() - t0) / args.steps
        out["loss"] = float(loss_v)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
