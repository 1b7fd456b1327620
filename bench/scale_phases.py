"""Where the scale search's time goes: CPU seconds per phase, in one process.

Plans each reference model of ``bench/scale.py`` with ``workers=1``
(OR-tools imported before, as a program that has planned once has it) and
times the search's phases by wrapping them: each phase's *own* CPU seconds,
the phases it calls counted in theirs.  Prints (and with ``--write`` puts in
docs/benchmarks.md, section ``scale-phases``) one row per model.

    .venv/bin/python bench/scale_phases.py [--write] [--only gpt3,llama64,...]

The phases: building stage graphs (``build_lm``), analysing them
(``GraphAnalysis``: dimension graph, cost units, memory model), stacking
(``LayerStack``), pricing the cost tables (``LayoutProblem._price_units``),
the memory rows, building CP-SAT programs and models, CP-SAT's solves
(``SolveLoop.solve``), and the rest (the search's own bookkeeping,
pricing pipelines, checking the winner).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Patching, replace_section  # noqa: E402
from bench.scale import selected_or_error  # noqa: E402
from layout_planner import (  # noqa: E402
    analysis,
    cpsat,
    problem,
    scale_search,
    scale_stages,
    stacked,
)
from layout_planner.ortools_import import load_cp_sat  # noqa: E402

#: (owner, attribute, phase): what is wrapped.
PHASES: list[tuple[Any, str, str]] = [
    (scale_stages.Stages, "graph", "build graphs"),
    (analysis.GraphAnalysis, "__init__", "analyse graphs"),
    (stacked.LayerStack, "__init__", "stack"),
    (stacked.LayerStack, "resized", "stack"),
    (stacked.LayerStack, "analysis", "stack"),
    (problem.LayoutProblem, "_price_units", "price tables"),
    (problem.LayoutProblem, "_memory_rows", "memory rows"),
    (cpsat, "solve_program", "build programs"),
    # imported by name there: wrapped where it is called
    (scale_search, "solve_with_recomputation", "build programs"),
    (cpsat.SolveLoop, "solve", "CP-SAT solves"),
]
ORDER = [
    "price tables",
    "CP-SAT solves",
    "analyse graphs",
    "build graphs",
    "build programs",
    "stack",
    "memory rows",
    "rest",
]


class PhaseClock(Patching):
    """Wraps the phases; ``own[phase]``: CPU seconds spent in it, less what
    the wrapped phases it called spent."""

    def __init__(self) -> None:
        super().__init__()
        self.own: Counter[str] = Counter()
        self._inner: list[float] = []

    def __enter__(self) -> PhaseClock:
        for owner, name, phase in PHASES:
            f = (
                owner.__dict__[name]
                if isinstance(owner, type)
                else getattr(owner, name)
            )
            self.replace(owner, name, self._wrap(f, phase))
        return self

    def _wrap(self, f: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(f)
        def timed(*args: Any, **kw: Any) -> Any:
            t = time.process_time()
            self._inner.append(0.0)
            try:
                return f(*args, **kw)
            finally:
                spent = time.process_time() - t
                inner = self._inner.pop()
                self.own[phase] += spent - inner
                if self._inner:
                    self._inner[-1] += spent

        return timed


def run(cases: list[Any]) -> str:
    rows = [
        "| model | CPU s (one process) | trials | "
        + " | ".join(ORDER)
        + " |\n|---|---|---|"
        + "---|" * len(ORDER)
    ]
    for case in cases:
        with PhaseClock() as clock:
            start = time.process_time()
            plan = case.plan(1)
            total = time.process_time() - start
        shares = dict(clock.own)
        shares["rest"] = total - sum(clock.own.values())
        cells = [
            f"{shares.get(p, 0.0):.2f} ({shares.get(p, 0.0) / total:.0%})"
            for p in ORDER
        ]
        rows.append(
            f"| {case.title} | {total:.2f} | {len(plan.trials)} | "
            + " | ".join(cells)
            + " |"
        )
        print(rows[-1], flush=True)
    return "\n".join(rows)


def bench_main(
    doc: str, run: Callable[[list[Any]], str], section: str, title: str, about: str
) -> None:
    """The command line of a scale-search bench (``--write``, ``--only``):
    OR-tools imported first, as a program that has planned once has it;
    ``run(cases)`` gives the table, written with ``about`` (what it shows)
    under ``title`` in section ``section`` of docs/benchmarks.md."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    args = ap.parse_args()
    cases = selected_or_error(ap, args.only)
    load_cp_sat()
    load_start = os.getloadavg()[0]
    table = run(cases)
    load = f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    print(load)
    if args.write:
        script = os.path.basename(sys.argv[0])
        replace_section(
            section,
            f"Command: `.venv/bin/python bench/{script} --write` ({load}, 2 cores).  "
            + about
            + "\n\n"
            + table,
            title=title,
        )


def main() -> None:
    bench_main(
        __doc__,
        run,
        "scale-phases",
        "Scale search: where the time goes",
        "Each phase's own CPU seconds (and share) in "
        "`plan_transformer(..., workers=1)`; the search's wall clock on two "
        'processes is in "Scale: reference models on their clusters".',
    )


if __name__ == "__main__":
    main()
