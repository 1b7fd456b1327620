"""``mesh_tensorflow.auto_mtf``: Mesh TF's automatic layout API on the planner.

``layout(graph, mesh_shape, outputs)`` and ``layout_and_mesh_shape(graph,
num_machines, outputs)`` are the planner's ``mtf.auto_mtf``, which the planner
provides through :mod:`mtf_core.extensions` (mtf_core never names the planner).
"""

from __future__ import annotations

from typing import Any

from mtf_core import extensions


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(extensions.load("auto_mtf"), name)
