"""Forked processes that keep their state between jobs, for the scale search.

The search (:mod:`layout_planner.scale_search`) lays out meshes whose stage
graphs, analyses and unit costs are shared by every mesh of one micro-batch
size.  :class:`Workers` forks processes that each build their own such state
once and run job after job on it, so the parent can send the meshes of one
micro-batch size to the process that already holds its graphs.

Forking unwatched is safe only in a process whose TensorFlow, if loaded,
has not started its runtime (:func:`tensorflow_running`: its thread pools,
which a fork would copy half-held; importing TensorFlow starts none), that
solves in this process (beside a solver process the children would share
its pipe), runs no other Python thread and is not itself a daemonic worker
(:func:`fork_is_safe`).

The search forks its workers *watched* wherever their CPU time can be read
(``Workers(..., watch=True)``, :func:`watched_fork_possible`), and so also
beside a running TensorFlow (a program that ran an op before it planned) or
another library's native threads: a child never calls them, so only a lock
that one of their threads held at the fork (none does while it idles) could
stop it, and a stopped child makes no progress.  A busy child whose CPU
time (``/proc/PID/stat``) stands still for ``stall_s`` while it is neither
runnable nor waiting on the disk, or that dies, raises
:class:`UnsafeFork`; this process then forks no more.  Where no fork is
possible (or after such a stall)
``Workers(..., fresh=True)`` starts each helper as a fresh interpreter
(``python -c``, not ``multiprocessing``'s spawn, which would run the
program's main module again): it imports the planner (about half a second),
is sent the job and the state maker pickled, says it is ready, and serves as
a forked worker does (:func:`fresh_helpers_possible`).
"""

from __future__ import annotations

import ctypes
import gc
import math
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from multiprocessing.connection import Connection, wait
from typing import Any

from layout_planner import solver_process

__all__ = [
    "UnsafeFork",
    "WorkerError",
    "Workers",
    "default_workers",
    "fork_is_safe",
    "fresh_helpers_possible",
    "tensorflow_running",
    "watched_fork_possible",
]

#: What a fresh helper sends once it has imported the planner.
_READY = "ready"

#: Whether the search may fork (watched) workers beside a running
#: TensorFlow (:func:`watched_fork_possible`); False: fresh helpers there.
FORK_BESIDE_TENSORFLOW = True

#: Set when a forked worker stalled or died (:class:`UnsafeFork`): this
#: process forks no more.
_unsafe_fork_seen = False


class WorkerError(RuntimeError):
    """A worker process died or raised what could not be sent back."""


class UnsafeFork(WorkerError):
    """A watched forked worker made no progress for its stall time, or
    died: its work is to be done another way."""


def _fork_possible() -> bool:
    return (
        "fork" in multiprocessing.get_all_start_methods()
        # A daemonic process (a pool's worker) may not have children.
        and not multiprocessing.current_process().daemon
        and threading.active_count() == 1
        and not _unsafe_fork_seen
        and solver_process.solver_location() == "inprocess"
    )


def fork_is_safe() -> bool:
    """Whether this process can fork workers without watching them (see the
    module docstring).  Where it can, OR-tools is imported here first, so
    that the children inherit it instead of each importing it (half a second
    apiece)."""
    return _fork_possible() and not tensorflow_running()


def watched_fork_possible() -> bool:
    """Whether this process can fork workers watched for a stall (see the
    module docstring): a fork is possible but for native threads,
    :data:`FORK_BESIDE_TENSORFLOW` allows it beside a running TensorFlow, no
    forked worker has stalled here before, and a child's CPU time can be
    read."""
    return (
        _fork_possible()
        and (FORK_BESIDE_TENSORFLOW or not tensorflow_running())
        and _cpu_ticks(os.getpid()) is not None
    )


