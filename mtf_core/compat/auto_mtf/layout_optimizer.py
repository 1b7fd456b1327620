"""``mesh_tensorflow.auto_mtf.layout_optimizer``: Mesh TF's memory-only
CP-SAT layout model.  It is the planner's
(``mtf.auto_mtf.layout_optimizer``, provided through
:mod:`mtf_core.extensions`), loaded on first use, as mtf_core imports no
solver and names no upper package."""

from __future__ import annotations

from typing import Any

from mtf_core import extensions


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(extensions.load("auto_mtf").layout_optimizer, name)
