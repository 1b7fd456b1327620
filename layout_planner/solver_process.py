"""Where CP-SAT runs: in this process, imported so that TensorFlow cannot break it.

OR-tools 9.15's CP-SAT crashes (SIGSEGV inside ``Solve``) in a process that
loaded TensorFlow 2.21 first, when OR-tools is imported the ordinary way.  The
cause is symbol interposition: TensorFlow loads its native libraries with
``RTLD_GLOBAL``, and its own copies of Abseil and protobuf then stand in for
the ones OR-tools bundles, which are built differently.  :func:`cp_sat_import`
imports OR-tools with ``RTLD_DEEPBIND``, so OR-tools' libraries look up
symbols in their own dependencies first; then CP-SAT works in process whatever
was loaded before or after it (``tests/test_planner_tf_safety.py`` proves both
orders, many solves, several CP-SAT workers and a large model, each in its own
interpreter).  :mod:`layout_planner.cpsat` imports OR-tools only that way.

A clean worker process (``python -m layout_planner.solver_worker``, which never
imports TensorFlow, started once and reused) remains the fallback, used only
where the in-process solve is not known to be safe:

* the platform has no ``RTLD_DEEPBIND`` (not glibc: macOS, musl) and
  TensorFlow was loaded before the first solve;
* OR-tools was imported by someone else, the ordinary way, while TensorFlow
  was already loaded (the order is then unknown);
* ``MTF_PLANNER_SOLVER=subprocess`` forces it (``inprocess`` forces the
  other way).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from layout_planner.errors import SolverError
from layout_planner.program import IntegerProgram, ProgramResult, Solution, SolveParams

_ENV = "MTF_PLANNER_SOLVER"
_ORTOOLS = "ortools.sat.python.cp_model"
_lock = threading.RLock()
# How OR-tools came into this process: "deepbind" (imported by
# cp_sat_import with RTLD_DEEPBIND), "before-tf" (imported the ordinary way
# while TensorFlow was not loaded), "after-tf" (the ordinary way, TensorFlow
# already loaded: unsafe), or None (not imported yet).
_how_loaded: str | None = None
_worker: _Worker | None = None


def solve(
    program: IntegerProgram,
    params: SolveParams,
    on_best: Callable[[Solution], None] | None = None,
) -> tuple[ProgramResult, str]:
    """Solves ``program``; returns the result and where it ran
    (``"inprocess"`` or ``"subprocess"``).  ``on_best``: see
    :func:`layout_planner.cpsat.solve_program` (not called in the worker)."""
    where = solver_location()
    if where == "inprocess":
        from layout_planner.cpsat import solve_program

        return solve_program(program, params, on_best), where
    with _lock:
        global _worker
        if _worker is None or not _worker.alive:
            _worker = _Worker()
        try:
            return _worker.call(program, params), where
        except SolverError:
            _worker.close()
            _worker = None
            raise


def solver_location() -> str:
    """``"inprocess"`` or ``"subprocess"``: where the next solve will run.

    The first call imports OR-tools (through :func:`cp_sat_import`) unless the
    environment forces the worker."""
    forced = os.environ.get(_ENV, "").strip().lower()
    if forced in ("inprocess", "subprocess"):
        return forced
    if forced:
        from layout_planner.errors import PlannerError

        raise PlannerError(
            f"{_ENV}={forced!r} is not understood; expected 'inprocess' or "
            "'subprocess' (or unset)"
        )
    return "inprocess" if inprocess_safe() else "subprocess"


def inprocess_safe() -> bool:
    """Whether CP-SAT can solve in this process (imports OR-tools if needed)."""
    with _lock:
        if _how_loaded is None:
            import layout_planner.cpsat  # noqa: F401  (through cp_sat_import)
        return _how_loaded in ("deepbind", "before-tf")


def how_loaded() -> str | None:
    """How OR-tools was imported into this process (see the module doc), or
    None if it was not."""
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


class _Worker:
    """A child interpreter that solves programs sent over a pipe."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, env.get("PYTHONPATH", "")) if p
        )
        env[_ENV] = "inprocess"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "layout_planner.solver_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def call(self, program: IntegerProgram, params: SolveParams) -> ProgramResult:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            write_message(self._proc.stdin, (program, params))
            ok, payload = read_message(self._proc.stdout)
        except (BrokenPipeError, EOFError, OSError) as e:
            raise SolverError(
                f"the CP-SAT worker process died ({e!r}; exit code "
                f"{self._proc.poll()}); its stderr ends with: {self._stderr_tail()}"
            ) from None
        if not ok:
            raise SolverError(f"the CP-SAT worker failed: {payload}")
        result: ProgramResult = payload
        return result

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].decode(errors="replace")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


def write_message(stream: IO[bytes], obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the pipe closed")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)
