"""Forked processes that keep their state between jobs, for the scale search.

The search (:mod:`layout_planner.scale_search`) lays out meshes whose stage
graphs, analyses and unit costs are shared by every mesh of one micro-batch
size.  :class:`Workers` forks processes that each build their own such state
once and run job after job on it, so the parent can send the meshes of one
micro-batch size to the process that already holds its graphs.

Forking is safe only in a process that has not loaded TensorFlow (whose
threads a fork would copy half-held, and beside which CP-SAT runs in a
solver process whose pipe the children would share), solves in this process,
runs no other thread and is not itself a daemonic worker
(:func:`fork_is_safe`); elsewhere the search runs in this process, whatever
was asked.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection, wait
from typing import Any

from layout_planner import solver_process

__all__ = ["WorkerError", "Workers", "default_workers", "fork_is_safe"]


class WorkerError(RuntimeError):
    """A worker process died or raised what could not be sent back."""


def fork_is_safe() -> bool:
    """Whether this process can fork workers (see the module docstring).
    Where it can, OR-tools is imported here first, so that the children
    inherit it instead of each importing it (half a second apiece)."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
        # A daemonic process (a pool's worker) may not have children.
        and not multiprocessing.current_process().daemon
        and "tensorflow" not in sys.modules
        and threading.active_count() == 1
        and solver_process.solver_location() == "inprocess"
    )


def default_workers() -> int:
    """Processes for the search: the usable cores (at most 8) where a
    fork is safe, else 1."""
    if not fork_is_safe():
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


class Workers:
    """``count`` forked processes; each calls ``make_state()`` once, then
    ``job(state, item)`` for every item sent to it.

    ``submit(w, key, item)`` sends an item to worker ``w`` (one at a time per
    worker); :meth:`finished` blocks until some worker is done and returns
    ``(key, result)`` for each; ``replace(w)`` abandons worker ``w``'s job
    and forks a fresh worker in its place.  An exception raised by a job is
    raised again here.  ``job`` and ``make_state`` may be closures: the children
    inherit them at the fork, and only items and results are pickled."""

    def __init__(
        self,
        job: Callable[[Any, Any], Any],
        make_state: Callable[[], Any],
        count: int,
    ) -> None:
        if not fork_is_safe():
            raise WorkerError("this process cannot fork workers safely")
        self._job, self._make_state = job, make_state
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._busy: dict[int, Hashable] = {}
        for _ in range(count):
            conn, proc = self._fork()
            self._conns.append(conn)
            self._procs.append(proc)

    def _fork(self) -> tuple[Connection, Any]:
        mine, theirs = multiprocessing.get_context("fork").Pipe()
        # The child closes its copies of the parent's ends, or a parent that
        # dies would leave it waiting on a pipe it holds open itself.
        parents = [*self._conns, mine]
        proc = multiprocessing.get_context("fork").Process(
            target=_serve,
            args=(theirs, self._job, self._make_state, parents),
            daemon=True,
        )
        proc.start()
        theirs.close()
        return mine, proc

    @property
    def count(self) -> int:
        return len(self._conns)

    def idle(self) -> list[int]:
        return [w for w in range(self.count) if w not in self._busy]

    def busy(self) -> bool:
        return bool(self._busy)

    def running(self) -> dict[int, Hashable]:
        """The key of each busy worker's job."""
        return dict(self._busy)

    def replace(self, w: int) -> None:
        """Stops worker ``w`` (abandoning its job, and the state it built)
        and forks a fresh one in its place."""
        proc = self._procs[w]
        if proc.is_alive():
            proc.terminate()
        proc.join()
        self._conns[w].close()
        self._busy.pop(w, None)
        self._conns[w], self._procs[w] = self._fork()

    def submit(self, w: int, key: Hashable, item: Any) -> None:
        if w in self._busy:
            raise WorkerError(f"worker {w} is still running {self._busy[w]!r}")
        self._conns[w].send(item)
        self._busy[w] = key

    def finished(self) -> list[tuple[Hashable, Any]]:
        """The results of the jobs that end next (at least one): blocks."""
        if not self._busy:
            raise WorkerError("no job is running")
        ready = wait([self._conns[w] for w in self._busy])
        out = []
        for w in list(self._busy):
            conn = self._conns[w]
            if conn not in ready:
                continue
            try:
                ok, value = conn.recv()
            except (EOFError, OSError) as e:
                raise WorkerError(
                    f"search worker {w} died running {self._busy[w]!r}"
                ) from e
            key = self._busy.pop(w)
            if not ok:
                raise value
            out.append((key, value))
        return out

    def close(self) -> None:
        """Stops every worker (a job still running is abandoned)."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join()
        for conn in self._conns:
            conn.close()
        self._busy.clear()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(
    conn: Connection,
    job: Callable[[Any, Any], Any],
    make_state: Callable[[], Any],
    parents: list[Connection],
) -> None:
    for end in parents:
        end.close()
    # Ctrl-C reaches the whole process group: the parent stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    state = make_state()
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[bool, Any] = (True, job(state, item))
        except Exception as e:  # raised again in the parent, with where it was
            e.add_note("in a search worker:\n" + traceback.format_exc().rstrip())
            reply = (False, e)
        try:
            conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):
            return  # the parent is gone
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            what = "".join(traceback.format_exception_only(e)).strip()
            conn.send((False, WorkerError(f"a search job's result: {what}")))
