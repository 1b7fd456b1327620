"""The scale search's passes on several cores.

The first pass (:func:`layout_planner.scale_search.search`) lays out every
mesh without recomputation and without a memory limit: trials that share
nothing but the graphs of a micro-batch size, so they split across forked
processes by micro-batch size (each process builds the graphs of its sizes
once).  The second pass's joint programs run in batches of forked
processes.  The parent gets each mesh's outcome back and applies the
sequential passes' rule (stop at the first mesh whose bound the best fitting
step found before it reaches), so the trials and the plan are the same for
any number of processes; only the meshes past that point are laid out for
nothing.

Forking is safe only in a process that has not loaded TensorFlow (whose
threads a fork would copy half-held, and beside which CP-SAT runs in a
solver process whose pipe the children would share), solves in this process
and runs no other thread; elsewhere :func:`map_forked` runs in this process,
whatever was asked.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from layout_planner import solver_process

__all__ = ["default_workers", "fork_is_safe", "map_forked"]

#: What a forked worker runs: set in the parent just before the fork, read
#: by the children (a fork copies it; nothing is pickled on the way in).
_JOB: Callable[[Any], Any] | None = None


def fork_is_safe() -> bool:
    """Whether this process can fork workers (see the module docstring).
    Where it can, OR-tools is imported here first, so that the children
    inherit it instead of each importing it (half a second apiece)."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
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


def map_forked(
    job: Callable[[Any], Any],
    items: Sequence[Any],
    workers: int,
    done: Callable[[int], None] | None = None,
) -> list[Any]:
    """``[job(item) for item in items]`` on ``workers`` forked processes
    (in this process when ``workers <= 1``, there is one item, or a fork is
    not safe here: :func:`fork_is_safe`), results
    in the order of ``items``; ``done(k)`` after each of ``k`` results.
    ``job`` may be a closure: the children inherit it; results are pickled
    back."""
    global _JOB
    if workers <= 1 or len(items) <= 1 or not fork_is_safe():
        out = []
        for k, item in enumerate(items):
            out.append(job(item))
            if done is not None:
                done(k + 1)
        return out
    _JOB = job
    try:
        ctx = multiprocessing.get_context("fork")
        results: dict[int, Any] = {}
        with ctx.Pool(min(workers, len(items))) as pool:
            for k, (i, got) in enumerate(
                pool.imap_unordered(_indexed, list(enumerate(items)))
            ):
                results[i] = got
                if done is not None:
                    done(k + 1)
        return [results[i] for i in range(len(items))]
    finally:
        _JOB = None


def _indexed(pair: tuple[int, Any]) -> tuple[int, Any]:
    i, item = pair
    assert _JOB is not None
    return i, _JOB(item)
