"""A pool of solve worker processes behind a bounded queue, with cancellation.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop a task that
has started, and cancelling a running solve is a feature here.  Each worker
slot is a supervising thread that owns one *spawned* process (a fresh
interpreter: no TensorFlow, no copy of the server's memory) and a pipe to it.
Cancelling a running task kills its process; the slot starts a new one.

States of a task: queued (in the bounded deque) -> running (sent to a worker)
-> done | failed | cancelled.  ``submit`` raises :class:`QueueFull` when
``queue_size`` tasks are already waiting (the API answers 429).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api.worker_main import worker_main

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]

#: How long a new worker may take to import the planner and OR-tools.
_START_TIMEOUT_S = 120.0


class QueueFull(Exception):
    """The queue holds ``queue_size`` tasks already."""


class TaskCancelled(Exception):
    """The task was cancelled before it finished."""


class TaskInvalid(ValueError):
    """The planner rejected the request (bad input found while planning)."""


class TaskFailed(RuntimeError):
    """The solve failed: a solver error, a planner bug, or the worker died.
    The message says nothing of the internals; ``error_id`` finds them in the
    server's log."""

    def __init__(self, message: str, error_id: str | None = None) -> None:
        super().__init__(message)
        self.error_id = error_id


@dataclass
class _Task:
    id: str
    payload: dict[str, Any]
    on_start: Callable[[], None] | None
    on_progress: Progress | None
    future: concurrent.futures.Future[Any] = field(
        default_factory=concurrent.futures.Future
    )
    cancel_requested: bool = False


