"""What the scale search's two processes do that one process does not.

Plans each reference model of ``bench/scale.py`` in one process
(``workers=1``) and on two forked workers (``workers=2``), with the phases
of ``bench/scale_phases.py`` clocked in every process (the workers inherit
the clock at the fork), and counts the stage graphs each process builds
(and their layers), the layer stacks it makes afresh (each from a 2-, 3-
and 4-layer graph; another micro-batch size resizes one), the dimension
graphs it makes and the unit prices it computes (``UnitPricer.cost``: what
the prices its meshes share missed).  Every process writes its counts and its CPU seconds after
each trial and each check to a file of its own, which the parent reads at
the end (a worker replaced mid-job loses what it did since its last
write).  Prints (and with ``--write`` puts in docs/benchmarks.md, section
``scale-workers``) one row per model: where the second process's CPU goes.

    .venv/bin/python bench/scale_workers.py [--write] [--only gpt3,llama64,...]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Patching  # noqa: E402
from bench.scale_phases import PhaseClock, bench_main  # noqa: E402
from cost_models import units  # noqa: E402
from layout_planner import scale_search, scale_stages, stacked  # noqa: E402
from layout_planner.dim_graph import DimensionGraph  # noqa: E402


class _Counts(Patching):
    """Graphs built and unit prices computed in this process (and, after a
    fork, in each child: each writes its own file under ``folder``)."""

    def __init__(self, folder: str, clock: PhaseClock) -> None:
        super().__init__()
        self.folder, self.clock = folder, clock
        self.counts: Counter[str] = Counter()

    def __enter__(self) -> _Counts:
        # A forked child's CPU clock starts at zero; this process's at its start.
        self._pid, self._cpu0 = os.getpid(), time.process_time()
        counts, write = self.counts, self.write
        price, graph, trial, check = (
            units.UnitPricer.cost,
            scale_stages.Stages.graph,
            scale_search._trial,
            scale_search._full_evaluation,
        )
        stack, dim_graph = stacked.LayerStack.__init__, DimensionGraph.from_graph

        def counted_price(pricer: Any, *args: Any, **kw: Any) -> Any:
            counts["unit prices"] += 1
            return price(pricer, *args, **kw)

        def counted_graph(stages: Any, choice: Any, layers: int) -> Any:
            if stages._key(choice, layers) not in stages._graphs:
                counts["graphs"] += 1
                counts["layers"] += layers
            return graph(stages, choice, layers)

        def counted_stack(made: Any, *args: Any, **kw: Any) -> None:
            counts["stacks"] += 1
            stack(made, *args, **kw)

        def counted_dim_graph(cls: Any, *args: Any, **kw: Any) -> Any:
            counts["dimension graphs"] += 1
            return dim_graph(*args, **kw)

        def written_trial(*args: Any, **kw: Any) -> Any:
            try:
                return trial(*args, **kw)
            finally:
                write()

        def written_check(*args: Any, **kw: Any) -> Any:
            try:
                return check(*args, **kw)
            finally:
                write()

        for owner, name, f in (
            (units.UnitPricer, "cost", counted_price),
            (scale_stages.Stages, "graph", counted_graph),
            (stacked.LayerStack, "__init__", counted_stack),
            (DimensionGraph, "from_graph", classmethod(counted_dim_graph)),
            (scale_search, "_trial", written_trial),
            (scale_search, "_full_evaluation", written_check),
        ):
            self.replace(owner, name, f)
        return self

    def write(self) -> None:
        cpu = {phase: round(s, 4) for phase, s in self.clock.own.items()}
        used = time.process_time()
        if os.getpid() == self._pid:
            used -= self._cpu0
        cpu["all"] = round(used, 4)
        path = os.path.join(self.folder, f"{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"counts": dict(self.counts), "cpu": cpu}, f)


def _plan(case: Any, workers: int) -> tuple[float, list[dict[str, Any]]]:
    """(wall seconds, each process's counts and phase CPU seconds)."""
    with tempfile.TemporaryDirectory() as folder:
        clock = PhaseClock()
        with clock, _Counts(folder, clock) as counts:
            start = time.perf_counter()
            case.plan(workers)
            wall = time.perf_counter() - start
            counts.write()  # the parent's (its check, where it made one)
        got = []
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name)) as f:
                got.append(json.load(f))
    return wall, got


def _total(procs: list[dict[str, Any]], what: str, keys: tuple[str, ...]) -> float:
    """``what`` (counts or CPU seconds) summed over ``procs`` and ``keys``."""
    return sum(p[what].get(k, 0) for p in procs for k in keys)


def _pair(
    one: list[dict[str, Any]],
    two: list[dict[str, Any]],
    what: str,
    *keys: str,
    digits: int = 2,
) -> str:
    a, b = (_total(procs, what, keys) for procs in (one, two))
    return f"{a:.{digits}f} / {b:.{digits}f}"


def run(cases: list[Any]) -> str:
    rows = [
        "| model | wall s, 1 / 2 processes | CPU s (every process) "
        "| price tables CPU s | build and analyse graphs CPU s | graphs built "
        "(layers) | stacks made afresh | dimension graphs | unit prices computed "
        "|\n|---|---|---|---|---|---|---|---|---|"
    ]
    for case in cases:
        one_wall, one = _plan(case, 1)
        two_wall, two = _plan(case, 2)

        rows.append(
            f"| {case.title} | {one_wall:.2f} / {two_wall:.2f} "
            f"| {_pair(one, two, 'cpu', 'all')} "
            f"| {_pair(one, two, 'cpu', 'price tables')} "
            f"| {_pair(one, two, 'cpu', 'build graphs', 'analyse graphs', 'stack')} "
            f"| {_pair(one, two, 'counts', 'graphs', digits=0)} "
            f"({_pair(one, two, 'counts', 'layers', digits=0)}) "
            f"| {_pair(one, two, 'counts', 'stacks', digits=0)} "
            f"| {_pair(one, two, 'counts', 'dimension graphs', digits=0)} "
            f"| {_pair(one, two, 'counts', 'unit prices', digits=0)} |"
        )
        print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    bench_main(
        __doc__,
        run,
        "scale-workers",
        "Scale search: what the second process repeats",
        "Each model planned in one process and on two forked workers, the "
        "phases of `bench/scale_phases.py` clocked in every process (their CPU "
        "seconds summed over the processes), the stage graphs built (their "
        "layers), the layer stacks made afresh, the dimension graphs made and "
        "the unit prices computed (each process shares its graphs, stacks and "
        "prices among its meshes, not with the other).",
    )


if __name__ == "__main__":
    main()
