"""``mtf.utils``: Mesh TF's utilities (``BalancedVariablePlacer``,
``outside_all_rewrites``, ``remove_summaries``), loaded from
:mod:`mtf_core.lowering.tf_utils` on first use because they need TensorFlow."""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = (
    "BalancedVariablePlacer",
    "outside_all_rewrites",
    "remove_summaries",
    "SCALAR_SUMMARIES_COLLECTION_KEY",
)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module("mtf_core.lowering.tf_utils"), name)
    raise AttributeError(f"module 'mtf_core.utils' has no attribute {name!r}")
