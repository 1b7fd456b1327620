"""Run unchanged Mesh TensorFlow programs on mtf_core.

``import mtf_core.compat`` makes ``import mesh_tensorflow as mtf`` and its
submodules resolve to mtf_core::

    import mtf_core.compat  # noqa: F401
    import mesh_tensorflow as mtf           # mtf_core's names
    import mesh_tensorflow.placement_mesh_impl  # mtf_core.lowering.placement

Mesh TensorFlow's own model packages (``transformer``, ``experimental``,
``bert``) are not part of mtf_core: they load, unchanged, from an installed
mesh-tensorflow distribution or from the directories given by
:func:`add_mesh_tf_path` (or the ``MTF_COMPAT_MESH_TF_PATH`` environment
variable, ``os.pathsep``-separated), and run on mtf_core through the same
aliases.  docs/compatibility.md lists where mtf_core deliberately differs.
"""

from __future__ import annotations

from mtf_core.compat.finder import (
    ALIASES,
    MESH_TF_PACKAGES,
    add_mesh_tf_path,
    install,
    uninstall,
)
from mtf_core.layers.initializers import set_initializer_provider

install()


def _mesh_tf_initializer(distribution: str, stddev: float) -> object:
    # Mesh TF's layers draw default weights with TensorFlow's initializers
    # (mtf_core's own draw with NumPy); TensorFlow loads on first use.
    from mtf_core.lowering.tf_initializers import mesh_tf_initializer

    return mesh_tf_initializer(distribution, stddev)


set_initializer_provider(_mesh_tf_initializer)

__all__ = ["ALIASES", "MESH_TF_PACKAGES", "add_mesh_tf_path", "install", "uninstall"]
