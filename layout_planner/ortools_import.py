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

``cp_model`` also imports pandas, for its ``*_series`` helpers only, which
the planner never calls: pandas is three quarters of the import (0.18 s of
0.23 s here).  :func:`cp_sat_import` hands ``cp_model`` a
:class:`_DeferredPandas` instead, which imports pandas the first time
something of it is used; the annotations ``cp_model`` evaluates as it loads
get stand-in classes (``tests/test_ortools_import.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any, Literal

#: How OR-tools came into this process: ``"deepbind"`` (imported by
#: :func:`cp_sat_import` with ``RTLD_DEEPBIND``), ``"before-tf"`` (imported the
#: ordinary way while TensorFlow was not loaded), ``"after-tf"`` (the ordinary
#: way, TensorFlow already loaded: unsafe).
HowLoaded = Literal["deepbind", "before-tf", "after-tf"]

_ORTOOLS = "ortools.sat.python.cp_model"
_PANDAS = "pandas"
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


class _DeferredPandas(types.ModuleType):
    """Stands for pandas in ``cp_model``: the first attribute asked for
    imports pandas and is read from it.  While ``cp_model`` loads, in the
    thread loading it, ``Index`` and ``Series`` (the names its annotations
    read at definition) are stand-in classes instead."""

    def __init__(self) -> None:
        super().__init__(_PANDAS)
        self.loading_in: int | None = None  # the thread loading cp_model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # the import system probing a module
        if self.loading_in == threading.get_ident() and name in _STAND_INS:
            return _STAND_INS[name]
        if sys.modules.get(_PANDAS) is self:  # another thread, mid-import
            del sys.modules[_PANDAS]
        return getattr(importlib.import_module(_PANDAS), name)


#: What ``cp_model``'s annotations of pandas types get while it loads.
_STAND_INS = {
    name: type(name, (), {"__module__": "pandas (not imported)"})
    for name in ("Index", "Series")
}


@contextlib.contextmanager
def _pandas_deferred() -> Iterator[None]:
    """``import pandas`` gives a :class:`_DeferredPandas` inside the block
    (unless pandas is imported already)."""
    if _PANDAS in sys.modules:
        yield
        return
    deferred = _DeferredPandas()
    deferred.loading_in = threading.get_ident()
    sys.modules[_PANDAS] = deferred
    try:
        yield
    finally:
        deferred.loading_in = None
        if sys.modules.get(_PANDAS) is deferred:
            del sys.modules[_PANDAS]


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
            with _pandas_deferred():
                yield
        finally:
            sys.setdlopenflags(flags)
        if _ORTOOLS in sys.modules:
            if deepbind is not None:
                _how_loaded = "deepbind"
            else:
                _how_loaded = "after-tf" if tf_loaded else "before-tf"
