"""What runs inside a solve worker process (started by :mod:`api.workers`).

The worker is a *spawned* interpreter: it imports the planner and OR-tools,
never TensorFlow, and never shares memory with the web server.  It reads
``(task_id, task)`` messages from its pipe and answers each with progress
messages and one result or error, until the pipe closes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from cost_models.gc_pause import gc_paused

Report = Callable[[str, float], None]


def solve_task(task: dict[str, Any], report: Report) -> dict[str, Any]:
    """Plans one task (``PlanSpec.task()``, or ``ScaleSpec.task()`` when its
    ``kind`` is ``"scale"``); returns the plan as JSON-able data."""
    if task.get("kind") == "scale":
        from api.scale_planning import solve_scale_task

        return solve_scale_task(task, report)
    from layout_planner.options import PlanOptions
    from layout_planner.planner import auto_layout
    from mtf_core.serialization import graph_from_json
    from mtf_core.serialization.schema import json_safe

    t0 = time.perf_counter()
    report("loading graph", 0.1)
    loaded = graph_from_json(task["graph_json"])
    options = PlanOptions.from_dict(task["options"])
    report("solving", 0.2)
    mesh = task["mesh_shape"] if task["mesh_shape"] is not None else task["num_devices"]
    plan = auto_layout(
        loaded.graph,
        mesh,
        loaded.outputs,
        options=options,
        # The mesh-shape search reports each shape it tries: 0.2 .. 0.9.
        progress=lambda phase, fraction: report(phase, 0.2 + 0.7 * fraction),
    )
    report("storing plan", 0.95)
    return {
        "plan": json_safe(plan.to_dict(), "plan"),
        "solve_time_s": time.perf_counter() - t0,
    }


def is_client_error(error: BaseException) -> bool:
    """Whether ``error`` blames the request: the planner's, the graph reader's
    and the cost model's input errors (and their subclasses).  Any other
    exception, a numpy ``ValueError`` or an internal ``MtfError`` included, is
    a bug of ours (a 500 with an error id, never a 4xx)."""
    from cost_models.hardware import CostModelError
    from layout_planner.errors import PlannerError
    from mtf_core.errors import SerializationError

    return isinstance(error, PlannerError | SerializationError | CostModelError)


def answer(
    conn: Connection,
    task_id: str,
    task: dict[str, Any],
    solve: Callable[[dict[str, Any], Report], dict[str, Any]],
) -> bool:
    """Solves ``task`` with ``solve``, sending its progress and then its
    result (or why it failed) on ``conn``; False if the parent is gone.

    The collector stays paused until the reply is sent: a plan leaves its
    graphs behind as cyclic garbage (hundreds of thousands of objects, a
    tenth of a second or more to collect), which is collected while the
    worker waits for its next task, not while the client waits for this
    answer."""

    def report(phase: str, fraction: float) -> None:
        conn.send(("progress", task_id, (phase, fraction)))

    with gc_paused():
        reply: tuple[str, str, Any]
        try:
            reply = ("result", task_id, solve(task, report))
        except Exception as e:
            if is_client_error(e):  # the request asks for something impossible
                reply = ("invalid", task_id, f"{type(e).__name__}: {e}")
            else:  # solver crash or planner bug: the traceback helps (the log)
                reply = ("failed", task_id, traceback.format_exc(limit=12))
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return False
    return True


def worker_main(conn: Connection) -> None:
    """The worker process's loop."""
    _die_with_parent()
    os.environ["MTF_PLANNER_SOLVER"] = "inprocess"
    # Import the planner and OR-tools up front, so the first solve is not slow.
    import layout_planner.cpsat  # noqa: F401
    import layout_planner.planner  # noqa: F401

    if "tensorflow" in sys.modules:  # pragma: no cover - a packaging bug
        conn.send(("fatal", None, "tensorflow was imported in a solve worker"))
        return
    conn.send(("ready", None, os.getpid()))
    while True:
        try:
            task_id, task = conn.recv()
        except (EOFError, OSError):
            return

        if not answer(conn, task_id, task, solve_task):
            return


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the server dies (even by ``kill -9``);
    elsewhere a thread watches the parent's pid."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
