"""``mesh_tensorflow.auto_mtf``: Mesh TF's automatic layout API on the planner.

``layout(graph, mesh_shape, outputs)`` and ``layout_and_mesh_shape(graph,
num_machines, outputs)`` are :mod:`layout_planner.auto_mtf`'s, loaded by name
on first use so that mtf_core never imports the planner statically.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("layout_planner.auto_mtf"), name)