def _cpu_ticks(pid: int) -> tuple[int, str] | None:
    """Process ``pid``'s CPU time (user and system, every thread's) in clock
    ticks, and its state letter (``R``: runnable), or None where it cannot
    be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[11]) + int(fields[12]), fields[0]
    except (IndexError, ValueError):
        return None


def tensorflow_running() -> bool:
    """Whether TensorFlow's runtime has started in this process.

    ``import tensorflow`` starts no thread of TensorFlow's own (2.21: the
    only other threads are OpenBLAS's idle servers, numpy's and scipy's, as
    numpy alone leaves, and whose fork handlers park them).  The first
    tensor, variable, ``tf.function`` call, graph op, session or
    logical-device listing starts its thread pools, named ``tf_Compute``,
    ``tf_graph_runner``, ...  Where this process's threads cannot be listed
    (no ``/proc``), a loaded TensorFlow counts as running."""
    if "tensorflow" not in sys.modules:
        return False
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return True
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/comm") as f:
                name = f.read()
        except OSError:  # it ended meanwhile
            continue
        if name.startswith("tf_"):
            return True
    return False


def fresh_helpers_possible() -> bool:
    """Whether this process can start helpers as fresh interpreters: on
    POSIX, from a process that is not itself a daemonic worker."""
    return (
        os.name == "posix"
        and bool(sys.executable)
        and not multiprocessing.current_process().daemon
    )


def default_workers() -> int:
    """Processes for the search: the usable cores (at most 8) where a
    fork is safe or fresh helpers can be started, else 1."""
    if not (fork_is_safe() or fresh_helpers_possible()):
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


class Workers:
    """``count`` forked processes (fresh interpreters with ``fresh``); each
    calls ``make_state()`` once, then ``job(state, item)`` for every item
    sent to it.

    ``submit(w, key, item)`` sends an item to worker ``w`` (one at a time per
    worker); :meth:`finished` blocks until some worker is done and returns
    ``(key, result)`` for each; ``replace(w)`` abandons worker ``w``'s job
    and starts a fresh worker in its place.  An exception raised by a job is
    raised again here.  Forked, ``job`` and ``make_state`` may be closures:
    the children inherit them at the fork, and only items and results are
    pickled.  Fresh interpreters are sent them pickled, pause their
    collector if this process has (as a fork inherits it), and are not idle
    until they say they are ready (:meth:`finished` returns then too); one
    that dies before is :attr:`lost`, never idle (its work is the caller's).
    With ``watch`` (forked, possibly beside TensorFlow's running threads), a
    busy worker that makes no progress for ``stall_s`` seconds, or dies,
    raises :class:`UnsafeFork` in :meth:`finished` (see the module
    docstring)."""

    def __init__(
        self,
        job: Callable[[Any, Any], Any],
        make_state: Callable[[], Any],
        count: int,
        fresh: bool = False,
        watch: bool = False,
        stall_s: float = 1.0,
    ) -> None:
        if fresh and not fresh_helpers_possible():
            raise WorkerError("this process cannot start helper interpreters")
        if fresh and watch:
            raise WorkerError("only forked workers are watched")
        if watch and not watched_fork_possible():
            raise WorkerError("this process cannot fork watched workers")
        if not (fresh or watch) and not fork_is_safe():
            raise WorkerError("this process cannot fork workers safely")
        if not (math.isfinite(stall_s) and stall_s > 0):
            raise WorkerError(
                f"stall_s must be a positive number of seconds, got {stall_s!r}"
            )
        self._job, self._make_state = job, make_state
        self._fresh = fresh
        self._watch = watch
        self._stall_s = stall_s
        #: Per busy watched worker: its CPU ticks when last seen to move, and
        #: when that was.
        self._progress: dict[int, tuple[int, float]] = {}
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._busy: dict[int, Hashable] = {}
        #: Fresh helpers not ready yet, and those that died starting (an
        #: interpreter that cannot import the planner: the search goes on
        #: without them).
        self._starting: set[int] = set()
        self.lost: set[int] = set()
        for w in range(count):
            conn, proc = self._start()
            self._conns.append(conn)
            self._procs.append(proc)
            if fresh:
                self._starting.add(w)

    def _start(self) -> tuple[Connection, Any]:
        return self._start_fresh() if self._fresh else self._fork()

    def _start_fresh(self) -> tuple[Connection, Any]:
        mine, theirs = multiprocessing.Pipe()  # a socket pair on POSIX
        fd = theirs.fileno()
        code = (
            # The collector paused if it is here (as a fork inherits it: the
            # search pauses it), from the first import on.
            ("" if gc.isenabled() else "import gc; gc.disable(); ")
            # Ctrl-C reaches the whole process group: the parent stops it.
            + "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            f"import sys; sys.path[:0] = {list(sys.path)!r}; "
            "from layout_planner.scale_workers import serve_fresh; "
            f"serve_fresh({fd})"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(fd,), stdin=subprocess.DEVNULL
        )
        theirs.close()
        try:
            mine.send((self._job, self._make_state))
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died at once: lost when it does not say it is ready
        return mine, proc

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
        return [
            w
            for w in range(self.count)
            if w not in self._busy and w not in self._starting and w not in self.lost
        ]

    def busy(self) -> bool:
        """Whether a job runs or a helper is starting (:meth:`finished` has
        something to wait for)."""
        return bool(self._busy or self._starting)

    def running(self) -> dict[int, Hashable]:
        """The key of each busy worker's job."""
        return dict(self._busy)

    def replace(self, w: int) -> None:
        """Stops worker ``w`` (abandoning its job, and the state it built)
        and starts a new one in its place (forked, or a fresh interpreter
        that is not idle until it is ready)."""
        _stop(self._procs[w])
        self._conns[w].close()
        self._busy.pop(w, None)
        self._progress.pop(w, None)
        self._starting.discard(w)
        self.lost.discard(w)
        self._conns[w], self._procs[w] = self._start()
        if self._fresh:
            self._starting.add(w)

    def submit(self, w: int, key: Hashable, item: Any) -> None:
        if w in self._busy:
            raise WorkerError(f"worker {w} is still running {self._busy[w]!r}")
        if w in self._starting:
            raise WorkerError(f"helper {w} is still starting")
        self._conns[w].send(item)
        self._busy[w] = key
        if self._watch:
            seen = _cpu_ticks(self._procs[w].pid)
            self._progress[w] = (-1 if seen is None else seen[0], time.monotonic())

    def finished(self, timeout: float | None = None) -> list[tuple[Hashable, Any]]:
        """The results of the jobs that end next (at least one, unless a
        fresh helper said it is ready first): blocks, or with ``timeout``
        waits at most that long (0: takes what has ended, maybe nothing)."""
        if not self.busy():
            if timeout is not None:
                return []
            raise WorkerError("no job is running")
        conns = [self._conns[w] for w in (*self._busy, *self._starting)]
        ready = (
            self._wait_watched(conns, timeout) if self._watch else wait(conns, timeout)
        )
        for w in list(self._starting):
            if self._conns[w] in ready:
                self._starting.discard(w)
                try:
                    said = self._conns[w].recv()
                except (EOFError, OSError):
                    said = None  # it died: its traceback is on stderr
                if said != _READY:
                    self.lost.add(w)
        out = []
        for w in list(self._busy):
            conn = self._conns[w]
            if conn not in ready:
                continue
            try:
                ok, value = conn.recv()
            except (EOFError, OSError) as e:
                died = f"search worker {w} died running {self._busy[w]!r}"
                if self._watch:
                    raise self._unsafe(died) from e
                raise WorkerError(died) from e
            key = self._busy.pop(w)
            self._progress.pop(w, None)
            if not ok:
                raise value
            out.append((key, value))
        return out

    def _wait_watched(
        self, conns: list[Connection], timeout: float | None
    ) -> list[Any]:
        """``wait(conns, timeout)``, checking the busy workers' progress every
        quarter of the stall time meanwhile."""
        now = time.monotonic()
        deadline = math.inf if timeout is None else now + timeout
        while True:
            ready = wait(conns, max(0.0, min(self._stall_s / 4, deadline - now)))
            now = time.monotonic()
            if ready or now >= deadline:
                return ready
            self._check_progress(now)

    def _check_progress(self, now: float) -> None:
        """Raises :class:`UnsafeFork` if a busy worker's CPU time has stood
        still for the stall time while it was neither runnable nor waiting
        on the disk."""
        for w, key in self._busy.items():
            ticks, since = self._progress[w]
            seen = _cpu_ticks(self._procs[w].pid)
            if seen is None:  # gone: its pipe says so next
                continue
            if seen[0] != ticks or seen[1] in "RD":  # running, or paging in
                self._progress[w] = (seen[0], now)
            elif now - since >= self._stall_s:
                raise self._unsafe(
                    f"search worker {w} made no progress for "
                    f"{now - since:.1f} s running {key!r}"
                )

    def _unsafe(self, message: str) -> UnsafeFork:
        """Notes that a forked worker failed here (this process forks no
        more) and says so."""
        global _unsafe_fork_seen
        _unsafe_fork_seen = True
        return UnsafeFork(message)

    def close(self) -> None:
        """Stops every worker (a job still running is abandoned).  Forked
        workers are not waited for: the kernel takes 10-30 ms to free the
        two workers' memory, which the plan need not wait out;
        ``multiprocessing`` reaps them when this process next starts one,
        lists its children or exits.  Fresh helpers are waited for."""
        for proc in self._procs:
            _stop(proc, wait=False)
        for proc in self._procs:
            _stop(proc, wait=isinstance(proc, subprocess.Popen))
        for conn in self._conns:
            conn.close()
        self._busy.clear()
        self._progress.clear()
        self._starting.clear()

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


def _stop(proc: Any, wait: bool = True) -> None:
    """Terminates a forked worker (a ``multiprocessing`` process) or a fresh
    helper (a ``subprocess.Popen``) if it runs, and with ``wait`` reaps it."""
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.terminate()
        if wait:
            proc.wait()
        return
    if proc.is_alive():
        proc.terminate()
    if wait:
        proc.join()


def serve_fresh(fd: int) -> None:
    """A fresh helper's main (see the module docstring): ``fd`` is its end of
    the pipe.  It dies with the parent (Linux), or when the pipe closes."""
    try:  # PR_SET_PDEATHSIG: SIGTERM when the parent dies, even mid-job
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    conn = Connection(fd)
    try:
        job, make_state = conn.recv()  # unpickling imports the planner
    except EOFError:
        return
    from layout_planner.ortools_import import load_cp_sat

    load_cp_sat()  # before the first job, as a forked worker inherits it
    conn.send(_READY)
    _serve(conn, job, make_state, [])
