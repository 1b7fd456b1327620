"""What importing OR-tools' CP-SAT costs a fresh planner process.

``layout_planner.ortools_import.load_cp_sat`` hands ``cp_model`` a stand-in
for pandas, which it imports only for helpers the planner never calls.  Each
run is a fresh interpreter that has imported what the planner imports
before it (numpy, the planner's modules) and then times one of:

* ``load_cp_sat()``: the planner's import;
* ``import pandas`` then ``load_cp_sat()``: what the same import cost while
  ``cp_model`` imported pandas itself (pandas is then the real module);
* ``load_cp_sat()`` then the first use of a ``*_series`` helper, which
  imports pandas: what a caller of those helpers pays, later.

The three alternate; prints the medians and, with ``--write``, puts them in
docs/benchmarks.md, section ``cp-sat-import``.

    .venv/bin/python bench/cp_sat_import.py [--runs 15] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (  # noqa: E402
    child_json,
    command_line,
    machine_summary,
    markdown_table,
    replace_section,
)

_CHILD = """
import json, sys, time
import numpy
import layout_planner.choices  # the planner, before it solves
from layout_planner.ortools_import import load_cp_sat
how = sys.argv[1]
start = time.perf_counter()
if how == "pandas first":
    import pandas
load_cp_sat()
if how == "then a series helper":
    import pandas
    from ortools.sat.python import cp_model
    cp_model.CpModel().new_int_var_series("v", pandas.Index([0, 1]), 0, 1)
print(json.dumps([time.perf_counter() - start, "pandas" in sys.modules]))
"""

_WAYS = {
    "load_cp_sat()": "the planner's import",
    "pandas first": "`import pandas`, then `load_cp_sat()` (as before)",
    "then a series helper": "`load_cp_sat()`, then a `*_series` helper's first use",
}


def _once(how: str) -> tuple[float, bool]:
    seconds, pandas = child_json(_CHILD, [how], repr(how))
    return seconds, pandas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="runs of each way")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: expected at least 1")
    machine = machine_summary()
    times: dict[str, list[float]] = {how: [] for how in _WAYS}
    loaded: dict[str, set[bool]] = {how: set() for how in _WAYS}
    for run in range(args.runs):
        for how in _WAYS:
            seconds, pandas = _once(how)
            times[how].append(seconds)
            loaded[how].add(pandas)
        print(f"run {run + 1}/{args.runs}", flush=True)
    base = statistics.median(times["pandas first"])
    rows = []
    for how, what in _WAYS.items():
        med = statistics.median(times[how])
        pandas = (
            "yes" if loaded[how] == {True} else "no" if loaded[how] == {False} else "?"
        )
        rows.append([what, f"{med * 1000:.0f}", f"{med / base:.2f}", pandas])
    headers = ["what is timed", "median ms", "ratio to pandas first", "pandas imported"]
    body = (
        "## Importing CP-SAT in a fresh planner process\n\n"
        f"Command: `{command_line()}` ({machine}; {args.runs} fresh interpreters "
        "per row, the rows in turn, each with numpy and the planner imported "
        "before the clock).\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        replace_section("cp-sat-import", body)


if __name__ == "__main__":
    main()
