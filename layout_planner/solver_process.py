"""Where CP-SAT runs: in this process when that is safe, else in a clean worker.

OR-tools 9.15's CP-SAT crashes (SIGSEGV inside ``Solve``) in a process that
loaded TensorFlow 2.21 *before* OR-tools; loaded the other way round both work
(``tests/test_planner_tf_safety.py`` runs both orders in subprocesses).  So:

* if TensorFlow is not loaded when the first solve happens, OR-tools is
  imported here and now, and every later solve in this process runs in place;
* otherwise (TensorFlow first, or both already loaded in an unknown order) the
  program, plain picklable data, goes to a worker process started with
  ``python -m layout_planner.solver_worker``: a fresh interpreter that never
  imports TensorFlow.  The worker is started once and reused.

``MTF_PLANNER_SOLVER=inprocess|subprocess`` forces one or the other.
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
from typing import IO, Any

from layout_planner.errors import SolverError
from layout_planner.program import IntegerProgram, ProgramResult, SolveParams

_ENV = "MTF_PLANNER_SOLVER"
_ORTOOLS = "ortools.sat.python.cp_model"
_lock = threading.Lock()
_inprocess_safe: bool | None = None
_worker: _Worker | None = None


def solve(program: IntegerProgram, params: SolveParams) -> tuple[ProgramResult, str]:
    """Solves ``program``; returns the result and where it ran
    (``"inprocess"`` or ``"subprocess"``)."""
    where = solver_location()
    if where == "inprocess":
        from layout_planner.cpsat import solve_program

        return solve_program(program, params), where
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
    """``"inprocess"`` or ``"subprocess"``: where the next solve will run."""
    forced = os.environ.get(_ENV, "").strip().lower()
    if forced in ("inprocess", "subprocess"):
        return forced
    if forced:
        from layout_planner.errors import PlannerError

        raise PlannerError(
            f"{_ENV}={forced!r} is not understood; expected 'inprocess' or "
            "'subprocess' (or unset)"
        )
    global _inprocess_safe
    with _lock:
        if _inprocess_safe is None:
            if "tensorflow" in sys.modules:
                _inprocess_safe = False
            else:
                # Loading OR-tools before TensorFlow makes both safe for the
                # life of this process.
                __import__(_ORTOOLS)
                _inprocess_safe = True
    return "inprocess" if _inprocess_safe else "subprocess"


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
