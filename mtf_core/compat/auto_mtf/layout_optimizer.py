"""``mesh_tensorflow.auto_mtf.layout_optimizer``: Mesh TF's memory-only
CP-SAT layout model.  It is the planner's
(:mod:`layout_planner.mesh_tf_layout_optimizer`), loaded by name on first
use, as mtf_core imports no solver."""

from __future__ import annotations

import importlib
from typing import Any

_PLANNER_MODULE = "layout_planner.mesh_tf_layout_optimizer"


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module(_PLANNER_MODULE), name)
