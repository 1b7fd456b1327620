"""Run one Mesh TensorFlow test file as ``__main__`` (in its own process).

``python -m conformance.bootstrap --target mtf_core --mesh-tf-dir DIR FILE
[absl flags...]``.  Before the file runs, the modules TensorFlow 2.21 removed
(``tensorflow.python.tpu.tpu_config``/``tpu_estimator``, and
``tf.compat.v1.estimator``, of which Mesh TF uses only the session hooks that
``tf.compat.v1.train`` still has) and the optional data packages (``tensorflow_datasets``, ``tensorflow_probability``) are stood in for
by empty modules if they cannot be imported, and ``mock`` by
``unittest.mock``: exactly what Mesh TF itself needs on TF 2.21.  With
``--target mtf_core`` (the default) ``mesh_tensorflow`` resolves to mtf_core;
with ``--target mesh_tf`` the installed Mesh TF runs, for the reference figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import sys
import types
import unittest.mock

# Modules a Mesh TF test may import that TF 2.21 or this environment lacks.
_EMPTY_STAND_INS = (
    "tensorflow.python.tpu.tpu_config",
    "tensorflow.python.tpu.tpu_estimator",
    "tensorflow_datasets",
    "tensorflow_probability",
)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _tf_moved_names() -> list[str]:
    """Names TF 2.21 removed or moved that Mesh TF's code reaches for."""
    # OR-tools (Mesh TF's auto_mtf uses CP-SAT) crashes if loaded after TF
    # 2.21 without RTLD_DEEPBIND; loading it first avoids that.
    if _importable("ortools"):
        import ortools.sat.python.cp_model  # noqa: F401
    import tensorflow.compat.v1 as tf1
    from tensorflow.python.framework import ops, tensor_conversion_registry

    made = []
    if not hasattr(tf1, "estimator"):
        est = types.ModuleType("tensorflow.compat.v1.estimator", "stand-in")
        for name in dir(tf1.train):
            if "Hook" in name or "Listener" in name or name.startswith("SessionRun"):
                setattr(est, name, getattr(tf1.train, name))
        # Mode names only (tf.estimator.ModeKeys' values); the Estimator
        # classes themselves are gone and stay gone.
        est.ModeKeys = types.SimpleNamespace(  # type: ignore[attr-defined]
            TRAIN="train", EVAL="eval", PREDICT="infer"
        )
        tf1.estimator = est
        made.append(est.__name__)
    import tensorflow

    if not hasattr(tensorflow, "estimator"):  # gin.tf reads tf.estimator
        tensorflow.estimator = tf1.estimator
        made.append("tensorflow.estimator")
    if not hasattr(ops, "register_tensor_conversion_function"):
        ops.register_tensor_conversion_function = (
            tensor_conversion_registry.register_tensor_conversion_function
        )
        made.append("ops.register_tensor_conversion_function")
    return made


def install_stand_ins() -> list[str]:
    """Empty modules for what cannot be imported; returns their names."""
    made = _tf_moved_names()
    for name in _EMPTY_STAND_INS:
        if not _importable(name):
            sys.modules[name] = types.ModuleType(name, "empty stand-in")
            made.append(name)
    if not _importable("mock"):
        sys.modules["mock"] = unittest.mock
        made.append("mock")
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", choices=("mtf_core", "mesh_tf"), default="mtf_core")
    parser.add_argument("--mesh-tf-dir", help="an unpacked mesh_tensorflow directory")
    parser.add_argument("file")
    args, rest = parser.parse_known_args(argv)
    install_stand_ins()
    if args.target == "mtf_core":
        import mtf_core.compat

        if args.mesh_tf_dir:
            mtf_core.compat.add_mesh_tf_path(args.mesh_tf_dir)
    sys.argv = [args.file, *rest]
    runpy.run_path(args.file, run_name="__main__")


if __name__ == "__main__":
    main()
