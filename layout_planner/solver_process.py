"""Where CP-SAT runs: in this process, or in a clean worker process.

In this process is the rule: :mod:`layout_planner.ortools_import` imports
OR-tools with ``RTLD_DEEPBIND``, so that TensorFlow's native libraries, loaded
before or after, cannot break CP-SAT (that module says why it would).

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
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import IO

from layout_planner.errors import PlannerError, SolverError
from layout_planner.ortools_import import cp_sat_import, how_loaded, load_cp_sat
from layout_planner.program import IntegerProgram, ProgramResult, Solution, SolveParams

# Re-exported: how OR-tools was imported decides where the solve runs.
__all__ = [
    "cp_sat_import",
    "how_loaded",
    "inprocess_safe",
    "read_message",
    "read_request",
    "solve",
    "solver_location",
    "write_message",
]

_ENV = "MTF_PLANNER_SOLVER"
_lock = threading.RLock()
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
        # Here, not at the top: loading cpsat loads OR-tools, which a process
        # that solves in the worker never needs.
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
        raise PlannerError(
            f"{_ENV}={forced!r} is not understood; expected 'inprocess' or "
            "'subprocess' (or unset)"
        )
    return "inprocess" if inprocess_safe() else "subprocess"


def inprocess_safe() -> bool:
    """Whether CP-SAT can solve in this process (imports OR-tools if needed)."""
    how = how_loaded()
    if how is None:
        how = load_cp_sat()
    return how in ("deepbind", "before-tf")


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
            reply = read_message(self._proc.stdout)
        except (BrokenPipeError, EOFError, OSError) as e:
            raise SolverError(
                f"the CP-SAT worker process died ({e!r}; exit code "
                f"{self._proc.poll()}); its stderr ends with: {self._stderr_tail()}"
            ) from None
        match reply:
            case (True, ProgramResult() as result):
                return result
            case (False, str() as failure):
                raise SolverError(f"the CP-SAT worker failed: {failure}")
        raise SolverError(
            f"the CP-SAT worker answered a {type(reply).__name__}; expected "
            "(True, ProgramResult) or (False, error text)"
        )

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


def write_message(stream: IO[bytes], obj: object) -> None:
    """``obj`` pickled, after its length (8 bytes, little-endian)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)))
    stream.write(data)
    stream.flush()


def read_request(stream: IO[bytes]) -> tuple[IntegerProgram, SolveParams]:
    """The worker's next ``(IntegerProgram, SolveParams)``; EOFError once the
    parent closes the pipe."""
    match read_message(stream):
        case (IntegerProgram() as program, SolveParams() as params):
            return program, params
        case other:
            raise SolverError(
                f"the CP-SAT worker was sent a {type(other).__name__}; expected "
                "(IntegerProgram, SolveParams)"
            )


def read_message(stream: IO[bytes]) -> object:
    """The next object :func:`write_message` wrote; EOFError at the end."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the pipe closed")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("the pipe closed mid-message")
    return pickle.loads(data)
