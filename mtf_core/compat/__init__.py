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

install()

__all__ = ["ALIASES", "MESH_TF_PACKAGES", "add_mesh_tf_path", "install", "uninstall"]
