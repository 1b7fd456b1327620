"""Mesh TF 0.1.21's ``rename_dimension`` under ``a:x;c:y`` returns wrong values.

Run with Mesh TF's own environment (docs/compatibility.md)::

    .venv-mtf/bin/python -m conformance.rename_bug      # prints "equal: False"

``x [b:8, a:4]`` renamed ``a -> c`` must keep its values; on a 2x2 mesh where
``a`` is split over ``x`` and ``c`` over ``y``, Mesh TF swaps elements
(``[[0, 2, 1, 3], ...]``).  mtf_core's answer is checked in
tests/test_ops_reshape.py
(test_rename_dimension_to_a_name_on_another_axis_regathers_and_resplits).
"""

from __future__ import annotations

import numpy as np

from conformance.bootstrap import install_stand_ins


def main() -> None:
    install_stand_ins()
    import mesh_tensorflow as mtf
    import tensorflow.compat.v1 as tf1

    tf1.disable_v2_behavior()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x_np = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    x = mtf.import_tf_tensor(mesh, tf1.constant(x_np), mtf.convert_to_shape("b:8,a:4"))
    y = mtf.rename_dimension(x, "a", "c")
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("x:2;y:2", "a:x;c:y", [""] * 4)
    out = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)
    with tf1.Session() as sess:
        value = sess.run(out)
    print("equal:", bool(np.array_equal(value, x_np)))
    print(value[:2])


if __name__ == "__main__":
    main()
