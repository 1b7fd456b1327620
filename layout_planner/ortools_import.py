"""Importing OR-tools' CP-SAT so that TensorFlow cannot break it.

OR-tools 9.15's CP-SAT crashes (SIGSEGV inside ``Solve``) in a process that
loaded TensorFlow 2.21 first, when OR-tools is imported the ordinary way.  The
cause is symbol interposition: TensorFlow loads its native libraries with
``RTLD_GLOBAL``, and its own copies of Abseil and protobuf then stand in for
the ones OR-tools bundles, which are built differently.  :func:`cp_sat_import`
imports OR-tools with ``RTLD_DEEPBIND``, so OR-tools' libraries look up
symbols in their own dependencies first; then CP-SAT works in process whatever
was loaded before or after it (``tests/test_planner_tf_safety.py`` proves both
orders, many solves, several CP-SAT workers and a large model, each in its own
interpreter).  :mod:`layout_planner.cpsat` imports OR-tools only that way, and
:mod:`layout_planner.solver_process` asks :func:`how_loaded` whether the
in-process solve is safe.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Literal

#: How OR-tools came into this process: ``"deepbind"`` (imported by
#: :func:`cp_sat_import` with ``RTLD_DEEPBIND``), ``"before-tf"`` (imported the
#: ordinary way while TensorFlow was not loaded), ``"after-tf"`` (the ordinary
#: way, TensorFlow already loaded: unsafe).
HowLoaded = Literal["deepbind", "before-tf", "after-tf"]

_ORTOOLS = "ortools.sat.python.cp_model"
_lock = threading.RLock()
_how_loaded: HowLoaded | None = None


def how_loaded() -> HowLoaded | None:
    """How OR-tools was imported into this process (see :data:`HowLoaded`),
    or None if it was not."""
    return _how_loaded


def load_cp_sat() -> HowLoaded | None:
    """Imports CP-SAT through :func:`cp_sat_import` (a no-op if it is
    already imported); returns :func:`how_loaded`."""
    with _lock, cp_sat_import():
        importlib.import_module(_ORTOOLS)
    return _how_loaded


@contextlib.contextmanager
def cp_sat_import() -> Iterator[None]:
    """The context in which to import ``ortools.sat.python.cp_model``.

    With ``RTLD_DEEPBIND`` (where the platform has it), every native library
    the import loads binds to its own dependencies before the process's global
    symbols, so TensorFlow's bundled Abseil and protobuf, loaded before or
    after, cannot stand in for OR-tools'.  The process's dlopen flags are
    restored afterwards (they are process-wide: a native module imported by
    another thread in this short window gets the same flags, which only makes
    it prefer its own dependencies too).
    """
    global _how_loaded
    with _lock:
        if _ORTOOLS in sys.modules:  # imported before, by us or by someone else
            if _how_loaded is None:
                _how_loaded = "after-tf" if "tensorflow" in sys.modules else "before-tf"
            yield
            return
        deepbind = getattr(os, "RTLD_DEEPBIND", None)
        tf_loaded = "tensorflow" in sys.modules
        flags = sys.getdlopenflags()
        if deepbind is not None:
            sys.setdlopenflags(os.RTLD_NOW | deepbind)
        try:
            yield
        finally:
            sys.setdlopenflags(flags)
        if _ORTOOLS in sys.modules:
            if deepbind is not None:
                _how_loaded = "deepbind"
            else:
                _how_loaded = "after-tf" if tf_loaded else "before-tf"
