"""OR-tools' CP-SAT without pandas until pandas is used.

``cp_model`` imports pandas for its ``*_series`` helpers only;
``layout_planner.ortools_import`` hands it a stand-in that imports pandas at
first use.  Each case runs in a fresh interpreter: this one has OR-tools
imported already.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.solver

SOLVE = """
import sys
from layout_planner.ortools_import import load_cp_sat
load_cp_sat()
from ortools.sat.python import cp_model
m = cp_model.CpModel()
xs = [m.new_bool_var(f"x{i}") for i in range(20)]
for a, b in zip(xs, xs[1:]):
    m.add_at_most_one(a, b)
m.maximize(sum(xs))
s = cp_model.CpSolver()
assert s.solve(m) == cp_model.OPTIMAL, s.status_name()
print("solved", int(s.objective_value), "pandas" in sys.modules)
"""
SERIES = """
import pandas as pd
v = m.new_int_var_series("v", pd.Index(["a", "b", "c"]), 0, 3)
m.add(v.sum() == 7)
m.maximize(4 * v["a"] + 2 * v["b"] + v["c"])  # one optimum: 3, 3, 1
assert s.solve(m) == cp_model.OPTIMAL, s.status_name()
got = s.values(v)
print("series", type(got).__module__.split(".")[0], got.tolist())
"""


def run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_cp_sat_solves_without_importing_pandas_and_its_series_helpers_still_work():
    # A plain solve leaves pandas unimported; the first use of a pandas
    # helper imports the real pandas, whose types cp_model then checks.
    assert run(SOLVE + SERIES) == [
        *("solved", "10", "False"),
        *("series", "pandas", "[3,", "3,", "1]"),
    ]


def test_pandas_imported_before_is_the_one_cp_model_uses():
    code = "import pandas\n" + SOLVE + "print(cp_model.pd is pandas)\n" + SERIES
    assert run(code) == [
        *("solved", "10", "True", "True"),
        *("series", "pandas", "[3,", "3,", "1]"),
    ]


def test_the_stand_in_forwards_every_other_name_to_the_real_pandas():
    code = SOLVE + (
        "print(type(cp_model.pd).__name__, cp_model.pd.DataFrame({'a': [1]}).shape)\n"
    )
    assert run(code)[3:] == ["_DeferredPandas", "(1,", "1)"]


def test_another_thread_using_pandas_while_cp_model_loads_gets_the_real_one():
    # Inside the import's window only the loading thread gets stand-ins; a
    # thread that reads pandas there imports the real one, which stays.
    code = """
import sys, threading
from layout_planner.ortools_import import _pandas_deferred
with _pandas_deferred():
    stand_in = sys.modules["pandas"]
    got = []
    t = threading.Thread(target=lambda: got.append(stand_in.Series))
    t.start()
    t.join()
    mine = stand_in.Series
print(mine.__module__ == "pandas (not imported)",
      got[0] is sys.modules["pandas"].Series,
      type(sys.modules["pandas"]).__name__)
"""
    assert run(code) == ["True", "True", "module"]