class _Slot:
    """One worker process and the thread that feeds it."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.proc: Any = None
        self.conn: Any = None
        self.task: _Task | None = None
        self.ready = False
        # For readiness: a slot that has started a worker once and whose last
        # start did not fail is "up", even while it respawns after a cancel.
        self.started_once = False
        self.start_failed = False
        self.thread = threading.Thread(
            target=self._run, name=f"solve-worker-{index}", daemon=True
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def _spawn(self) -> bool:
        """Starts the worker process and waits for it to say it is ready."""
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=worker_main,
            args=(child,),
            name=f"mtf-solve-{self.index}",
            daemon=True,
        )
        proc.start()
        child.close()
        self.proc, self.conn = proc, parent
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            while time.monotonic() < deadline and not self.pool.closed:
                if parent.poll(0.25):
                    kind, _, body = parent.recv()
                    if kind == "ready":
                        self.ready = self.started_once = True
                        self.start_failed = False
                        return True
                    raise EOFError(body)
                if not proc.is_alive():
                    raise EOFError(f"exit code {proc.exitcode}")
        except (EOFError, OSError) as e:
            if not self.pool.closed:
                log.error("solve worker %d did not start: %s", self.index, e)
        self.start_failed = not self.pool.closed
        self.kill()
        self.proc = None
        return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()

    def _run(self) -> None:
        while not self.pool.closed:
            if not self.alive:
                self.ready = False
                if not self._spawn():
                    time.sleep(1.0)  # do not spin on a worker that cannot start
                    continue
            task = self.pool._next_task(self)
            if task is None:
                continue
            try:
                if self.alive or self._spawn():  # it may have died while idle
                    self._serve(task)
                else:
                    task.future.set_exception(
                        TaskFailed(
                            "no solve worker process could start; see the server log"
                        )
                    )
            finally:
                self.task = None
                self.pool._task_finished()
        self.kill()
        if self.proc is not None:
            self.proc.join(timeout=5)

    def _serve(self, task: _Task) -> None:
        if task.on_start is not None:
            task.on_start()
        try:
            self.conn.send((task.id, task.payload))
            while True:
                if not self.conn.poll(0.25):
                    if not self.proc.is_alive():
                        raise EOFError
                    continue
                kind, task_id, body = self.conn.recv()
                if task_id != task.id:
                    continue
                if kind == "progress":
                    if task.on_progress is not None:
                        task.on_progress(*body)
                    continue
                if kind == "result":
                    task.future.set_result(body)
                elif kind == "invalid":
                    task.future.set_exception(TaskInvalid(body))
                else:  # our bug: the log gets the traceback, the client an id
                    error_id = uuid.uuid4().hex[:12]
                    log.error(
                        "job %s failed in the solve worker [error id %s]:\n%s",
                        task.id,
                        error_id,
                        body,
                    )
                    task.future.set_exception(
                        TaskFailed(
                            f"the solve failed on the server (error id {error_id}); "
                            "this is a bug of the planner service, not of the request",
                            error_id,
                        )
                    )
                return
        except (EOFError, OSError, BrokenPipeError):
            self.proc.join(timeout=5)
            if task.cancel_requested:
                task.future.set_exception(TaskCancelled(f"job {task.id} was cancelled"))
            else:
                task.future.set_exception(
                    TaskFailed(
                        f"the solve worker process died (exit code "
                        f"{self.proc.exitcode}) while planning job {task.id}"
                    )
                )
            self.proc = None


class WorkerPool:
    """``workers`` solve processes, a queue of at most ``queue_size`` tasks."""

    def __init__(self, workers: int, queue_size: int) -> None:
        self.queue_size = queue_size
        self.closed = False
        self._cond = threading.Condition()
        self._queue: collections.deque[_Task] = collections.deque()
        self._running = 0
        self._slots = [_Slot(self, i) for i in range(workers)]

    def start(self) -> None:
        for slot in self._slots:
            slot.thread.start()

    def submit(
        self,
        task_id: str,
        payload: dict[str, Any],
        on_start: Callable[[], None] | None = None,
        on_progress: Progress | None = None,
    ) -> concurrent.futures.Future[Any]:
        """Queues a task; its future holds the worker's result or raises
        TaskInvalid / TaskFailed / TaskCancelled."""
        with self._cond:
            if self.closed:
                raise TaskFailed("the worker pool is shut down")
            if len(self._queue) >= self.queue_size:
                raise QueueFull(
                    f"{len(self._queue)} jobs are waiting (queue_size="
                    f"{self.queue_size}); try again later"
                )
            task = _Task(task_id, payload, on_start, on_progress)
            self._queue.append(task)
            self._cond.notify()
            return task.future

    def cancel(self, task_id: str) -> bool:
        """Cancels a queued or running task; False if it is not here."""
        with self._cond:
            for task in self._queue:
                if task.id == task_id:
                    self._queue.remove(task)
                    task.future.set_exception(
                        TaskCancelled(f"job {task_id} was cancelled before it ran")
                    )
                    return True
            for slot in self._slots:
                if slot.task is not None and slot.task.id == task_id:
                    slot.task.cancel_requested = True
                    slot.kill()
                    return True
        return False

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return self._running

    @property
    def workers(self) -> int:
        return len(self._slots)

    @property
    def alive(self) -> int:
        """Worker processes started and ready for tasks."""
        return sum(slot.alive and slot.ready for slot in self._slots)

    @property
    def up(self) -> bool:
        """Whether every slot is serving: its worker started and has not
        failed to start since (a worker respawning after a cancel counts)."""
        return all(
            slot.thread.is_alive() and slot.started_once and not slot.start_failed
            for slot in self._slots
        )

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Waits until every worker process has started (tests, startup)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive == len(self._slots):
                return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        with self._cond:
            self.closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for task in pending:
            task.future.set_exception(TaskCancelled("the service is shutting down"))
        for slot in self._slots:
            if slot.task is not None:
                slot.task.cancel_requested = True
            slot.kill()
        for slot in self._slots:
            slot.thread.join(timeout=5)

    def _next_task(self, slot: _Slot) -> _Task | None:
        with self._cond:
            while not self._queue and not self.closed:
                self._cond.wait(timeout=1.0)
            if self.closed:
                return None
            self._running += 1
            # Under the lock, so that cancel() always finds the task somewhere.
            slot.task = self._queue.popleft()
            return slot.task

    def _task_finished(self) -> None:
        with self._cond:
            self._running -= 1
