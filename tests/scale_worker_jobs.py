"""Jobs for the scale search's helpers started as fresh interpreters
(``tests/test_scale_workers.py``): importable by name, as such a helper
receives its job and state maker pickled."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any


def make_state() -> dict[str, Any]:
    return {"pid": os.getpid(), "jobs": 0}


def job(state: dict[str, Any], item: Any) -> Any:
    state["jobs"] += 1
    if item == "boom":
        raise ValueError("item 'boom' is not a number")
    if item == "modules":  # what the helper's interpreter has loaded
        return [
            "tensorflow" in sys.modules,
            "ortools.sat.python.cp_model" in sys.modules,
            gc.isenabled(),
        ]
    return (state["pid"], state["jobs"], item * 2)
